package main

// The node agent's running pods as the kubelet API sees them, and what exec, attach and
// port-forward do with one. The agent (devcluster/nodeagent/kubeletapi.py) writes
// <pods-dir>/<namespace>_<name>.json whenever one of a pod's containers starts (init containers
// and sidecars included, each with its process, environment and log file) and keeps it until a
// pod of that name starts again, so the log of an exited container stays readable, as the
// kubelet's does.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"
)

// podRecord is the agent's file for a pod: its containers, and each started one by name.
type podRecord struct {
	Namespace  string                      `json:"namespace"`
	Name       string                      `json:"name"`
	UID        string                      `json:"uid"`
	Default    string                      `json:"default"`    // the first app container
	Containers []string                    `json:"containers"` // every container of the spec, init ones included
	IP         string                      `json:"ip"`
	Started    map[string]*containerRecord `json:"started"`
}

type containerRecord struct {
	PID       int               `json:"pid"`
	StartTime string            `json:"start_time"` // /proc/<pid>/stat field 22: tells a reused pid
	Env       map[string]string `json:"env"`
	Cwd       string            `json:"cwd"`
	Log       string            `json:"log"`
	// where this run's output starts in Log, and where the previous run's of the same
	// container started (nil: none), as the runner appends a restarted container's output
	LogStart         int64    `json:"log_start"`
	PreviousLogStart *int64   `json:"previous_log_start"`
	Namespaces       []string `json:"namespaces"` // nsenter's names: uts, mount, net
}

// podInfo: a pod as one request sees it, with the container it names (none for port-forward).
type podInfo struct {
	*containerRecord
	Namespace  string
	Name       string
	UID        string
	Container  string
	Containers []string
	IP         string
	started    map[string]*containerRecord
}

// with is the pod seen through its started container `name` (nil: never started).
func (p *podInfo) with(name string) *podInfo {
	c := p.started[name]
	if c == nil {
		return nil
	}
	view := *p
	view.containerRecord, view.Container = c, name
	return &view
}

type podDir struct {
	dir string
	mu  sync.Mutex
	// the stamper's view: file name -> its log, re-read only when the file changes (it looks
	// every stampInterval, and a storm's hundreds of pods would be parsed as often otherwise)
	seen map[string]seenPod
}

type seenPod struct {
	mod  time.Time
	logs []string
}

func (d *podDir) get(namespace, name string) (*podInfo, error) {
	if strings.ContainsAny(namespace+name, "/_") || namespace == "" || name == "" {
		return nil, fmt.Errorf("pod %q does not exist", name)
	}
	data, err := os.ReadFile(filepath.Join(d.dir, namespace+"_"+name+".json"))
	if err != nil {
		return nil, fmt.Errorf("pod %q does not exist", name)
	}
	var rec podRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("pod %s/%s: %v", namespace, name, err)
	}
	return &podInfo{Namespace: rec.Namespace, Name: rec.Name, UID: rec.UID, Container: rec.Default,
		Containers: rec.Containers, IP: rec.IP, started: rec.Started}, nil
}

// logs are the log files of every started container of the pods the agent has written a file for.
func (d *podDir) logs() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	entries, _ := os.ReadDir(d.dir)
	var logs []string
	now := map[string]seenPod{}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		known, ok := d.seen[e.Name()]
		if !ok || !known.mod.Equal(info.ModTime()) {
			parts := strings.SplitN(strings.TrimSuffix(e.Name(), ".json"), "_", 2)
			if len(parts) != 2 {
				continue
			}
			pod, err := d.get(parts[0], parts[1])
			if err != nil {
				continue
			}
			known = seenPod{mod: info.ModTime()}
			for _, c := range pod.started {
				if c.Log != "" {
					known.logs = append(known.logs, c.Log)
				}
			}
		}
		now[e.Name()] = known
		logs = append(logs, known.logs...)
	}
	d.seen = now
	return logs
}

// running: the container's process is still there (the same process: not a reused pid).
func (p *podInfo) running() bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID))
	if err != nil {
		return false
	}
	// fields after the command's closing parenthesis: state is the 3rd field, starttime the 22nd
	rest := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(rest) < 20 || rest[0] == "Z" || rest[0] == "X" {
		return false
	}
	return p.StartTime == "" || rest[19] == p.StartTime
}

func (p *podInfo) environ() []string {
	env := make([]string, 0, len(p.Env))
	for k, v := range p.Env {
		env = append(env, k+"="+v)
	}
	return env
}

// command is `cmd` beside the container: in its sandbox's namespaces (nsenter, as the runner's
// Running.beside does for exec probes) with its working directory, else in its working
// directory; with the container's environment either way.
func (p *podInfo) command(ctx context.Context, cmd []string) (*exec.Cmd, error) {
	var c *exec.Cmd
	if len(p.Namespaces) > 0 && os.Geteuid() == 0 {
		nsenter, err := exec.LookPath("nsenter")
		if err != nil {
			return nil, fmt.Errorf("the pod runs in namespaces of its own and nsenter is not installed")
		}
		args := []string{"--target", strconv.Itoa(p.PID)}
		for _, ns := range p.Namespaces {
			args = append(args, "--"+ns)
		}
		args = append(args, "--wd", "--") // --wd alone: the target's working directory
		c = exec.CommandContext(ctx, nsenter, append(args, cmd...)...)
	} else {
		path, err := lookPath(cmd[0], p.Env["PATH"], p.Cwd)
		if err != nil {
			return nil, err
		}
		c = exec.CommandContext(ctx, path, cmd[1:]...)
		c.Args[0] = cmd[0]
		c.Dir = p.Cwd
	}
	c.Env = p.environ()
	return c, nil
}

