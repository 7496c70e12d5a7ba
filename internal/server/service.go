package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/gateway"
	"github.com/sluice-io/sluice/internal/metrics"
	"github.com/sluice-io/sluice/internal/tracing"
	"github.com/sluice-io/sluice/memstore"
)

// Component is one part of `sluice serve`: the HTTP API, the config
// reloader, and the components that other packages plug in (the Envoy rate
// limit service, the AI gateway). Run serves until ctx is done, then shuts
// down gracefully and returns. An error from any component stops them all.
type Component interface {
	// Name names the component in logs.
	Name() string
	// Run serves until ctx is done.
	Run(ctx context.Context) error
}

// Deps are what the service shares with the components plugged into it.
type Deps struct {
	// Store is the store every component decides against.
	Store sluice.Store
	// Metrics is the shared registry; components register their own
	// collectors on Metrics.Registry.
	Metrics *metrics.Metrics
	// Config returns the configuration being served; it changes on reload.
	Config func() *config.Config
	// Logger is the service's logger.
	Logger *slog.Logger
	// Tracing is nil when tracing is off; its methods are nil-safe.
	Tracing *tracing.Tracing
	// SetGatewaySpend gives the console the AI gateway's spend per key,
	// team and org (console_spend.go).
	SetGatewaySpend func(SpendFunc)
	// SetGatewayUpstreams gives the console the AI gateway's headroom per
	// upstream and model (console_upstreams.go).
	SetGatewayUpstreams func(SpendFunc)
	// GatewayOutcome counts the AI gateway's decisions in the console's
	// charts and top list (console_gateway.go); nil when the console is
	// off (gateway.Options.OnOutcome).
	GatewayOutcome func(gateway.Outcome)
	// GatewaySettled counts the AI gateway's spend in the console's
	// charts; nil when the console is off (gateway.Options.OnSettled).
	GatewaySettled func(gateway.Settlement)
	// SetGatewayLookup gives the console the AI gateway's look-up of a
	// key by its name (console_gateway.go).
	SetGatewayLookup func(LookupFunc)
	// IsAdmin reports whether a request carries a good admin token (a
	// wrong one counts toward its client's backoff, as on the admin
	// endpoints): the AI gateway's /v1/status shows its pool to one.
	IsAdmin func(*http.Request) bool
}

// ComponentFunc builds a plugged-in component from the shared parts. It
// returns nil, nil when the component is not configured.
type ComponentFunc func(d Deps) (Component, error)

// ServiceOptions configure Run.
type ServiceOptions struct {
	// ConfigPath is the configuration file; it is watched for changes.
	ConfigPath string
	// Listen overrides the config's listen address when not empty.
	Listen string
	// AdminToken overrides the config's admin token when not empty.
	AdminToken string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Signals triggers config reloads (SIGHUP).
	Signals <-chan os.Signal
	// OnReload is called after each reload attempt.
	OnReload func(*config.Config, error)
	// OnListen is called with the API's address once it is listening.
	OnListen func(addr net.Addr)
	// OpenStore opens the store the config names. Nil means OpenStore.
	OpenStore func(ctx context.Context, sc config.StoreSection) (sluice.Store, io.Closer, error)
	// Clock times the store circuit breaker; nil means the system clock.
	Clock clock.Clock
	// Tracing, when not nil, traces the API's requests, the store's calls
	// and, through Deps, the components'.
	Tracing *tracing.Tracing
	// Components are built after the store and run beside the API.
	//
	// Seam: `sluice serve` (cmd/sluice/serve.go) lists the Envoy rate limit
	// service and the AI gateway here; each reads its own section of
	// config.File through Deps.Config.
	Components []ComponentFunc
}

