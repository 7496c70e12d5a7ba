// Package server is the sluice rate-limit service's HTTP API: decisions
// (/v1/check), peeks (/v1/status), admin resets (/v1/reset), runtime
// overrides (/v1/overrides, package overrides), forward-auth
// for proxies (/v1/authz), health (/healthz, /readyz) and /metrics.
//
// # Design
//
// The server holds the configuration in an atomic.Pointer and swaps it
// whole on reload; a request loads it once and sees one consistent version.
// Limiter state lives in the store, keyed by identity and policy name, so it
// survives any reload that keeps the policy's name and algorithm.
//
// The hot path of /v1/check is: decode the bounded body, resolve policies
// and limits from the loaded config, one store call (ApplyAll, all or
// nothing), encode. Shadow policies are charged in a second call, only when
// the enforced ones admit, and never deny.
//
// Store failures go through package guard (wired in guard.go): a per-call
// deadline, a circuit per store node, a per-key in-flight cap, a
// background probe, and the configured failure policy, which answers with
// Degraded decisions.
package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/guard"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/console"
	"github.com/sluice-io/sluice/internal/homeread"
	"github.com/sluice-io/sluice/internal/hostcheck"
	"github.com/sluice-io/sluice/internal/metrics"
	"github.com/sluice-io/sluice/internal/overrides"
	"github.com/sluice-io/sluice/internal/statuswriter"
)

// Options configure a Server. Store, Config and Metrics are required.
type Options struct {
	// Store keeps the limiter state. Unless it is a *guard.Guard already,
	// New wraps it in one configured by Config.Store.
	Store sluice.Store
	// Config is the initial configuration.
	Config *config.Config
	// Metrics receive every decision; they must be registered once.
	Metrics *metrics.Metrics
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Clock times the circuit breaker and paces the log lines of refused
	// admin requests; nil means the system clock.
	Clock clock.Clock
	// AdminToken, when set, replaces the config's admin_token, as the
	// token named SLUICE_ADMIN_TOKEN (it comes from that environment
	// variable); the config's admin_tokens stay.
	AdminToken string
	// Sleep holds a delay-mode request for its delay, or until the context
	// ends; nil means a timer (sluice.Sleep). Tests pass one that records.
	Sleep func(ctx context.Context, d time.Duration) error
	// Overrides holds the runtime overrides; nil means this instance's own
	// (in memory), as on the memory store.
	Overrides *overrides.Manager
	// TopSink keeps the console's top limited identities; nil means this
	// instance's own. Unused unless the config enables the console.
	TopSink console.TopSink
	// FleetSink keeps the console's fleet charts; nil means this
	// instance's own.
	FleetSink console.FleetSink
}

// Server serves the HTTP API. It is safe for concurrent use.
type Server struct {
	cfg   atomic.Pointer[config.Config]
	guard *storeGuard
	m     *metrics.Metrics
	log   *slog.Logger
	admin string
	// adminHash is the SHA-256 of admin (SLUICE_ADMIN_TOKEN), and backoff
	// the clients that sent wrong admin tokens (admin.go).
	adminHash [32]byte
	backoff   adminBackoffs
	ovr       *overrides.Manager
	series    *console.Series // nil unless the console is enabled
	top       *console.Top    // nil unless the console is enabled
	fleet     *console.Fleet  // nil unless the console is enabled
	spend     gatewaySource   // the gateway's spend (console_spend.go)
	gwCounts  gatewayCounts   // the gateway's decisions (console_gateway.go)
	gwLookup  atomic.Pointer[LookupFunc]
	upstreams gatewaySource // the gateway's upstream headroom (console_upstreams.go)
	// homeReads are /v1/status's reads at global policies' homes
	// (statushome.go).
	homeReads *homeread.Cache
	// regionsProbe is the console's last probe of the other regions
	// (console_regions.go).
	regionsProbe regionsProbe
	// simulating holds the one console simulation that may run at a time.
	simulating chan struct{}
	draining   atomic.Bool
	mux        *http.ServeMux
	handler    http.Handler // mux behind hostGuard
	// ownHosts are the names the service is known by without config
	// (hostcheck.OwnHosts), read once.
	ownHosts []string
	// hostPol caches the Host policy of the config being served
	// (hostcheck.go).
	hostPol atomic.Pointer[hostPolicy]
	// sessions are the console's admin sessions (console_session.go).
	sessions consoleSessions
	// decisions caches the children of m.Decisions.
	decisions counterCache[decisionLabels]
	// waiting counts the delay-mode requests being held (delay.go).
	waiting atomic.Int64
	sleep   func(context.Context, time.Duration) error
	delay   *delayMetrics
	// cop refuses cross-origin browser requests to the endpoints that
	// charge or change state (sameOrigin).
	cop http.CrossOriginProtection
	clk clock.Clock
	// refusals paces the log lines of requests refused for want of the
	// admin token (logRefusal).
	refusals struct {
		sync.Mutex
		logged bool
		last   int64 // Unix ns of the last line
		count  int   // refusals since that line
	}
}

