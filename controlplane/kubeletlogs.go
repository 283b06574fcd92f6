package main

// containerLogs: GET /containerLogs/{ns}/{pod}/{container} with the parameters the apiserver
// passes on from PodLogOptions (pkg/registry/core/pod/strategy.go LogLocation): follow,
// tailLines, limitBytes, timestamps, sinceSeconds, sinceTime, previous, stream.
//
// The runner writes a container's stdout and stderr, as they come, to one plain file (not the
// CRI log format, which stamps each line). The times come from a stamper: it notes, every
// stampInterval, where each new line of every pod's log starts and when it was first seen, so
// timestamps, sinceSeconds and sinceTime are right to about that interval (lines written
// before this process started carry the time it first saw them). stdout and stderr are one file:
// stream=Stdout or Stderr is refused, as a kubelet without PodLogsQuerySplitStreams refuses it.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"
)

type logOptions struct {
	follow, timestamps bool
	tailLines          int64 // -1: all
	limitBytes         int64 // -1: no limit
	since              time.Time
}

func parseLogOptions(r *http.Request) (logOptions, error) {
	q := r.URL.Query()
	opts := logOptions{follow: q.Get("follow") == "true", timestamps: q.Get("timestamps") == "true", tailLines: -1, limitBytes: -1}
	for name, into := range map[string]*int64{"tailLines": &opts.tailLines, "limitBytes": &opts.limitBytes} {
		if v := q.Get(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 || (name == "limitBytes" && n == 0) {
				return opts, fmt.Errorf("%s must be a positive integer, not %q", name, v)
			}
			*into = n
		}
	}
	if v := q.Get("tail"); v != "" && v != "all" && opts.tailLines < 0 { // the kubelet's older name
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return opts, fmt.Errorf("tail must be a positive integer or all, not %q", v)
		}
		opts.tailLines = n
	}
	if v := q.Get("sinceSeconds"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return opts, fmt.Errorf("sinceSeconds must be a positive integer, not %q", v)
		}
		opts.since = time.Now().Add(-time.Duration(n) * time.Second)
	}
	if v := q.Get("sinceTime"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return opts, fmt.Errorf("sinceTime must be RFC 3339, not %q", v)
		}
		opts.since = t
	}
	return opts, nil
}

func (a *kubeletAPI) containerLogs(w http.ResponseWriter, r *http.Request) {
	opts, err := parseLogOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if s := r.URL.Query().Get("stream"); s != "" && s != "All" {
		http.Error(w, fmt.Sprintf("unable to return the given log stream: %q (the node agent keeps stdout and stderr in one log)", s), http.StatusBadRequest)
		return
	}
	pod, ok := a.pod(w, r)
	if !ok {
		return
	}
	if pod = container(w, r, pod, false); pod == nil {
		return
	}
	// this container's part of the log, or with previous=true the part of the one before it
	// (the runner appends a restarted container's output to the same file)
	start, end := pod.LogStart, int64(-1)
	if r.URL.Query().Get("previous") == "true" {
		if pod.PreviousLogStart == nil {
			http.Error(w, fmt.Sprintf("previous terminated container %q in pod %q not found", pod.Container, pod.Name), http.StatusBadRequest)
			return
		}
		start, end = *pod.PreviousLogStart, pod.LogStart
		opts.follow = false // it has ended
	}
	f, err := os.Open(pod.Log)
	if err != nil {
		http.Error(w, fmt.Sprintf("failed to open the log of container %q: %v", pod.Container, err), http.StatusNotFound)
		return
	}
	defer f.Close()
	a.stamps.observe(pod.Log) // lines not yet seen are stamped now, before they are served
	w.Header().Set("Content-Type", "text/plain")
	flusher, _ := w.(http.Flusher)
	out := &limitedWriter{w: w, left: opts.limitBytes}

	// what is there now: whole lines, filtered by time, the last tailLines of them
	var reader io.Reader = f
	if end >= 0 {
		reader = io.LimitReader(f, end-start)
	}
	if _, err := f.Seek(start, io.SeekStart); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	data, err := io.ReadAll(reader)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	var lines []logLine
	for off := 0; off < len(data); {
		end := bytes.IndexByte(data[off:], '\n')
		next := len(data)
		if end >= 0 {
			next = off + end + 1
		}
		t := a.stamps.timeOf(pod.Log, start+int64(off))
		if opts.since.IsZero() || !t.Before(opts.since) {
			lines = append(lines, logLine{t, data[off:next]})
		}
		off = next
	}
	if opts.tailLines >= 0 && int64(len(lines)) > opts.tailLines {
		lines = lines[int64(len(lines))-opts.tailLines:]
	}
	for _, line := range lines {
		if !out.line(line, opts.timestamps) {
			return
		}
	}
	if flusher != nil {
		flusher.Flush()
	}
	if !opts.follow {
		return
	}
	offset := start + int64(len(data))
	pending := []byte{}
	follow(r.Context(), f, pod, func(chunk []byte) error {
		a.stamps.observe(pod.Log)
		pending = append(pending, chunk...)
		start := offset
		for {
			end := bytes.IndexByte(pending, '\n')
			if end < 0 {
				break
			}
			line := logLine{a.stamps.timeOf(pod.Log, start), pending[:end+1]}
			if !out.line(line, opts.timestamps) {
				return io.EOF
			}
			start += int64(end + 1)
			pending = pending[end+1:]
		}
		offset = start
		if flusher != nil {
			flusher.Flush()
		}
		return nil
	})
	if len(pending) > 0 { // a last line without its newline
		out.line(logLine{a.stamps.timeOf(pod.Log, offset), pending}, opts.timestamps)
	}
}

