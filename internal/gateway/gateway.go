// Package gateway is sluice's AI gateway: an OpenAI-compatible reverse
// proxy that gives each client key a tier and enforces requests per minute,
// requests per day, LLM tokens per minute and requests in flight, with
// exact token accounting, streaming included.
//
// # Design
//
// A request to /v1/chat/completions, /v1/completions, /v1/embeddings or
// /v1/responses is authenticated by the SHA-256 of its bearer key, its body
// read (bounded) and its prompt tokens estimated (package aitoken). The
// gateway then reserves, in ONE all-or-nothing store.ApplyAll, one request
// on each request limit, the estimated prompt plus max_tokens times n on
// each token limit, and a concurrency slot leased to the request's id. Nothing is
// charged for a rejected request, and parallel requests cannot slip past a
// limit, because the store decides the whole batch atomically.
//
// The request goes upstream with the gateway's own key (the client's is
// never forwarded) and, when streamed, with stream_options.include_usage
// set. The response is relayed as it arrives: JSON bodies pass through a
// bounded tee that reads usage at the end, SSE streams a line scanner that
// forwards each complete event in one write (ReverseProxy flushes every
// write), counts the content tokens produced and reads the final usage
// event, parsing each event after relaying it unless it may be dropped: a
// usage event the client did not ask for is dropped.
//
// When the response is over, or the client is gone, or the upstream failed,
// the reservation is settled exactly once: the token limits get the
// difference between reservation and actual usage refunded (OpRefund) or
// charged (OpCharge), and the concurrency lease is released. Actual usage is
// the upstream's usage when it reported it; for a stream cut short, the
// prompt estimate plus the tokens relayed; for an upstream 429 or 5xx,
// nothing; for an upstream that had the request and did not answer, the
// reservation (past upstream.timeout) or the prompt estimate; only a
// request the upstream never received is refunded whole. If the
// gateway crashes before settling, nothing leaks: the concurrency lease
// lapses after LeaseTTL and the token buckets refill at their rate.
//
// Store errors fail closed with 503: the gateway never falls back to
// per-replica limits, which would multiply them by the replica count.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/aitoken"
	"github.com/sluice-io/sluice/internal/homeread"
	"github.com/sluice-io/sluice/internal/mcpgate"
	"github.com/sluice-io/sluice/internal/pricing"
	"github.com/sluice-io/sluice/internal/tracing"
	"github.com/sluice-io/sluice/internal/upstream"
	"github.com/sluice-io/sluice/lease"
)

// Options configure a Gateway. Config and Store are required.
type Options struct {
	// Config is a validated configuration (Load, Parse or Config.Validate).
	Config *Config
	// Store keeps the limiter state; share one among gateway replicas.
	Store sluice.Store
	// Getenv reads the upstream key's environment variable; nil means
	// os.Getenv.
	Getenv func(string) string
	// Transport sends upstream requests; nil means a clone of
	// http.DefaultTransport with a larger idle pool.
	Transport http.RoundTripper
	// WrapTransport, when not nil, wraps the upstream transport (tracing:
	// a client span per call, W3C traceparent sent upstream).
	WrapTransport func(http.RoundTripper) http.RoundTripper
	// Logger receives one line per settled request and upstream errors;
	// nil discards. Keys are never logged, only their client id.
	Logger *slog.Logger
	// Registerer receives the gateway's metrics; nil means a private
	// registry, served by Gateway.Metrics.
	Registerer prometheus.Registerer
	// OnSettled, when not nil, is called after each reservation is
	// settled, from a goroutine of its own, after the response was sent.
	OnSettled func(Settlement)
	// OnOutcome, when not nil, is called once per metered request the
	// gateway decides, admitted or answered 429 by one of its limits, on
	// the request's goroutine before it goes upstream: the console's
	// counts (`sluice serve`). It must be quick.
	OnOutcome func(Outcome)
	// ReadFile reads upstreams' key_file; nil means os.ReadFile.
	ReadFile func(string) ([]byte, error)
	// PoolPeriod is the period of the upstreams' provider limits (rpm,
	// tpm); zero means a minute. Tests shorten it.
	PoolPeriod time.Duration
	// ProbeMin and ProbeMax bound the backoff of the probes of an
	// unreachable upstream; zero means upstream.DefaultProbeMin and
	// DefaultProbeMax. Tests shorten them.
	ProbeMin, ProbeMax time.Duration
	// Admin, when not nil, reports whether a request that carries no
	// client key carries an admin token; GET /v1/status with one shows
	// the pool's upstreams (serveAdminStatus). Nil: no request does.
	Admin func(*http.Request) bool
}