// New validates opts and returns a Server.
func New(opts Options) (*Server, error) {
	if opts.Store == nil || opts.Config == nil || opts.Metrics == nil {
		return nil, errors.New("server: Options.Store, Config and Metrics are required")
	}
	if opts.AdminToken != "" {
		if problem := config.WeakToken(opts.AdminToken); problem != "" {
			return nil, fmt.Errorf("server: SLUICE_ADMIN_TOKEN: %s (make one with: %s), or none", problem, config.MakeAdminToken)
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = clock.NewSystem()
	}
	s := &Server{m: opts.Metrics, log: opts.Logger, admin: opts.AdminToken, adminHash: config.HashAdminToken(opts.AdminToken), sleep: opts.Sleep, ovr: opts.Overrides, clk: opts.Clock}
	if s.sleep == nil {
		s.sleep = sluice.Sleep
	}
	if s.ovr == nil {
		m, err := overrides.New(overrides.Options{Backend: overrides.NewMemory(), Clock: opts.Clock, Logger: opts.Logger})
		if err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		s.ovr = m
	}
	s.delay = newDelayMetrics(opts.Metrics.Registry, func() float64 { return float64(s.waiting.Load()) })
	g, err := guardOf(opts.Store, opts.Config.Store, opts.Clock, opts.Logger)
	if err != nil {
		return nil, err
	}
	s.guard = newStoreGuard(g, s.Config)
	s.homeReads = s.newHomeReads()
	opts.Metrics.SetStoreStats(s.guard.stats)
	s.cfg.Store(opts.Config)
	s.mux = http.NewServeMux()
	s.ownHosts = hostcheck.OwnHosts()
	s.handle("POST /v1/check", "check", s.sameOrigin(s.handleCheck))
	s.handle("GET /v1/status", "status", s.handleStatus)
	s.handle("POST /v1/reset", "reset", s.sameOrigin(s.handleReset))
	s.handle("PUT /v1/overrides", "overrides", s.sameOrigin(s.handlePutOverride))
	s.handle("GET /v1/overrides", "overrides", s.handleListOverrides)
	s.handle("DELETE /v1/overrides", "overrides", s.sameOrigin(s.handleDeleteOverride))
	for path, allow := range map[string]string{"/v1/check": "POST", "/v1/status": "GET", "/v1/reset": "POST", "/v1/overrides": "GET, PUT, DELETE"} {
		s.handle(path, "other", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			writeError(w, http.StatusMethodNotAllowed, "%s %s: use %s", r.Method, path, allow)
		})
	}
	s.handle("/v1/authz", "authz", s.handleAuthz)
	s.handle("/v1/authz/", "authz", s.handleAuthz)
	s.handle("GET /healthz", "healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, "ok\n")
	})
	s.handle("GET /readyz", "readyz", s.handleReady)
	s.newConsole(consoleOf(opts.Config), opts.TopSink, opts.FleetSink)
	s.mux.Handle("GET /metrics", s.m.Handler())
	s.handle("/", "other", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint %s %s; see docs/API.md", r.Method, r.URL.Path)
	})
	s.handler = s.hostGuard(s.mux) // hostcheck.go
	return s, nil
}

// Handler returns the HTTP handler of the API.
func (s *Server) Handler() http.Handler { return s.handler }

// Config returns the configuration being served.
func (s *Server) Config() *config.Config { return s.cfg.Load() }

// SetConfig swaps in a new configuration atomically, whole or not at all.
// Requests in flight finish with the one they loaded. A configuration that
// changes a setting only a restart applies (see restartOnly) is rejected
// with ErrRestartRequired and changes nothing.
func (s *Server) SetConfig(cfg *config.Config) error {
	if old := s.cfg.Load(); old != nil {
		if changed := restartOnly(old, cfg); len(changed) > 0 {
			return restartError(changed)
		}
	}
	s.cfg.Store(cfg)
	return nil
}

// SetDraining marks the server as shutting down: /readyz answers 503 so
// that load balancers stop sending new requests.
func (s *Server) SetDraining(v bool) { s.draining.Store(v) }

// handle registers h with in-flight, status and latency accounting.
func (s *Server) handle(pattern, name string, h http.HandlerFunc) {
	latency := s.m.DecisionSeconds.WithLabelValues(name)
	decides := name == "check" || name == "status" || name == "authz"
	codes := new(counterCache[int]) // the children of m.Requests for name
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		s.m.InFlight.Inc()
		start := time.Now()
		sw := statuswriter.New(w)
		defer func() {
			if decides {
				latency.Observe(time.Since(start).Seconds())
			}
			code := cmp.Or(sw.Status(), http.StatusOK)
			codes.get(code, func() prometheus.Counter {
				return s.m.Requests.WithLabelValues(name, metrics.Code(code))
			}).Inc()
			s.m.InFlight.Dec()
		}()
		h(sw, r)
	})
}