// lookPath finds `name` on the container's PATH (exec.LookPath would search this process's).
func lookPath(name, path, cwd string) (string, error) {
	if strings.Contains(name, "/") {
		if !filepath.IsAbs(name) {
			name = filepath.Join(cwd, name)
		}
		if executable(name) {
			return name, nil
		}
	} else {
		for _, dir := range filepath.SplitList(path) {
			if candidate := filepath.Join(dir, name); executable(candidate) {
				return candidate, nil
			}
		}
	}
	return "", fmt.Errorf("exec: %q: executable file not found in $PATH", name)
}

func executable(path string) bool {
	info, err := os.Stat(path)
	return err == nil && !info.IsDir() && info.Mode()&0o111 != 0
}

type executor struct{ pod *podInfo }

func (e *executor) ExecInContainer(ctx context.Context, _, _, container string, cmd []string, in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize, _ time.Duration) error {
	if !e.pod.running() {
		return fmt.Errorf("container %q is not running", container)
	}
	c, err := e.pod.command(ctx, cmd)
	if err != nil {
		return err
	}
	// the whole process group goes when the client does; a command's background children
	// holding stdout do not keep the session open for more than WaitDelay
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	c.WaitDelay = 2 * time.Second
	if tty {
		err = runTTY(c, in, out, resize)
	} else {
		err = runPiped(c, in, out, errOut)
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) && exitErr.Exited() {
		return utilexec.ExitErrorWrapper{ExitError: exitErr}
	}
	return err
}

func runPiped(c *exec.Cmd, in io.Reader, out, errOut io.Writer) error {
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if out != nil {
		c.Stdout = out
	}
	if errOut != nil {
		c.Stderr = errOut
	}
	var stdin io.WriteCloser
	if in != nil {
		// a pipe of our own: exec.Cmd would wait for its copy of a Reader to end, and a client
		// that keeps stdin open would keep a finished command's session open
		pipe, err := c.StdinPipe()
		if err != nil {
			return err
		}
		stdin = pipe
	}
	if err := c.Start(); err != nil {
		return err
	}
	if stdin != nil {
		go func() {
			io.Copy(stdin, in)
			stdin.Close()
		}()
	}
	return c.Wait()
}

func runTTY(c *exec.Cmd, in io.Reader, out io.Writer, resize <-chan remotecommand.TerminalSize) error {
	terminal, err := pty.StartWithAttrs(c, nil, &syscall.SysProcAttr{Setsid: true, Setctty: true, Pdeathsig: syscall.SIGKILL})
	if err != nil {
		return err
	}
	defer terminal.Close()
	go func() {
		for size := range resize {
			pty.Setsize(terminal, &pty.Winsize{Rows: size.Height, Cols: size.Width})
		}
	}()
	if in != nil {
		go io.Copy(terminal, in)
	}
	copied := make(chan struct{})
	go func() {
		if out != nil {
			io.Copy(out, terminal) // ends with EIO once the command and its children are gone
		} else {
			io.Copy(io.Discard, terminal)
		}
		close(copied)
	}()
	err = c.Wait()
	select {
	case <-copied:
	case <-time.After(2 * time.Second):
	}
	return err
}

// attacher: the container's output from now on (its stdout and stderr go to its log file; it
// runs without stdin, as a container without `stdin: true`, so what the client sends is dropped).
type attacher struct{ pod *podInfo }

func (a *attacher) AttachContainer(ctx context.Context, _, _, container string, in io.Reader, out, errOut io.WriteCloser, _ bool, _ <-chan remotecommand.TerminalSize) error {
	if !a.pod.running() {
		return fmt.Errorf("container %q is not running", container)
	}
	if in != nil {
		go io.Copy(io.Discard, in)
	}
	w := io.Writer(out)
	if out == nil {
		w = errOut
	}
	if w == nil {
		w = io.Discard
	}
	f, err := os.Open(a.pod.Log)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		return err
	}
	return follow(ctx, f, a.pod, func(chunk []byte) error { _, err := w.Write(chunk); return err })
}

// follow passes what is appended to f to emit until the container has exited (and its last
// output is read) or ctx ends.
func follow(ctx context.Context, f *os.File, pod *podInfo, emit func([]byte) error) error {
	buf := make([]byte, 32*1024)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if err := emit(buf[:n]); err != nil {
				return err
			}
			continue
		}
		if err != nil && err != io.EOF {
			return err
		}
		if !pod.running() {
			// one more read: output written just before the exit
			if n, _ := f.Read(buf); n > 0 {
				if err := emit(buf[:n]); err != nil {
					return err
				}
				continue
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// forwarder dials the pod's IP (its own loopback address, or its network namespace's address on
// the runner's bridge), as the kubelet's CRI port-forward connects inside the pod's network.
type forwarder struct{ pod *podInfo }

func (f *forwarder) PortForward(ctx context.Context, _, _ string, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(f.pod.IP, strconv.Itoa(int(port))))
	if err != nil {
		return fmt.Errorf("failed to connect to localhost:%d inside namespace of pod %s: %v", port, f.pod.Name, err)
	}
	defer conn.Close()
	// the client's end closed: half-close toward the pod, whose answer still comes back
	go func() { io.Copy(conn, stream); conn.(*net.TCPConn).CloseWrite() }()
	done := make(chan struct{})
	go func() { io.Copy(stream, conn); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return nil
}