// Run loads the config, opens the store and serves the API and every
// component until ctx is done; then it drains in-flight requests and
// closes the store.
func Run(ctx context.Context, opts ServiceOptions) error {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	// The reloader reads the file as it will on each reload: the same
	// bounds, and the content it starts from to compare changes with.
	reloader := &Reloader{Path: opts.ConfigPath, Logger: log, Signals: opts.Signals, OnReload: opts.OnReload}
	if opts.Listen != "" {
		reloader.Override = func(c *config.Config) { c.Listen = opts.Listen }
	}
	data, err := reloader.read()
	if err != nil {
		return err
	}
	cfg, err := config.Parse(opts.ConfigPath, data)
	if err != nil {
		return err
	}
	if reloader.Override != nil {
		reloader.Override(cfg)
	}
	reloader.last = data
	open := opts.OpenStore
	if open == nil {
		open = func(ctx context.Context, sc config.StoreSection) (sluice.Store, io.Closer, error) {
			return openStore(ctx, sc, log)
		}
	}
	store, closer, err := open(ctx, cfg.Store)
	if err != nil {
		return err
	}
	defer closer.Close()
	ovr, err := newOverrides(store, opts.Clock, log)
	if err != nil {
		return err
	}
	store = opts.Tracing.Store(store)
	g, err := newGuard(store, cfg.Store, opts.Clock, log)
	if err != nil {
		return err
	}
	defer g.Close()
	m := metrics.New()
	m.ReloadResult(nil, time.Now())
	srv, err := New(Options{Store: g, Config: cfg, Metrics: m, Logger: log, AdminToken: opts.AdminToken, Clock: opts.Clock, Overrides: ovr, TopSink: newTopSink(store), FleetSink: newFleetSink(store)})
	if err != nil {
		return err
	}
	listen := cfg.Listen
	reloader.Server = srv
	comps := []Component{
		&httpComponent{srv: srv, addr: listen, onListen: opts.OnListen, log: log, serving: []any{
			"store", storeName(cfg.Store), "failure_policy", cfg.Store.FailurePolicy,
			"policies", len(cfg.Policies), "tiers", len(cfg.Tiers), "keys", len(cfg.Keys)}, wrap: opts.Tracing.Handler},
		reloader,
		overridesComponent{ovr},
	}
	if srv.top != nil {
		comps = append(comps, consoleComponent{srv})
	}
	deps := Deps{Store: srv.guard.store, Metrics: m, Config: srv.Config, Logger: log, Tracing: opts.Tracing, SetGatewaySpend: srv.SetGatewaySpend, SetGatewayUpstreams: srv.SetGatewayUpstreams,
		SetGatewayLookup: srv.SetGatewayLookup, IsAdmin: srv.isAdmin}
	if srv.top != nil {
		deps.GatewayOutcome, deps.GatewaySettled = srv.gatewayOutcome, srv.gatewaySettled
	}
	for _, build := range opts.Components {
		c, err := build(deps)
		if err != nil {
			return err
		}
		if c != nil {
			comps = append(comps, c)
		}
	}
	if err := reloader.Watch(); err != nil {
		return err
	}
	err = RunComponents(ctx, log, comps...)
	log.Info("sluice stopped")
	return err
}

// storeName is the store's kind for logs, never its credentials.
func storeName(sc config.StoreSection) string {
	if sc.IsMemory() {
		return "memory"
	}
	return "redis"
}

// OpenStore opens the store a config names, logging to slog.Default(). It
// knows the memory store; the Redis store is opened by openRedis. Run
// wraps it in a guard.
func OpenStore(ctx context.Context, sc config.StoreSection) (sluice.Store, io.Closer, error) {
	return openStore(ctx, sc, slog.Default())
}

func openStore(ctx context.Context, sc config.StoreSection, log *slog.Logger) (sluice.Store, io.Closer, error) {
	if sc.IsMemory() {
		s, err := memstore.New(memstore.Options{MaxKeys: sc.MaxKeys, MaxBytes: sc.MaxBytes})
		if err != nil {
			return nil, nil, fmt.Errorf("server: memory store: %w", err)
		}
		return s, s, nil
	}
	return openRedis(ctx, sc, log)
}

// RunComponents runs every component until ctx is done or one fails, then
// cancels the rest and waits for them all. It returns the first error.
func RunComponents(ctx context.Context, log *slog.Logger, comps ...Component) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for _, c := range comps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.Run(ctx)
			if err != nil {
				once.Do(func() { first = fmt.Errorf("%s: %w", c.Name(), err) })
				log.Error("component failed; shutting down", "component", c.Name(), "err", err)
			}
			cancel()
		}()
	}
	wg.Wait()
	return first
}

// httpComponent serves the API and drains it on shutdown.
type httpComponent struct {
	srv      *Server
	addr     string
	onListen func(net.Addr)
	log      *slog.Logger
	serving  []any                           // attributes of the "sluice serving" line
	wrap     func(http.Handler) http.Handler // nil-safe tracing
}

func (h *httpComponent) Name() string { return "http" }

func (h *httpComponent) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", h.addr)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	handler := h.srv.Handler()
	if h.wrap != nil {
		handler = h.wrap(handler)
	}
	hs := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(h.log.Handler(), slog.LevelWarn),
	}
	// Logged once the listener is bound, so "serving" is true when read.
	h.log.Info("sluice serving", append([]any{"listen", ln.Addr().String()}, h.serving...)...)
	if h.onListen != nil {
		h.onListen(ln.Addr())
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("server: %w", err)
	case <-ctx.Done():
	}
	h.srv.SetDraining(true)
	// The running config's drain time: shutdown_timeout reloads too.
	drain := h.srv.Config().ShutdownTimeout
	h.log.Info("draining in-flight requests", "timeout", drain.String())
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drain)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		_ = hs.Close()
		return fmt.Errorf("server: drain: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("server: %w", err)
	}
	return nil
}

// Name implements Component.
func (rl *Reloader) Name() string { return "config-reloader" }
