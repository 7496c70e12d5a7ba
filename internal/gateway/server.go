package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice/internal/hostcheck"
	"github.com/sluice-io/sluice/internal/statuswriter"
)

// Server serves a Gateway on its own listener until its context ends. It
// is the gateway's component in `sluice serve` and the whole of `sluice
// gateway`.
type Server struct {
	// Gateway handles /v1/.
	Gateway *Gateway
	// Addr is the listen address, such as ":8090".
	Addr string
	// ServeMetrics adds GET /metrics with the gateway's private registry.
	ServeMetrics bool
	// ShutdownTimeout bounds the drain of in-flight requests (streams
	// included) after the context ends; zero means 30s.
	ShutdownTimeout time.Duration
	// OnListen, when not nil, is called with the bound address.
	OnListen func(net.Addr)
	// Middleware, when not nil, wraps the handler (tracing).
	Middleware func(http.Handler) http.Handler
	// Hosts, when not nil, returns at each request the names a browser
	// may reach the gateway by (package hostcheck); nil means Policy().
	Hosts func() *hostcheck.Policy
	// HostsField names the config field of those names in the refusal;
	// empty means "allowed_hosts".
	HostsField string

	// Counts for the summary logged on stop.
	requests, ok, limited, clientErrs, serverErrs atomic.Int64

	// cur is the generation being served: Gateway until the first
	// SetGateway (reload.go).
	cur      atomic.Pointer[generation]
	curOnce  sync.Once
	retiring sync.WaitGroup
	swapMu   sync.Mutex // SetGateway and stop
	stopped  bool
	own      []string
	ownOnce  sync.Once
}

// Name implements the service's component interface.
func (s *Server) Name() string { return "gateway" }

// Handler returns the mux: /v1/ to the gateway, /healthz, and /metrics
// when ServeMetrics, behind the Host check (HostGuard). Every request is logged at debug level (method, path,
// status, duration, request id; never a key) and counted for the summary
// Run logs on stop.
func (s *Server) Handler() http.Handler {
	mux := s.HostGuard(s.mux())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log := s.current().log
		start := time.Now()
		sw := statuswriter.New(w)
		mux.ServeHTTP(sw, r)
		status := sw.Status()
		if status == 0 {
			status = http.StatusOK
		}
		s.count(status)
		if log.Enabled(r.Context(), slog.LevelDebug) {
			log.LogAttrs(r.Context(), slog.LevelDebug, "gateway: request",
				slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Int("status", status),
				slog.String("duration", time.Since(start).Round(time.Microsecond).String()),
				slog.String("request_id", w.Header().Get("x-sluice-request-id")))
		}
	})
}

// Policy returns the names a browser may reach the gateway by when Hosts
// is nil: the config's allowed_hosts, the hosts of listen and Addr, and
// this machine's names (with IP addresses and localhost, always).
func (s *Server) Policy() *hostcheck.Policy {
	g := s.current()
	if p := g.policy.Load(); p != nil {
		return p
	}
	p := &hostcheck.Policy{Listen: []string{s.Addr, g.cfg.Listen}, Allowed: g.cfg.AllowedHosts, Own: s.ownHosts()}
	g.policy.Store(p)
	return p
}

// HostGuard refuses, with 403 in OpenAI's error form, a request whose
// Host is not one the gateway is known by (Hosts): a page that rebinds
// its name to the gateway's address would otherwise read its status, its
// model list and metrics and, with a key it holds, spend through it under
// the gateway's name. Every GET and HEAD is checked, browser marks or not
// (a rebound page's same-origin GET may carry none); the other methods,
// which SDKs send with Hosts of their own, when they carry a browser's
// marks, which a browser always adds to them (hostcheck.ByMethod);
// /healthz never. next gets every other request.
func (s *Server) HostGuard(next http.Handler) http.Handler {
	hosts := s.Hosts
	if hosts == nil {
		hosts = s.Policy // the config of the moment: a reload applies
	}
	return s.guard(hosts, next)
}

func (s *Server) guard(hosts func() *hostcheck.Policy, next http.Handler) http.Handler {
	field := cmp.Or(s.HostsField, "allowed_hosts")
	rule := func(r *http.Request) hostcheck.Check {
		if r.URL.Path == "/healthz" {
			return hostcheck.IfBrowser
		}
		return hostcheck.ByMethod(r)
	}
	return hostcheck.Guard(next, hosts, rule, func(w http.ResponseWriter, r *http.Request) {
		s.current().metrics.rejections.WithLabelValues("-", "-", "host_not_allowed").Inc()
		writeError(w, http.StatusForbidden, "invalid_request_error", "host_not_allowed", "", hostcheck.Message(r.Host, field))
	})
}

func (s *Server) count(status int) {
	s.requests.Add(1)
	switch {
	case status == http.StatusTooManyRequests:
		s.limited.Add(1)
	case status >= 500:
		s.serverErrs.Add(1)
	case status >= 400:
		s.clientErrs.Add(1)
	default:
		s.ok.Add(1)
	}
}

func (s *Server) mux() http.Handler {
	mux := http.NewServeMux()
	gw := http.HandlerFunc(s.serveGateway) // reload.go
	mux.Handle("/v1/", gw)
	// The metered paths, the status and the model list are routes of their
	// own, for a request span named by its route ("POST
	// /v1/chat/completions") rather than by the subtree ("POST /v1/"). All
	// go to the same handler, which routes itself.
	for _, p := range routedPaths() {
		mux.Handle(p, gw)
	}
	if s.Gateway.mcp != nil {
		mux.Handle("/mcp/", s.Gateway)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	if s.ServeMetrics {
		mux.Handle("GET /metrics", s.MetricsHandler())
	}
	// Everything else, other methods on the paths above included, gets
	// OpenAI's error body rather than net/http's plain text.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "invalid_request_error", "unknown_url", "", "Unknown request URL: "+r.Method+" "+r.URL.Path+".")
	})
	return mux
}

// Run listens on Addr and serves until ctx is done, then drains.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.Addr)
	if err != nil {
		return fmt.Errorf("gateway: listen: %w", err)
	}
	h := s.Handler()
	if s.Middleware != nil {
		h = s.Middleware(h)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		// No write timeout: streams last as long as the upstream's.
	}
	started := time.Now()
	if s.OnListen != nil {
		s.OnListen(ln.Addr())
	}
	first := s.current()
	first.log.Info("gateway: listening", "addr", ln.Addr().String(), "upstream", first.upstream.Redacted())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("gateway: serve: %w", err)
	case <-ctx.Done():
	}
	timeout := s.ShutdownTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	// Requests waiting in the queue are answered 503 now, rather than
	// holding the shutdown for up to max_wait; requests later in the
	// drain are admitted at once or answered 503 too.
	last := s.stop()
	last.queue.close()
	err = srv.Shutdown(sctx)
	_ = last.Close() // wait for the last settlements
	s.waitRetired()  // and those of the Gateways a reload replaced
	last.log.Info("gateway: stopped", "requests", s.requests.Load(), "ok", s.ok.Load(), "rate_limited", s.limited.Load(),
		"client_errors", s.clientErrs.Load(), "server_errors", s.serverErrs.Load(), "uptime", time.Since(started).Round(time.Second).String())
	if err != nil {
		_ = srv.Close()
		return fmt.Errorf("gateway: shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("gateway: serve: %w", err)
	}
	return nil
}
