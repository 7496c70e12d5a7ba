package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/console"
	"github.com/sluice-io/sluice/internal/gateway"
	"github.com/sluice-io/sluice/internal/metrics"
	"github.com/sluice-io/sluice/internal/overrides"
	"github.com/sluice-io/sluice/internal/simulate"
	"github.com/sluice-io/sluice/redisstore"
)

// This file serves the operator's console (package console) at /ui when
// the config's `console: {enabled: true}`: the embedded page, and its JSON
// API under /ui/api/. Reading takes an admin session or the admin token
// unless console.public_read (console_session.go); changes (reset, and
// the overrides the page sets through /v1/overrides) need the admin
// token. Whether the console runs is read at start.

// consoleOf returns the console section of cfg, nil when disabled.
func consoleOf(cfg *config.Config) *console.Config {
	if cfg.File == nil || cfg.File.Console == nil || !cfg.File.Console.Enabled {
		return nil
	}
	return cfg.File.Console
}

// newConsole builds the console's series, fleet charts and top-K for a
// server whose initial config enables it; sink and fleet nil mean this
// instance's own top-K and charts.
func (s *Server) newConsole(cc *console.Config, sink console.TopSink, fleet console.FleetSink) {
	if cc == nil {
		s.handle("GET /ui", "console", s.consoleDisabled)
		s.handle("GET /ui/", "console", s.consoleDisabled)
		return
	}
	if sink == nil {
		sink = console.NewMemoryTop()
	}
	if fleet == nil {
		fleet = console.NewMemoryFleet()
	}
	s.series = console.NewSeries(s.decisionTotals, cc.SampleInterval)
	s.fleet = console.NewFleet(s.decisionTotals, fleet, cc.SampleInterval, s.log)
	s.top = console.NewTop(sink, console.TopOptions{Exact: cc.TopExact, Sample: cc.TopSample, Display: s.shownIdentity, Log: s.log})
	s.simulating = make(chan struct{}, 1)
	static := http.FileServerFS(console.Assets())
	s.handle("GET /ui", "console", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/ui/", http.StatusFound)
	})
	s.handle("GET /ui/", "console", s.consoleOn(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'; object-src 'none'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		http.StripPrefix("/ui", static).ServeHTTP(w, r)
	}))
	s.handle("GET /ui/api/overview", "console", s.consoleOn(s.consoleRead(s.handleOverview)))
	s.handle("GET /ui/api/series", "console", s.consoleOn(s.consoleRead(s.handleSeries)))
	s.handle("GET /ui/api/fleet", "console", s.consoleOn(s.consoleRead(s.handleFleet)))
	s.handle("GET /ui/api/top", "console", s.consoleOn(s.consoleRead(s.handleTop)))
	s.handle("GET /ui/api/identity", "console", s.consoleOn(s.consoleRead(s.handleIdentity)))
	s.handle("GET /ui/api/overrides", "console", s.consoleOn(s.consoleRead(s.handleConsoleOverrides)))
	s.handle("GET /ui/api/spend", "console", s.consoleOn(s.consoleRead(s.handleSpend)))
	s.handle("GET /ui/api/upstreams", "console", s.consoleOn(s.consoleRead(s.handleUpstreams)))
	s.handle("GET /ui/api/regions", "console", s.consoleOn(s.consoleRead(s.handleRegions)))
	s.handle("POST /ui/api/reset", "console", s.consoleOn(s.sameOrigin(s.handleConsoleReset)))
	s.handle("POST /ui/api/simulate", "console", s.consoleOn(s.sameOrigin(s.handleSimulate)))
	s.handle("POST /ui/api/session", "console", s.consoleOn(s.sameOrigin(s.handleSessionStart)))
	s.handle("DELETE /ui/api/session", "console", s.consoleOn(s.sameOrigin(s.handleSessionEnd)))
}

// consoleOn answers as consoleDisabled while a reload has turned the
// console off.
func (s *Server) consoleOn(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if consoleOf(s.cfg.Load()) == nil {
			s.consoleDisabled(w, r)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		h(w, r)
	}
}

// consoleDisabledHelp says how to turn the console on.
const consoleDisabledHelp = "the console is disabled: set console: {enabled: true} in the config file and restart sluice serve " +
	"(a reload does not start it); see docs/API.md, \"The operator's console: /ui\""

// consoleDisabledPage is what a browser gets at /ui when the console is
// off: no script, no style, nothing from the config.
const consoleDisabledPage = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>sluice console: disabled</title></head>
<body>
<h1>The sluice console is disabled</h1>
<p>Turn it on in the config file of <code>sluice serve</code>, then restart it (a reload does not start the console):</p>
<pre>console:
  enabled: true</pre>
