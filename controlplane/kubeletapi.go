package main

// The kubelet API the apiserver proxies pods/exec, attach, log and portforward to, for the node
// agent's pods (devcluster/nodeagent/kubeletapi.py starts it). Routes, parameters and the
// streaming protocols are the kubelet's (k8s.io/kubernetes pkg/kubelet/server/server.go,
// InstallDebuggingHandlers); the SPDY and WebSocket stream handling is the kubelet's own,
// k8s.io/cri-streaming (ServeExec, ServeAttach, ServePortForward). One process serves every node
// of a topology: all of them advertise 127.0.0.1 and this port, and a pod is found by its
// namespace and name in --pods-dir, where the agent writes one JSON file per running pod.
//
// Authentication as the kubelet's with anonymous access off (--anonymous-auth=false,
// --client-ca-file): a request must come with a client certificate the client CA verifies, else
// 401. Authorization: where the kubelet asks the apiserver (SubjectAccessReview on nodes/proxy),
// this one admits only the identities named by --allowed-names (the apiserver's
// --kubelet-client-certificate), else 403.

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/cri-streaming/pkg/streaming/portforward"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
)

const (
	// the kubelet's --streaming-connection-idle-timeout default
	streamIdleTimeout = 4 * time.Hour
	// how often the log stamper looks for new lines (the precision of timestamps=true)
	stampInterval = 200 * time.Millisecond
)

type kubeletAPI struct {
	pods    *podDir
	stamps  *stamper
	allowed []string
}

func runKubeletAPI(args []string) int {
	fs := flag.NewFlagSet("kubelet-api", flag.ContinueOnError)
	address := fs.String("address", "127.0.0.1", "address to listen on")
	port := fs.Int("port", 0, "port to listen on (required; the Nodes' daemonEndpoints.kubeletEndpoint.Port)")
	certFile := fs.String("tls-cert-file", "", "serving certificate, signed by the CA the apiserver's --kubelet-certificate-authority names (required)")
	keyFile := fs.String("tls-private-key-file", "", "its key (required)")
	clientCA := fs.String("client-ca-file", "", "CA that signs the apiserver's kubelet client certificate (required)")
	allowed := fs.String("allowed-names", "kube-apiserver-kubelet-client", "comma-separated client certificate common names admitted")
	podsDir := fs.String("pods-dir", "", "directory of the agent's running pods, one <namespace>_<name>.json each (required)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *port == 0 || *certFile == "" || *keyFile == "" || *clientCA == "" || *podsDir == "" {
		fmt.Fprintln(os.Stderr, "kubelet-api: --port, --tls-cert-file, --tls-private-key-file, --client-ca-file and --pods-dir are required")
		return 2
	}
	cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-api: serving certificate: %v\n", err)
		return 1
	}
	caPEM, err := os.ReadFile(*clientCA)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-api: client CA: %v\n", err)
		return 1
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		fmt.Fprintf(os.Stderr, "kubelet-api: no certificate in %s\n", *clientCA)
		return 1
	}
	api := &kubeletAPI{
		pods:    &podDir{dir: *podsDir},
		stamps:  newStamper(),
		allowed: strings.Split(*allowed, ","),
	}
	listener, err := net.Listen("tcp", net.JoinHostPort(*address, strconv.Itoa(*port)))
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-api: %v\n", err)
		return 1
	}
	server := &http.Server{
		Handler: api.authenticated(api.routes()),
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{cert},
			// a certificate is verified when given; none is answered 401 below (the kubelet
			// with anonymous auth off), so the caller learns why rather than a TLS alert
			ClientAuth: tls.VerifyClientCertIfGiven,
			ClientCAs:  pool,
			MinVersion: tls.VersionTLS12,
		},
		ReadHeaderTimeout: 30 * time.Second,
	}
	stop := make(chan struct{})
	go api.stamps.run(api.pods, stop)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- server.ServeTLS(listener, "", "") }()
	fmt.Fprintf(os.Stderr, "kubelet-api: serving on %s, pods from %s\n", listener.Addr(), *podsDir)
	select {
	case err := <-done:
		fmt.Fprintf(os.Stderr, "kubelet-api: %v\n", err)
		return 1
	case sig := <-signals:
		fmt.Fprintf(os.Stderr, "kubelet-api: %v, stopping\n", sig)
		close(stop)
		server.Close()
		return 0
	}
}