// Gateway is the proxy, an http.Handler for /v1/. It is safe for
// concurrent use.
type Gateway struct {
	cfg          *Config
	store        sluice.Store
	leases       *lease.Store // the store's lease layer, nil without (settlement into leases, settle.go)
	upstream     *url.URL
	upstreamPath string
	upstreamKey  string
	upstreamAuth []string // {"Bearer " + upstreamKey}
	keys         map[string]*client
	models       map[string]bool
	proxy        *httputil.ReverseProxy
	asyncResv    atomic.Int64 // reservations taken in the background (applyLeased)
	metrics      *metrics
	log          *slog.Logger
	onSettled    func(Settlement)
	onOutcome    func(Outcome)  // nil unless a console counts the gateway (console.go)
	pending      sync.WaitGroup // settlements in progress
	closing      chan struct{}  // closed by Close: settlements stop retrying
	closeOnce    sync.Once
	queue        *queue           // nil without a queue section (queue.go)
	mcp          *mcpgate.Handler // nil without mcp_servers
	batches      *batchAPI        // nil without batches.enabled
	prices       *pricing.Table
	tokenCache   *aitoken.Cache           // exact counts of large messages, resent turn after turn
	counts       *countCache              // upstream count_tokens answers; nil without upstream.count_tokens (anthropic_count.go)
	countClient  *http.Client             // sends count_tokens calls
	countGate    countGate                // bounds them in flight
	now          func() time.Time         // time.Now; tests replace it
	homeReads    *homeread.Cache          // /v1/status's reads at global limits' homes (statushome.go)
	admin        func(*http.Request) bool // Options.Admin
	renewEvery   time.Duration            // how often a request's leases are renewed while in flight: LeaseTTL/3 (renew.go)
	bodyTimeout  time.Duration            // how long a request body may take to arrive: bodyTimeout; tests shorten it
	onRenew      func()                   // when not nil, called after each renewal (tests)
	pool         *upstream.Pool           // nil with one upstream (pool.go)
	roomGates    sync.Map                 // *upstream.Route → *fairqueue.Gate: the queue's waits for upstream room (pool.go)
	calls        sync.Pool                // *call, recycled after settlement (callpool.go)
	onRecycle    func(*call) bool         // when not nil, called with each call given back; false keeps it from the pool (tests)
}