<p>Its settings, and what it shows, are in <code>docs/API.md</code> of sluice's source and release archives,
section &ldquo;The operator's console: /ui&rdquo;.</p>
</body></html>
`

// consoleDisabled answers 404 at /ui when the console is off, saying how
// to turn it on: a short page to a browser (Accept: text/html), the JSON
// error to anything else.
func (s *Server) consoleDisabled(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	if !strings.Contains(r.Header.Get("Accept"), "text/html") {
		writeError(w, http.StatusNotFound, consoleDisabledHelp)
		return
	}
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusNotFound)
	_, _ = io.WriteString(w, consoleDisabledPage)
}

// shownIdentity is how the top list shows a denied identity: an API key
// as its configured name, or its hash. Top calls it at each flush, off
// the decision path.
func (s *Server) shownIdentity(id string) string {
	if name := keyNameOf(s.cfg.Load(), id); name != "" {
		return overrides.KeyNamePrefix + name
	}
	return id
}

// decisionTotals reads sluice_decisions_total by policy and tier.
func (s *Server) decisionTotals() map[console.SeriesKey]console.Totals {
	out := map[console.SeriesKey]console.Totals{}
	mfs, err := s.m.Registry.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var k console.SeriesKey
			var result string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "policy":
					k.Policy = l.GetValue()
				case "tier":
					k.Tier = l.GetValue()
				case "result":
					result = l.GetValue()
				}
			}
			v := m.GetCounter().GetValue()
			t := out[k]
			t.Decisions += v
			if result == metrics.Denied {
				t.Denials += v
			}
			out[k] = t
		}
	}
	s.gwCounts.addTo(out)
	return out
}

func writeAny(w http.ResponseWriter, v any) {
	b, err := marshalJSON(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "encoding: %v", err)
		return
	}
	writeJSON(w, http.StatusOK, b)
}

func (s *Server) handleSeries(w http.ResponseWriter, _ *http.Request) {
	writeAny(w, map[string]any{"interval_ms": s.series.Interval().Milliseconds(), "series": s.series.Snapshot()})
}

// handleFleet answers the fleet's charts over ?range= (15m, 1h, 6h, 24h;
// default 15m).
func (s *Server) handleFleet(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("range")
	if name == "" {
		name = console.Resolutions[0].Name
	}
	res, ok := console.ResolutionOf(name)
	if !ok {
		writeError(w, http.StatusBadRequest, "range %.16q: valid: 15m, 1h, 6h, 24h", name)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	ch, err := s.fleet.Chart(ctx, res, time.Now())
	if err != nil {
		s.log.Warn("console: reading the fleet's counts", "err", err)
		writeError(w, http.StatusServiceUnavailable, "the store cannot be read now")
		return
	}
	writeAny(w, ch)
}

func (s *Server) handleTop(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	// Shared by every caller within a flush interval (Top.Read): the
	// endpoint needs no token, and each read of a Redis sink costs Redis.
	top, err := s.top.Read(ctx, 20, time.Now())
	if err != nil {
		s.log.Warn("console: reading the top limited identities", "err", err)
		writeError(w, http.StatusServiceUnavailable, "the store cannot be read now")
		return
	}
	// exact and sample say how far the counts are exact: a hit marked
	// sampled was denied more than exact times in a second somewhere.
	writeAny(w, map[string]any{"top": top, "shared": s.top.Sink().Shared(), "exact": s.top.Exact(), "sample": s.top.Sample()})
}

type policyJSON struct {
	Name      string `json:"name"`
	Algorithm string `json:"algorithm"`
	Limit     string `json:"limit"`
	Human     string `json:"human"`
	Shadow    bool   `json:"shadow"`
	Lease     bool   `json:"lease"`
}

func (s *Server) handleOverview(w http.ResponseWriter, r *http.Request) {
	cfg := s.cfg.Load()
	out := map[string]any{}
	var ps []policyJSON
	for _, n := range cfg.PolicyNames() {
		p := cfg.Policies[n]
		ps = append(ps, policyJSON{n, p.Algorithm.String(), p.Limit.String(), console.HumanLimit(p.Algorithm, p.Limit), p.Shadow, p.Lease})
	}
	type tierJSON struct {
		Name     string   `json:"name"`
		Policies []string `json:"policies"`
	}
	var ts []tierJSON
	for _, n := range cfg.TierNames() {
		t := tierJSON{Name: n}
		for _, p := range cfg.Tiers[n].Policies {
			t.Policies = append(t.Policies, p.Name)
		}
		ts = append(ts, t)
	}
	type keyJSON struct {
		Name string `json:"name"`
		Tier string `json:"tier"`
	}
	ks := []keyJSON{}
	for _, k := range cfg.Keys {
		tier := ""
		if k.Tier != nil {
			tier = k.Tier.Name
		}
		ks = append(ks, keyJSON{k.Name, tier})
	}
	slices.SortFunc(ks, func(a, b keyJSON) int { return strings.Compare(a.Name, b.Name) })
	store := map[string]any{"kind": storeName(cfg.Store), "failure_policy": cfg.Store.FailurePolicy, "ready": true}
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	if err := s.guard.ready(ctx); err != nil {
		store["ready"], store["error"] = false, "unreachable"
	}
	var algos []string
	for _, a := range sluice.Algorithms() {
		if a != sluice.Concurrency {
			algos = append(algos, a.String())
		}
	}
	out["policies"], out["tiers"], out["keys"], out["store"] = ps, ts, ks, store
	out["admin"], out["admin_enabled"] = s.consoleAdmin(r), s.adminEnabled()
	out["overrides_shared"], out["algorithms"] = s.ovr.Shared(), algos
	if gw := cfg.File.Gateway; gw != nil {
		out["gateway"] = gatewaySummary(cfg)
	}
	if rs := s.guard.regionStore(); rs != nil {
		out["region"] = rs.Region() // the region view (console_regions.go)
	}
	writeAny(w, out)
}

// gatewaySummary is the gateway's tiers, models, budgets and key names;
// never its upstream (which may hold a credential) or key hashes.
func gatewaySummary(cfg *config.Config) any {
	gw := cfg.File.Gateway
	type tier struct {
		Name        string   `json:"name"`
		RPM         int64    `json:"rpm"`
		TPM         int64    `json:"tpm"`
		RPD         int64    `json:"rpd"`
		Concurrency int64    `json:"concurrency"`
		Models      []string `json:"models"`
	}
	var ts []tier
	for name, t := range gw.Tiers {
		x := tier{Name: name, RPM: t.RPM, TPM: t.TPM, RPD: t.RPD, Concurrency: t.Concurrency}
		for m, l := range t.Models {
			x.Models = append(x.Models, fmt.Sprintf("%s (rpm %d, tpm %d)", m, l.RPM, l.TPM))
		}
		slices.Sort(x.Models)
		ts = append(ts, x)
	}
	slices.SortFunc(ts, func(a, b tier) int { return strings.Compare(a.Name, b.Name) })
	type key struct {
		Name string `json:"name"`
		Tier string `json:"tier"`
	}
	ks := []key{}
	for _, k := range gw.Keys {
		// As the top list and the look-up name it: a key without a name
		// by its client id (never its hash).
		name := k.Name
		if name == "" {
			name = gateway.ClientPrefix + k.Client
		}
		ks = append(ks, key{name, k.Tier})
	}
	// pool: the console's upstreams view (console_upstreams.go) applies.
	return map[string]any{"tiers": ts, "models": gw.Models, "keys": ks, "default_max_tokens": gw.DefaultMaxTokens, "pool": len(gw.Upstreams) > 0}
}

// consoleIdentity resolves what the page names: "key_name:NAME" is that
// API key's identity (key:HASH); anything else is an identity as it is.
func consoleIdentity(cfg *config.Config, id string) (identity string, key *config.Key, err error) {
	if id == "" || len(id) > config.MaxKeyLen {
		return "", nil, fmt.Errorf("give an identity of 1 to %d bytes", config.MaxKeyLen)
	}
	if name, ok := strings.CutPrefix(id, overrides.KeyNamePrefix); ok {
		for _, k := range cfg.Keys {
			if k.Name == name {
				return "key:" + k.Hash, k, nil
			}
		}
		return "", nil, fmt.Errorf("no API key is named %q", name)
	}
	if h, ok := strings.CutPrefix(id, "key:"); ok {
		return id, cfg.Keys[h], nil
	}
	return id, nil, nil
}

func (s *Server) handleConsoleReset(w http.ResponseWriter, r *http.Request) {
	by, ok := s.authorizeConsole(w, r, "reset")
	if !ok {
		return
	}
	cfg := s.cfg.Load()
	q := r.URL.Query()
	identity, key, err := consoleIdentity(cfg, q.Get("id"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	// A reset forgets every count of the identity at once: the page asks
	// first, and the request must say again whom it resets, so that a
	// stray or replayed click without its confirmation does nothing.
	if c, ok := q["confirm"]; !ok || len(c) != 1 || c[0] != q.Get("id") {
		writeError(w, http.StatusPreconditionRequired, "a reset needs confirm=ID, the id again: it forgets every count of the identity")
		return
	}
	var reqs []sluice.Request
	for _, n := range cfg.PolicyNames() {
		reqs = append(reqs, newTarget(cfg, cfg.Policies[n], metrics.NoTier, identity, key, 1).req)
	}
	s.reset(w, r, by, "console", identity, reqs)
}

// Bounds of a console simulation: it runs in the request, one at a time
// per instance (its endpoint needs no token; at the bounds one takes a
// tenth of a second of a core, so parallel callers could otherwise starve
// the decisions of CPU).
const (
	maxSimBody     = 4 << 10
	maxSimArrivals = 200_000
	maxSimDuration = time.Hour
)

func (s *Server) handleSimulate(w http.ResponseWriter, r *http.Request) {
	select {
	case s.simulating <- struct{}{}:
		defer func() { <-s.simulating }()
	default:
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusTooManyRequests, "another simulation is running on this instance; retry in a second")
		return
	}
	var body struct {
		Limit      string   `json:"limit"`
		Pattern    string   `json:"pattern"`
		RPS        float64  `json:"rps"`
		Duration   string   `json:"duration"`
		Algorithms []string `json:"algorithms"`
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxSimBody))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "request body larger than %d bytes", maxSimBody)
		return
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "malformed JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
		return
	}
	limit, err := sluice.ParseLimit(body.Limit)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%s", strings.TrimPrefix(err.Error(), "sluice: "))
		return
	}
	d, err := time.ParseDuration(body.Duration)
	if err != nil || d <= 0 || d > maxSimDuration {
		writeError(w, http.StatusBadRequest, "duration %q must be from 1ms to %s", body.Duration, maxSimDuration)
		return
	}
	if !(body.RPS > 0) || body.RPS*2*d.Seconds() > maxSimArrivals {
		writeError(w, http.StatusBadRequest, "rps must be positive and rps x duration x 2 at most %d", maxSimArrivals)
		return
	}
	if len(body.Algorithms) == 0 || len(body.Algorithms) > 8 {
		writeError(w, http.StatusBadRequest, "pick 1 to 8 algorithms")
		return
	}
	var algos []sluice.Algorithm
	for _, n := range body.Algorithms {
		a, err := sluice.ParseAlgorithm(n)
		if err != nil || a == sluice.Concurrency || slices.Contains(algos, a) {
			writeError(w, http.StatusBadRequest, "algorithm %q: unknown, repeated or not simulable", n)
			return
		}
		algos = append(algos, a)
	}
	if !slices.Contains(simulate.Patterns(), simulate.Pattern(body.Pattern)) {
		writeError(w, http.StatusBadRequest, "pattern %q: valid: steady, burst, ramp", body.Pattern)
		return
	}
	arrivals, err := simulate.Generate(simulate.Pattern(body.Pattern), body.RPS, d)
	if err != nil || len(arrivals) == 0 {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	bucket := max(d/60, time.Second)
	res, err := simulate.Run(r.Context(), limit, algos, arrivals, bucket)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	allowed, totals := map[string][]int{}, map[string]int{}
	names := make([]string, len(algos))
	for i, a := range algos {
		names[i] = a.String()
		allowed[a.String()], totals[a.String()] = res.Allowed[a], res.Total(a)
	}
	writeAny(w, map[string]any{"bucket_ms": bucket.Milliseconds(), "offered": res.Offered, "algorithms": names, "allowed": allowed, "totals": totals})
}

// newTopSink is the top-K's sink on store: Redis when it is (found
// through Unwrap), so that the list is the fleet's; nil (this instance's)
// otherwise.
func newTopSink(store sluice.Store) console.TopSink {
	for st := store; st != nil; {
		if rs, ok := st.(*redisstore.Store); ok {
			return console.NewRedisTop(rs.Client, "")
		}
		u, ok := st.(interface{ Unwrap() sluice.Store })
		if !ok {
			return nil
		}
		st = u.Unwrap()
	}
	return nil
}

// newFleetSink is the fleet charts' sink on store: Redis when it is, so
// that the charts are the fleet's; nil (this instance's) otherwise.
func newFleetSink(store sluice.Store) console.FleetSink {
	if rs := redisOf(store); rs != nil {
		return console.NewRedisFleet(rs.Client, "")
	}
	return nil
}

// redisOf finds the Redis store under store (through Unwrap), or nil.
func redisOf(store sluice.Store) *redisstore.Store {
	for st := store; st != nil; {
		if rs, ok := st.(*redisstore.Store); ok {
			return rs
		}
		u, ok := st.(interface{ Unwrap() sluice.Store })
		if !ok {
			return nil
		}
		st = u.Unwrap()
	}
	return nil
}

// consoleComponent samples the charts and flushes the top-K and the
// fleet's counts.
type consoleComponent struct{ s *Server }

func (c consoleComponent) Name() string { return "console" }

func (c consoleComponent) Run(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.s.top.Run(ctx)
	}()
	fleetDone := make(chan struct{})
	go func() {
		defer close(fleetDone)
		_ = c.s.fleet.Run(ctx)
	}()
	err := c.s.series.Run(ctx)
	<-done
	<-fleetDone
	return err
}