func (a *kubeletAPI) authenticated(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		user := r.TLS.PeerCertificates[0].Subject.CommonName
		if !slices.Contains(a.allowed, user) {
			http.Error(w, fmt.Sprintf("Forbidden (user=%s, verb=%s, resource=nodes, subresource=proxy)",
				user, strings.ToLower(r.Method)), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (a *kubeletAPI) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") })
	for _, p := range []string{"/{ns}/{pod}/{container}", "/{ns}/{pod}/{uid}/{container}"} {
		mux.HandleFunc("/exec"+p, a.exec)
		mux.HandleFunc("/attach"+p, a.attach)
	}
	mux.HandleFunc("/portForward/{ns}/{pod}", a.portForward)
	mux.HandleFunc("/portForward/{ns}/{pod}/{uid}", a.portForward)
	mux.HandleFunc("GET /containerLogs/{ns}/{pod}/{container}", a.containerLogs)
	return mux
}

// pod finds the request's pod (404 if the agent runs no such pod, or one of another uid).
func (a *kubeletAPI) pod(w http.ResponseWriter, r *http.Request) (*podInfo, bool) {
	pod, err := a.pods.get(r.PathValue("ns"), r.PathValue("pod"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return nil, false
	}
	if uid := r.PathValue("uid"); uid != "" && uid != pod.UID {
		http.Error(w, "pod not found", http.StatusNotFound)
		return nil, false
	}
	return pod, true
}

// container is the pod seen through the request's container, answering 400 when the spec has
// none of that name (the apiserver's own words; it checks first) and, with `running`, when the
// container is not running (the kubelet's GetExec: "container not found"); without, when it was
// never started (the kubelet's validateContainerLogStatus for a container still waiting).
func container(w http.ResponseWriter, r *http.Request, pod *podInfo, running bool) *podInfo {
	name := r.PathValue("container")
	if !slices.Contains(pod.Containers, name) {
		http.Error(w, fmt.Sprintf("container %s is not valid for pod %s", name, pod.Name), http.StatusBadRequest)
		return nil
	}
	view := pod.with(name)
	switch {
	case running && (view == nil || !view.running()):
		http.Error(w, fmt.Sprintf("container not found (%q)", name), http.StatusBadRequest)
		return nil
	case view == nil:
		http.Error(w, fmt.Sprintf("container %q in pod %q is waiting to start: ContainerCreating", name, pod.Name), http.StatusBadRequest)
		return nil
	}
	return view
}

// streamTarget reads the preamble exec, attach and port-forward share, in the kubelet's order:
// the streaming options (400 when malformed), then the pod (404), then, where the route names
// one, its running container (400). ok is false when an error has been answered.
func streamTarget[O any](a *kubeletAPI, w http.ResponseWriter, r *http.Request,
	parse func(*http.Request) (O, error), withContainer bool) (opts O, pod *podInfo, ok bool) {
	opts, err := parse(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return opts, nil, false
	}
	if pod, ok = a.pod(w, r); !ok {
		return opts, nil, false
	}
	if withContainer {
		if pod = container(w, r, pod, true); pod == nil {
			return opts, nil, false
		}
	}
	return opts, pod, true
}

func (a *kubeletAPI) exec(w http.ResponseWriter, r *http.Request) {
	opts, pod, ok := streamTarget(a, w, r, remotecommand.NewOptions, true)
	if !ok {
		return
	}
	cmd := r.URL.Query()["command"]
	if len(cmd) == 0 {
		http.Error(w, "no command given", http.StatusBadRequest)
		return
	}
	remotecommand.ServeExec(w, r, &executor{pod: pod}, pod.Name, pod.UID, pod.Container, cmd, opts,
		streamIdleTimeout, remotecommand.DefaultStreamCreationTimeout, remotecommand.SupportedStreamingProtocols)
}

func (a *kubeletAPI) attach(w http.ResponseWriter, r *http.Request) {
	opts, pod, ok := streamTarget(a, w, r, remotecommand.NewOptions, true)
	if !ok {
		return
	}
	remotecommand.ServeAttach(w, r, &attacher{pod: pod}, pod.Name, pod.UID, pod.Container, opts,
		streamIdleTimeout, remotecommand.DefaultStreamCreationTimeout, remotecommand.SupportedStreamingProtocols)
}

func (a *kubeletAPI) portForward(w http.ResponseWriter, r *http.Request) {
	opts, pod, ok := streamTarget(a, w, r, portforward.NewV4Options, false)
	if !ok {
		return
	}
	portforward.ServePortForward(w, r, &forwarder{pod: pod}, pod.Name, pod.UID, opts,
		streamIdleTimeout, remotecommand.DefaultStreamCreationTimeout, portforward.SupportedProtocols)
}