// New validates opts and returns a Gateway.
func New(opts Options) (*Gateway, error) {
	if opts.Config == nil || opts.Store == nil {
		return nil, errors.New("gateway: Options.Config and Options.Store are required")
	}
	cfg := opts.Config
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	up, err := url.Parse(cfg.Upstream.BaseURL)
	if err != nil {
		return nil, fmt.Errorf("gateway: upstream: %w", err)
	}
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg := opts.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	g := &Gateway{
		admin:        opts.Admin,
		cfg:          cfg,
		store:        opts.Store,
		leases:       leaseLayer(opts.Store),
		upstream:     up,
		upstreamPath: strings.TrimSuffix(up.Path, "/"),
		upstreamKey:  getenv(cfg.Upstream.APIKeyEnv),
		keys:         map[string]*client{},
		models:       map[string]bool{},
		metrics:      m,
		log:          log,
		onSettled:    opts.OnSettled,
		onOutcome:    opts.OnOutcome,
		prices:       cfg.priceTable(),
		tokenCache:   aitoken.NewCache(0),
		now:          time.Now,
		renewEvery:   cfg.LeaseTTL / 3,
		bodyTimeout:  bodyTimeout,
		closing:      make(chan struct{}),
	}
	g.homeReads = g.newHomeReads(opts.Store)
	for _, model := range cfg.allModels() {
		g.models[model] = true
		// Load the model's vocabulary now (about 0.1 s and 10-20 MiB per
		// encoding), not on its first request.
		aitoken.ForModel(model)
	}
	tiers := map[string]*tier{}
	for _, name := range sortedKeys(cfg.Tiers) {
		tc := cfg.Tiers[name]
		t := &tier{name: name, lease: cfg.Lease, session: sessionSpecs(tc.Session)}
		t.sessionRequired = tc.Session != nil && tc.Session.Required
		if tc.Lease != nil {
			t.lease = *tc.Lease
		}
		tl := tc.Limits().inZone(cfg.Timezone) // calendar.go
		t.specs = appendSpecs(t.specs, tl, "", cfg.LeaseTTL)
		for _, model := range sortedKeys(tc.Models) {
			t.specs = appendSpecs(t.specs, tc.Models[model].inZone(tl.Timezone), model, cfg.LeaseTTL)
		}
		if !slices.ContainsFunc(t.specs, func(s spec) bool { return s.kind == kindConcurrency && s.model == "" }) {
			t.specs = append(t.specs, spec{kind: kindReservation, name: "reservation", suffix: "reservation",
				alg: sluice.Concurrency, limit: sluice.Limit{Rate: 1 << 40, Period: cfg.LeaseTTL}})
		}
		t.specs = markSpecs(t.specs, tc.Scope, tc.Home) // regions.go
		t.policies = map[string]string{"": rateLimitPolicy(t.specs, "")}
		for _, s := range t.specs {
			if s.model != "" {
				t.policies[s.model] = rateLimitPolicy(t.specs, s.model)
			}
		}
		tiers[name] = t
	}
	for _, k := range cfg.Keys {
		cl := &client{id: k.Client, name: k.Name, tier: tiers[k.Tier], prefix: "{gw:" + k.Client + "}:", shown: consoleIdentity(k)}
		g.attachLevels(cl, k)
		for _, s := range cl.tier.specs {
			cl.specKeys = append(cl.specKeys, s.mark+cl.prefix+s.suffix)
		}
		g.keys[k.Hash] = cl
	}
	if g.queue, err = g.newQueue(reg); err != nil {
		return nil, err
	}
	transport := opts.Transport
	if transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns, t.MaxIdleConnsPerHost = 1024, 256
		t.ResponseHeaderTimeout = cfg.Upstream.Timeout
		if len(cfg.Upstreams) > 0 {
			t.ResponseHeaderTimeout = cfg.Routing.HeaderTimeout
		}
		transport = t
	}
	if opts.WrapTransport != nil {
		transport = opts.WrapTransport(transport)
	}
	if g.pool, err = newPool(Options{Config: cfg, Store: opts.Store, Getenv: getenv, ReadFile: opts.ReadFile, PoolPeriod: opts.PoolPeriod, Registerer: reg,
		Transport: transport, ProbeMin: opts.ProbeMin, ProbeMax: opts.ProbeMax}); err != nil {
		return nil, err
	}
	if g.pool != nil {
		g.upstreamKey = "" // each upstream sends its own
	}
	if g.upstreamKey != "" {
		g.upstreamAuth = []string{"Bearer " + g.upstreamKey}
	}
	if cfg.Batches.Enabled {
		g.batches = newBatchAPI(g, transport)
	}
	if g.pool != nil {
		transport = poolTransport{g: g, next: transport}
	}
	if cfg.Upstream.CountTokens || (g.pool != nil && cfg.Routing.CountTokens) {
		g.counts, g.countClient = newCountCache(countCacheSize), &http.Client{Transport: transport, Timeout: countTokensTimeout}
	}
	g.proxy = &httputil.ReverseProxy{
		Rewrite:   g.rewrite,
		Transport: timedTransport{next: transport},
		// SSE streams and bodies of unknown length are flushed after
		// every write whatever this says (ReverseProxy.flushInterval).
		// A body of known length is not flushed until ServeHTTP's Flush:
		// a negative interval would also start a timer per response that
		// fires at once and flushes the headers in a write of their own,
		// racing the body.
		FlushInterval:  0,
		ModifyResponse: g.modifyResponse,
		BufferPool:     bufferPool{},
		ErrorHandler:   g.upstreamError,
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	if len(cfg.MCPServers) > 0 {
		g.mcp, err = mcpgate.New(mcpgate.Options{Servers: cfg.MCPServers, Store: opts.Store, Getenv: getenv,
			Auth: func(r *http.Request) (mcpgate.Client, bool) {
				cl, two := g.authenticate(r)
				if cl == nil || two {
					return nil, false
				}
				return mcpClient{g, cl}, true
			},
			LeaseTTL: cfg.LeaseTTL, Registerer: reg, Logger: log})
		if err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
	}
	return g, nil
}

// bufferPool recycles ReverseProxy's 32 KiB copy buffers.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *copyBuffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }

// Metrics serves the gateway's metrics when Options.Registerer was nil,
// and 404 otherwise.
func (g *Gateway) Metrics() http.Handler { return g.metrics.handler }

// gather gathers the gateway's private registry (none when
// Options.Registerer was set).
func (g *Gateway) gather() ([]*dto.MetricFamily, error) {
	if g.metrics.gatherer == nil {
		return nil, nil
	}
	return g.metrics.gatherer.Gather()
}