type logLine struct {
	t    time.Time
	text []byte
}

// limitedWriter writes lines until limitBytes are out (the last one cut, as the kubelet's).
type limitedWriter struct {
	w    io.Writer
	left int64 // -1: no limit
}

func (l *limitedWriter) line(line logLine, timestamps bool) bool {
	text := line.text
	if timestamps {
		text = append([]byte(line.t.UTC().Format(time.RFC3339Nano)+" "), text...)
	}
	if l.left >= 0 && int64(len(text)) > l.left {
		text = text[:l.left]
	}
	if _, err := l.w.Write(text); err != nil {
		return false
	}
	if l.left >= 0 {
		l.left -= int64(len(text))
		return l.left > 0
	}
	return true
}

// stamper: per log file, the offsets where lines start and when each was first seen.
type stamper struct {
	mu    sync.Mutex
	files map[string]*stamps
}

type stamps struct {
	read        int64 // bytes looked at
	atLineStart bool  // the next byte starts a line
	starts      []int64
	times       []time.Time
}

func newStamper() *stamper { return &stamper{files: map[string]*stamps{}} }

func (s *stamper) run(pods *podDir, stop <-chan struct{}) {
	ticker := time.NewTicker(stampInterval)
	defer ticker.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ticker.C:
		}
		seen := map[string]bool{}
		for _, log := range pods.logs() {
			seen[log] = true
			s.observe(log)
		}
		s.mu.Lock()
		for log := range s.files { // a deleted pod's log is forgotten
			if !seen[log] {
				delete(s.files, log)
			}
		}
		s.mu.Unlock()
	}
}

// observe stamps the lines appended to `log` since it last looked.
func (s *stamper) observe(log string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.files[log]
	if st == nil {
		st = &stamps{atLineStart: true}
		s.files[log] = st
	}
	f, err := os.Open(log)
	if err != nil {
		return
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil || info.Size() <= st.read {
		return
	}
	if _, err := f.Seek(st.read, io.SeekStart); err != nil {
		return
	}
	now := time.Now()
	reader := bufio.NewReader(io.LimitReader(f, info.Size()-st.read))
	for {
		b, err := reader.ReadByte()
		if err != nil {
			return
		}
		if st.atLineStart {
			st.starts = append(st.starts, st.read)
			st.times = append(st.times, now)
		}
		st.read++
		st.atLineStart = b == '\n'
	}
}

// timeOf is when the line starting at `offset` was first seen (now if not yet).
func (s *stamper) timeOf(log string, offset int64) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.files[log]
	if st == nil {
		return time.Now()
	}
	i := sort.Search(len(st.starts), func(i int) bool { return st.starts[i] > offset }) - 1
	if i < 0 {
		return time.Now()
	}
	return st.times[i]
}
