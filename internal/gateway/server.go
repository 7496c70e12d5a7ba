package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
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
}

// Name implements the service's component interface.
func (s *Server) Name() string { return "gateway" }

// Handler returns the mux: /v1/ to the gateway, /healthz, and /metrics
// when ServeMetrics.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/v1/", s.Gateway)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	if s.ServeMetrics {
		mux.Handle("GET /metrics", s.Gateway.Metrics())
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
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		// No write timeout: streams last as long as the upstream's.
	}
	if s.OnListen != nil {
		s.OnListen(ln.Addr())
	}
	s.Gateway.log.Info("gateway: listening", "addr", ln.Addr().String(), "upstream", s.Gateway.upstream.Redacted())
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
	err = srv.Shutdown(sctx)
	_ = s.Gateway.Close() // wait for the last settlements
	if err != nil {
		_ = srv.Close()
		return fmt.Errorf("gateway: shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("gateway: serve: %w", err)
	}
	return nil
}