// sameOrigin refuses, with 403, a browser's cross-origin request to h
// (net/http's CrossOriginProtection: by Sec-Fetch-Site, else Origin
// against Host). A page on any site a user of the private network opens
// could otherwise POST a text/plain /v1/check (a simple request, sent
// without a CORS preflight) and spend anyone's limit. Clients that are
// not browsers send neither header and pass. /v1/authz is not wrapped:
// proxies forward their clients' headers to it.
func (s *Server) sameOrigin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := s.cop.Check(r); err != nil {
			writeError(w, http.StatusForbidden, "cross-origin browser request refused: %v", err)
			return
		}
		h(w, r)
	}
}

// handleReady answers whether this instance should get traffic. It reads
// what the guard's background probe found, so it recovers by itself when
// the store returns, with no decision traffic. Under the policies that
// need the store to answer (fail_closed denies everything, error fails
// everything) an unreachable store makes the instance not ready; under
// local and fail_open it still answers, so it stays ready and says why it
// is degraded.
func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		writeText(w, http.StatusServiceUnavailable, "draining\n")
		return
	}
	policy := s.cfg.Load().Store.FailurePolicy
	err := s.guard.ready(r.Context())
	switch {
	case err == nil:
		writeText(w, http.StatusOK, "ready\n")
	case policy == config.FailClosed || policy == config.FailError:
		writeText(w, http.StatusServiceUnavailable, fmt.Sprintf("not ready: store unreachable and failure_policy %s needs it: %v\n", policy, err))
	case policy == config.FailLocal && errors.Is(err, guard.ErrInstancesUnknown):
		// a cold start: local denies until it knows its share
		writeText(w, http.StatusServiceUnavailable, fmt.Sprintf("not ready: %v\n", err))
	default:
		writeText(w, http.StatusOK, fmt.Sprintf("ready, degraded: store unreachable, failure_policy %s answers: %v\n", policy, err))
	}
}

// handleReset forgets the state of a key for a policy or tier.
func (s *Server) handleReset(w http.ResponseWriter, r *http.Request) {
	cfg := s.cfg.Load()
	by, ok := s.authorizeAdmin(w, r, "reset")
	if !ok {
		return
	}
	var body checkBody
	if !s.decode(w, r, cfg, &body) {
		return
	}
	if len(body.Checks) > 0 {
		writeError(w, http.StatusBadRequest, "reset takes one policy or tier and one key, not checks")
		return
	}
	body.Cost = new(int64)
	*body.Cost = 1
	targets, status, err := resolve(cfg, &body.checkItem, exactly)
	if err != nil {
		writeError(w, status, "%v", err)
		return
	}
	reqs := make([]sluice.Request, len(targets))
	for i, t := range targets {
		reqs[i] = t.req
	}
	s.reset(w, r, by, "api", targets[0].identity, reqs)
}

// reset forgets the state reqs name, all of identity's, and answers
// {"reset": N}, or 503 when the store could not apply it. It logs one
// audit line: by names the admin token, from the endpoint ("api" for
// /v1/reset, "console").
func (s *Server) reset(w http.ResponseWriter, r *http.Request, by, from, identity string, reqs []sluice.Request) {
	if len(reqs) == 0 {
		writeJSON(w, http.StatusOK, []byte(`{"reset":0}`+"\n"))
		return
	}
	ds, err := s.guard.store.ApplyAll(r.Context(), sluice.OpReset, reqs)
	if err == nil && slices.ContainsFunc(ds, func(d sluice.Decision) bool { return d.Degraded }) {
		// A failure policy answered for a store it could not reach: the
		// reset did not happen, whatever the decision says.
		err = errors.New("the store is unreachable and a failure policy answered")
	}
	if err != nil {
		s.log.Warn("reset failed", "audit", true, "by", by, "identity", logIdentity(identity), "from", from, "err", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "reset not applied: store unavailable; retry later")
		return
	}
	s.log.Info("reset", "audit", true, "by", by, "identity", logIdentity(identity), "policies", len(reqs), "from", from)
	writeJSON(w, http.StatusOK, fmt.Appendf(nil, `{"reset":%d}`+"\n", len(reqs)))
}

// logIdentity keeps API key hashes short in logs; identities never hold a
// raw key.
func logIdentity(id string) string {
	if h, ok := strings.CutPrefix(id, "key:"); ok && len(h) > 16 {
		return "key:" + h[:16]
	}
	return id
}