// ServeHTTP implements http.Handler.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if g.mcp != nil && strings.HasPrefix(r.URL.Path, "/mcp/") {
		g.mcp.ServeHTTP(w, r)
		return
	}
	start := time.Now()
	var done bool
	if g.batches == nil || !isBatchPath(r.URL.Path) {
		if w, done = ingress(w, r); done {
			return
		}
	}
	if !strings.HasPrefix(r.URL.Path, "/v1/") {
		writeError(w, http.StatusNotFound, "invalid_request_error", "unknown_url", "", "Unknown request URL: "+r.Method+" "+r.URL.Path+".")
		return
	}
	if !g.served(r) {
		// Unknown paths are 404 before authentication: a wrong path
		// with a right key must not read "invalid API key", and the
		// answer for a path does not depend on the key.
		unknownURL(w, r)
		return
	}
	cl, two := g.authenticate(r)
	if two {
		g.metrics.rejections.WithLabelValues("-", "-", "unauthorized").Inc()
		writeError(w, http.StatusBadRequest, "invalid_request_error", "ambiguous_api_key", "",
			"Two different valid API keys (in Authorization and x-api-key, or in two lines of one): send one key.")
		return
	}
	if cl == nil && r.URL.Path == statusPath && r.Method == http.MethodGet && g.admin != nil && g.admin(r) {
		g.serveAdminStatus(w, r)
		return
	}
	if cl == nil {
		g.metrics.rejections.WithLabelValues("-", "-", "unauthorized").Inc()
		writeError(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "",
			"Incorrect or missing API key. Send your sluice gateway key as: Authorization: Bearer <key>.")
		return
	}
	if g.batches != nil && isBatchPath(r.URL.Path) {
		g.batches.serve(w, r, cl)
		return
	}
	c := g.newCall() // callpool.go
	c.id, c.start, c.client, c.model, c.path = sluice.NewLeaseID(), start, cl, "-", r.URL.Path
	w.Header()["X-Sluice-Request-Id"] = []string{c.id} // canonical: Set would make the key again per request
	ep := endpoints[r.URL.Path]
	if ep == epNone && strings.EqualFold(r.Method, http.MethodPost) {
		if alias := meteredAlias(r.URL.Path); alias != "" {
			// Another spelling of a metered path, which a lenient
			// upstream might route to it unmetered.
			writeError(w, http.StatusNotFound, "invalid_request_error", "unknown_url", "",
				"Unknown request URL: "+r.Method+" "+r.URL.Path+". Did you mean "+alias+"?")
			return
		}
	}
	if ep != epNone && r.Method != http.MethodPost && strings.EqualFold(r.Method, http.MethodPost) {
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "",
			"Method "+r.Method+" is not allowed; use POST.")
		return
	}
	if r.URL.Path == statusPath && r.Method == http.MethodGet {
		g.serveStatus(w, r, c)
		return
	}
	if r.Method != http.MethodPost || ep == epNone {
		// Other /v1/* paths pass through unmetered: reads of the model
		// list, and any method under a configured passthrough prefix.
		// Every other read runs on the gateway's one upstream key, which
		// all clients share: GET /v1/files, /v1/chat/completions or
		// /v1/batches would list and fetch every tenant's files, stored
		// completions and batches. An upgrade (the Realtime API's
		// WebSocket is a GET) is no read: its session would generate
		// unmetered.
		read := (r.Method == http.MethodGet || r.Method == http.MethodHead) && r.Header.Get("Upgrade") == "" && underPrefix(canonicalPath(r.URL.Path), modelsPath)
		if !read && !g.passesThrough(r.URL.Path) {
			unknownURL(w, r)
			return
		}
		g.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callKey{}, c)))
		return
	}
	c.ep = ep
	cl.status.touch()
	if !g.prepare(w, r, c) {
		return
	}
	traced := tracing.Recording(r.Context())
	if traced {
		c.traced = true
		traceRequest(r.Context(), c)
	}
	if g.pool != nil && !g.routeCall(w, c) {
		return
	}
	if !g.admit(w, r, c) {
		g.report(c, false)
		return
	}
	defer g.settleAsync(c) // also when the proxy aborts a broken stream
	if c.countWeigh != nil {
		g.countAdmitted(r, c) // anthropic_count.go
	}
	if g.pool != nil && !g.acquire(w, r, c) {
		g.report(c, false)
		return
	}
	g.report(c, true)
	g.startRenewal(c)
	// Whether the upstream got the request decides, if it does not
	// answer, whether it is refunded (settle): the transport notes it in
	// c.up, on every attempt a pool makes (timedTransport wraps it).
	c.up = &upstreamTrace{}
	c.up.trace.WroteRequest = c.up.wroteRequest
	ctx := httptrace.WithClientTrace(context.WithValue(r.Context(), callKey{}, c), &c.up.trace)
	g.proxy.ServeHTTP(w, r.WithContext(ctx))
	if traced {
		g.traceResponse(r.Context(), c)
	}
	// Hand the client the whole answer now; settling happens off its path.
	_ = http.NewResponseController(w).Flush()
}

// Close waits for the settlements in progress. The Gateway must not serve
// requests after it.
func (g *Gateway) Close() error {
	g.closeOnce.Do(func() { close(g.closing) })
	g.queue.close()
	g.pending.Wait()
	g.releaseReservations() // lease.go
	if g.pool != nil {
		_ = g.pool.Close() // the probes of unreachable upstreams
	}
	return nil
}
