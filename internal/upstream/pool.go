package upstream

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice"
)

// ErrNoKey means an upstream's key variable is empty or its key file
// unreadable or empty.
var ErrNoKey = errors.New("upstream: key missing")

// Options configure a Pool.
type Options struct {
	// Upstreams, Routes and Routing are the checked configuration (Check).
	Upstreams []Def
	Routes    map[string][]Target
	Routing   Routing
	// Store keeps the provider limits; share it among gateway replicas.
	Store sluice.Store
	// Getenv and ReadFile read keys; nil means os.Getenv and os.ReadFile.
	Getenv   func(string) string
	ReadFile func(string) ([]byte, error)
	// Period is the period of the provider limits: a minute, unless a test
	// shortens it.
	Period time.Duration
	// Metrics, when not nil, counts per upstream and model.
	Metrics *Metrics
	// Now is the clock of the pool's local estimates; nil means time.Now.
	Now func() time.Time
	// Prober sends the probes of unreachable upstreams (probe.go); nil
	// means http.DefaultTransport.
	Prober http.RoundTripper
	// ProbeMin and ProbeMax bound the probes' backoff; zero means
	// DefaultProbeMin and DefaultProbeMax.
	ProbeMin, ProbeMax time.Duration
}

// Upstream is one provider account or deployment.
type Upstream struct {
	Name, Region string
	Kind         Kind
	Weight       float64
	base         *url.URL
	basePath     string
	apiVersion   string
	auth         authHeader
	pace         time.Duration
	healthPath   string
	health       health
}

type authHeader struct {
	name  string   // canonical header name, "" for none
	value []string // shared, never modified
}

// Pool routes requests among upstreams. It is safe for concurrent use.
type Pool struct {
	upstreams []*Upstream
	routes    map[string]*Route
	routing   Routing
	store     sluice.Store
	period    time.Duration
	metrics   *Metrics
	now       func() time.Time
	// background counts the tightenings in flight (Observe, Wait).
	background sync.WaitGroup
	// The probes of unreachable upstreams (probe.go): their transport
	// and backoff, those running, and Close's signal.
	prober             http.RoundTripper
	probeMin, probeMax time.Duration
	probing            sync.WaitGroup
	closing            chan struct{}
	closeOnce          sync.Once
}

// Route is the upstreams serving one client-facing model.
type Route struct {
	Name    string
	Targets []*TargetState
}

// TargetState is one upstream's model within the pool: its limits, as
// declared and as learned, and the pool's local view of its headroom.
type TargetState struct {
	Up      *Upstream
	Model   string
	limits  Limits
	keyBase string // "{up:NAME/MODEL}:"
	// learned[i] is the provider's reported limit for rpm, tpm, itpm,
	// otpm, when below the declared one; 0 when none was learned.
	learned [4]atomic.Int64
	// frac is the remaining fraction (×1e6) the last decision saw, at
	// fracAt (unix nanos); retryAt (unix nanos) when it next has room.
	frac, fracAt, retryAt atomic.Int64
	// coolUntil and downUntil (unix nanos) are when this replica's last
	// cooldown (a provider 429) and circuit (a failure) end, for
	// /v1/status.
	coolUntil, downUntil atomic.Int64
	// latency is an EWMA of the time to response headers, in µs.
	latency atomic.Int64
	// syncing is set while a learned-remaining check runs.
	syncing atomic.Bool
	// lastRemaining is the provider's last reported remaining requests
	// and tokens, -1 when none (for /v1/status).
	lastRemaining [2]atomic.Int64
	// chunk is this replica's lease on the limits, when hot (lease.go).
	chunk chunk
	// ratio is the learned ratio of the provider's input count to the
	// reserved (units.go).
	ratio ratioState
}

// limit kinds, in the order of learned.
const (
	limRPM = iota
	limTPM
	limITPM
	limOTPM
)

var limNames = [4]string{"rpm", "tpm", "itpm", "otpm"}

// New builds a Pool. It reads every upstream's key and fails, naming the
// upstream and wrapping ErrNoKey, if one is missing.
func New(opts Options) (*Pool, error) {
	getenv, readFile := opts.Getenv, opts.ReadFile
	if getenv == nil {
		getenv = os.Getenv
	}
	if readFile == nil {
		readFile = os.ReadFile
	}
	p := &Pool{routes: map[string]*Route{}, routing: opts.Routing, store: opts.Store, period: opts.Period, metrics: opts.Metrics, now: opts.Now,
		prober: opts.Prober, probeMin: opts.ProbeMin, probeMax: opts.ProbeMax, closing: make(chan struct{})}
	if p.prober == nil {
		p.prober = http.DefaultTransport
	}
	if p.probeMin <= 0 {
		p.probeMin = DefaultProbeMin
	}
	if p.probeMax < p.probeMin {
		p.probeMax = max(DefaultProbeMax, p.probeMin)
	}
	if p.period <= 0 {
		p.period = time.Minute
	}
	if p.now == nil {
		p.now = time.Now
	}
	if p.routing.MaxAttempts <= 0 {
		p.routing.MaxAttempts = DefaultMaxAttempts
	}
	if p.routing.Deadline <= 0 {
		p.routing.Deadline = DefaultDeadline
	}
	if p.routing.Margin == nil {
		m := DefaultMargin
		p.routing.Margin = &m
	}
	byName := map[string]*Upstream{}
	states := map[[2]string]*TargetState{}
	for _, d := range opts.Upstreams {
		key, err := ReadKey(d, getenv, readFile)
		if err != nil {
			return nil, err
		}
		base, err := url.Parse(d.BaseURL)
		if err != nil {
			return nil, fmt.Errorf("upstream %s: base_url: %w", d.Name, err)
		}
		u := &Upstream{Name: d.Name, Region: d.Region, Kind: d.Kind, Weight: max(d.Weight, 1e-9), base: base,
			basePath: strings.TrimSuffix(base.Path, "/"), apiVersion: d.APIVersion, pace: d.Pace, healthPath: d.HealthPath}
		if key != "" {
			switch d.Kind {
			case Azure:
				u.auth = authHeader{"Api-Key", []string{key}}
			case Anthropic:
				u.auth = authHeader{"X-Api-Key", []string{key}}
			default:
				u.auth = authHeader{"Authorization", []string{"Bearer " + key}}
			}
		}
		p.upstreams = append(p.upstreams, u)
		byName[d.Name] = u
		for m, l := range d.Models {
			ts := &TargetState{Up: u, Model: m, limits: l, keyBase: "{up:" + d.Name + "/" + m + "}:"}
			ts.frac.Store(1e6)
			ts.lastRemaining[0].Store(-1)
			ts.lastRemaining[1].Store(-1)
			states[[2]string{d.Name, m}] = ts
		}
	}
	for name, ts := range opts.Routes {
		r := &Route{Name: name}
		for _, t := range ts {
			st := states[[2]string{t.Upstream, t.Model}]
			if st == nil {
				return nil, fmt.Errorf("upstream: route %s: upstream %s has no model %s", name, t.Upstream, t.Model)
			}
			r.Targets = append(r.Targets, st)
		}
		p.routes[name] = r
	}
	return p, nil
}

// ReadKey reads d's key from its variable or file. A missing key is an
// error wrapping ErrNoKey unless d allows none.
func ReadKey(d Def, getenv func(string) string, readFile func(string) ([]byte, error)) (string, error) {
	var key string
	switch {
	case d.KeyEnv != "":
		key = strings.TrimSpace(getenv(d.KeyEnv))
		if key == "" && !d.AllowNoKey {
			return "", fmt.Errorf("upstream %s: %w: the variable %s is empty; set it, or set allow_no_key: true for a server that needs none", d.Name, ErrNoKey, d.KeyEnv)
		}
	case d.KeyFile != "":
		b, err := readFile(d.KeyFile)
		if err != nil && !d.AllowNoKey {
			return "", fmt.Errorf("upstream %s: %w: key_file %s: %w", d.Name, ErrNoKey, d.KeyFile, err)
		}
		key = strings.TrimSpace(string(b))
		if key == "" && !d.AllowNoKey {
			return "", fmt.Errorf("upstream %s: %w: key_file %s is empty", d.Name, ErrNoKey, d.KeyFile)
		}
	}
	if strings.ContainsAny(key, "\r\n") {
		return "", fmt.Errorf("upstream %s: %w: the key holds a line break", d.Name, ErrNoKey)
	}
	return key, nil
}

// Route returns the route of a client-facing model: its own, else the
// route of its dated snapshot's base, else "*"; nil when none.
func (p *Pool) Route(model, base string) *Route {
	if r := p.routes[model]; r != nil {
		return r
	}
	if r := p.routes[base]; r != nil && base != "" {
		return r
	}
	return p.routes["*"]
}

// Serves reports whether r has an upstream of the API a request came to:
// Anthropic's Messages API (anthropic) or OpenAI's.
func (r *Route) Serves(anthropic bool) bool {
	for _, t := range r.Targets {
		if (t.Up.Kind == Anthropic) == anthropic {
			return true
		}
	}
	return false
}

// CountTarget returns the Anthropic target of r that count_tokens asks:
// the first not cooling, down or unreachable, else the first reachable
// one; nil when r has none reachable.
func (p *Pool) CountTarget(r *Route) *TargetState {
	var first *TargetState
	now := p.now().UnixNano()
	for _, t := range r.Targets {
		if t.Up.Kind != Anthropic || !t.Up.Reachable() {
			continue
		}
		if t.retryAt.Load() <= now {
			return t
		}
		if first == nil {
			first = t
		}
	}
	return first
}

// CountsTokens reports whether t limits tokens.
func (t *TargetState) CountsTokens() bool {
	return t.limit(limTPM) > 0 || t.limit(limITPM) > 0 || t.limit(limOTPM) > 0
}

// leasing reports whether hot upstream models are leased (lease.go).
func (p *Pool) leasing() bool { return p.routing.Lease == nil || *p.routing.Lease }

// Upstreams returns the pool's upstreams in configuration order.
func (p *Pool) Upstreams() []*Upstream { return p.upstreams }

// Routing returns the routing section in force.
func (p *Pool) Routing() Routing { return p.routing }

// Targets returns every distinct upstream model of the pool, sorted by
// upstream and model.
func (p *Pool) Targets() []*TargetState {
	seen := map[*TargetState]bool{}
	var out []*TargetState
	for _, r := range p.routes {
		for _, t := range r.Targets {
			if !seen[t] {
				seen[t] = true
				out = append(out, t)
			}
		}
	}
	slices.SortFunc(out, func(a, b *TargetState) int {
		return strings.Compare(a.Up.Name+"\x00"+a.Model, b.Up.Name+"\x00"+b.Model)
	})
	return out
}

// limit returns the effective limit of kind i: the declared one, or the
// provider's when it reported a smaller one; 0 when none.
func (t *TargetState) limit(i int) int64 {
	d := [4]int64{t.limits.RPM, t.limits.TPM, t.limits.ITPM, t.limits.OTPM}[i]
	if l := t.learned[i].Load(); l > 0 && (d == 0 || l < d) {
		return l
	}
	return d
}

// Limits returns the limits in force: the declared ones, tightened by what
// the provider reported.
func (t *TargetState) Limits() Limits {
	return Limits{RPM: t.limit(limRPM), TPM: t.limit(limTPM), ITPM: t.limit(limITPM), OTPM: t.limit(limOTPM)}
}

// Declared returns the limits in the configuration.
func (t *TargetState) Declared() Limits { return t.limits }

// Headroom is the fraction of the tightest limit left at the last
// decision, refilled since at the limits' rate, in [0, 1].
func (t *TargetState) Headroom(now time.Time, period time.Duration) float64 {
	f := float64(t.frac.Load()) / 1e6
	if at := t.fracAt.Load(); at > 0 {
		f += float64(now.UnixNano()-at) / float64(period)
	}
	return math.Max(0, math.Min(1, f))
}

// Period returns the provider limits' period.
func (p *Pool) Period() time.Duration { return p.period }

// LastRemaining returns the provider's last reported remaining requests
// and tokens, each -1 when it never reported any.
func (t *TargetState) LastRemaining() (requests, tokens int64) {
	return t.lastRemaining[0].Load(), t.lastRemaining[1].Load()
}

// requests returns the store requests of n reservations of in input and
// out output tokens on t (n > 1: a chunk, bounded to a share of each
// limit), the limit kind of each (-1: the cooldown key), and false if one
// reservation can never fit: per declared limit its log, and its pace's
// log when the upstream has one, then the cooldown key.
func (p *Pool) requests(t *TargetState, in, out, n int64) ([]sluice.Request, []int8, bool) {
	reqs := make([]sluice.Request, 0, 9)
	kinds := make([]int8, 0, 9)
	cs := costs(in, out)
	for i := range 4 {
		rate := t.limit(i)
		if rate == 0 {
			continue
		}
		cost := cs[i]
		lim := p.limitOf(rate)
		if cost > lim.Rate {
			return nil, nil, false
		}
		if cost == 0 {
			continue
		}
		pace, paced := p.paceOf(t, i, rate)
		take := cost
		if n > 1 {
			// Whole reservations, at most a share of the limit (and of
			// the pace's window), at least one: no product to overflow.
			most := lim.Rate / maxChunkShare
			if paced {
				most = min(most, pace.Rate)
			}
			take = cost * min(n, max(most/cost, 1))
		}
		reqs = append(reqs, sluice.Request{Key: t.keyBase + limNames[i], Algorithm: sluice.SlidingWindowLog, Limit: lim, Cost: take})
		kinds = append(kinds, int8(i))
		if paced {
			reqs = append(reqs, sluice.Request{Key: t.keyBase + limNames[i] + ":pace", Algorithm: sluice.SlidingWindowLog, Limit: pace, Cost: take})
			kinds = append(kinds, int8(i))
		}
	}
	return append(reqs, p.coolReq(t, 1)), append(kinds, -1), true
}

// paceOf is the limit of t's pace on its limit of kind i, of rate per
// period: the request limit's share of a pace-long window (what the
// margin leaves of it, at least one request); false when t has no pace,
// or for a token limit, which is not paced (a request larger than a
// window's share of tokens could never go while others do).
func (p *Pool) paceOf(t *TargetState, i int, rate int64) (sluice.Limit, bool) {
	pace := t.Up.pace
	if pace <= 0 || pace >= p.period || i != limRPM {
		return sluice.Limit{}, false
	}
	// In floating point: rate × pace in nanoseconds overflows an int64
	// for the largest limits.
	share := int64(float64(p.limitOf(rate).Rate) * float64(pace) / float64(p.period))
	return sluice.Limit{Rate: max(share, 1), Period: pace, Granularity: slotOf(pace)}, true
}

// coolReq is t's cooldown key: a GCRA bucket of one unit per microsecond,
// far above any provider's rate, from which every admission takes 1 and
// which a cooldown charges into debt (Cooldown), so that only a cooldown
// ever denies there.
func (p *Pool) coolReq(t *TargetState, cost int64) sluice.Request {
	return sluice.Request{Key: t.keyBase + "cool", Algorithm: sluice.GCRA,
		Limit: sluice.Limit{Rate: p.coolRate(), Period: p.period}, Cost: cost}
}

// coolRate is the cooldown key's rate: one per microsecond.
func (p *Pool) coolRate() int64 { return max(int64(p.period/time.Microsecond), 1) }

// logReq is the store request of cost on t's limit of kind i, of rate.
func (p *Pool) logReq(t *TargetState, i int, rate, cost int64) sluice.Request {
	return sluice.Request{Key: t.keyBase + limNames[i], Algorithm: sluice.SlidingWindowLog, Limit: p.limitOf(rate), Cost: cost}
}

// limitOf is the store's limit for a provider limit of rate per period:
// a sliding window log of the rate less the margin (marginOf). A log holds at most
// its rate in any window of one period, which no provider refuses
// whether it counts in a bucket refilling continuously (OpenAI,
// Anthropic), in fixed windows or in sliding ones; a token bucket or
// GCRA of the same rate would let twice the rate through in the first
// period, a bucket's worth and its refill. Admissions are stamped at the
// end of a slot of period/200 (Limit.Granularity), so that a log holds
// at most about 200 runs at any rate.
func (p *Pool) limitOf(rate int64) sluice.Limit {
	return sluice.Limit{Rate: max(rate-marginOf(rate, *p.routing.Margin), 1), Period: p.period, Granularity: slotOf(p.period)}
}

// marginOf is what a margin m leaves unused of a limit of rate: rate × m
// rounded up, so that 2% of 30 keeps 1 back, not 0. A product that is a
// whole number but for floating point's error (7% of 100 is
// 7.000000000000001) is that number.
func marginOf(rate int64, m float64) int64 {
	x := float64(rate) * m
	if r := math.Round(x); math.Abs(x-r) <= 1e-9*math.Max(1, x) {
		return int64(r)
	}
	return int64(math.Ceil(x))
}

// Grant is a reservation admitted on one upstream's model. Settle it
// exactly once.
type Grant struct {
	Target  *TargetState
	pool    *Pool
	reqs    []sluice.Request
	kinds   []int8 // of reqs, as requests returns them
	in, out int64
	// units is the request's size as the caller gave it, base its input
	// on Target before the learned ratio (units.go).
	units Units
	base  int64
	// refusal is what Judge made of the provider's 429, if any.
	refusal Refusal
	// sent is when the store call that admitted the grant's units was
	// sent (its chunk's, for a grant from a chunk), and rtt how long it
	// took to answer.
	sent    time.Time
	rtt     time.Duration
	settled atomic.Bool
}

// Acquire reserves one request of in input and out output tokens on the
// best target of r with room, by the pool's policy, skipping those in
// tried and those whose API is not the request's (anthropic says the
// request came to /v1/messages). With no target that has room it returns
// a nil Grant and when the first may have room again (an honest
// Retry-After; zero when no target can ever take the request). Targets
// whose upstream is unreachable (probe.go) are skipped; when they are all
// that is left, the error wraps ErrUnreachable. Store errors are returned
// as they are.
func (p *Pool) Acquire(ctx context.Context, r *Route, anthropic bool, in, out int64, tried []*TargetState) (*Grant, time.Duration, error) {
	return p.AcquireSticky(ctx, r, anthropic, in, out, tried, "")
}

// AcquireSticky is Acquire with an affinity key (a conversation's id): the
// same key prefers the same upstream of the route while it has room and
// is not cooling, for the provider's prompt cache; the policy orders the
// rest. An empty key is Acquire.
func (p *Pool) AcquireSticky(ctx context.Context, r *Route, anthropic bool, in, out int64, tried []*TargetState, affinity string) (*Grant, time.Duration, error) {
	return p.AcquireUnits(ctx, r, anthropic, Units{In: in, Out: out}, tried, affinity)
}

// AcquireUnits is AcquireSticky of a request whose size u gives as each
// kind of upstream counts it: each target reserves its own units, times
// its learned ratio (units.go).
func (p *Pool) AcquireUnits(ctx context.Context, r *Route, anthropic bool, u Units, tried []*TargetState, affinity string) (*Grant, time.Duration, error) {
	now := p.now()
	var cands [MaxRouteTargets]*TargetState
	n, dead := 0, 0
	for _, t := range r.Targets {
		if (t.Up.Kind == Anthropic) != anthropic || slices.Contains(tried, t) {
			continue
		}
		if !t.Up.Reachable() {
			dead++ // never a client's request: probes bring it back
			continue
		}
		cands[n] = t
		n++
	}
	if n == 0 && dead > 0 {
		return nil, 0, fmt.Errorf("upstream: route %s: %w", r.Name, ErrUnreachable)
	}
	order := p.order(cands[:n], now)
	if affinity != "" && n > 1 {
		h := fnv.New64a()
		_, _ = h.Write([]byte(affinity))
		// The preferred target by its place in the route, so that every
		// replica prefers the same one.
		var pref *TargetState
		k := h.Sum64() % uint64(len(r.Targets))
		for i := range r.Targets {
			if t := r.Targets[(int(k)+i)%len(r.Targets)]; slices.Contains(order, t) {
				pref = t
				break
			}
		}
		if pref != nil && pref.retryAt.Load() <= now.UnixNano() {
			i := slices.Index(order, pref)
			copy(order[1:i+1], order[:i])
			order[0] = pref
		}
	}
	wait := time.Duration(-1)
	for _, t := range order {
		p.refreshRatio(ctx, t, now)
		base, out := t.baseIn(u), u.Out
		in := t.inputOf(u)
		reqs, kinds, fits := p.requests(t, in, out, 1)
		if !fits {
			continue
		}
		if p.leasing() {
			ok, sent, rtt, n := p.fromChunk(t, in, out, now)
			if !ok && n > 1 {
				var err error
				if ok, sent, rtt, err = p.fetchChunk(ctx, t, in, out, n); err != nil {
					return nil, 0, err
				}
			}
			if ok {
				return &Grant{Target: t, pool: p, reqs: reqs, kinds: kinds, in: in, out: out, units: u, base: base, sent: sent, rtt: rtt}, 0, nil
			}
		}
		sent := p.now()
		ds, err := p.store.ApplyAll(ctx, sluice.OpAllow, reqs)
		if err != nil {
			return nil, 0, fmt.Errorf("upstream %s model %s: %w", t.Up.Name, t.Model, err)
		}
		d := sluice.Combine(ds)
		answered := p.now()
		t.note(reqs, ds, answered)
		if d.Allowed {
			return &Grant{Target: t, pool: p, reqs: reqs, kinds: kinds, in: in, out: out, units: u, base: base, sent: sent, rtt: answered.Sub(sent)}, 0, nil
		}
		if wait < 0 || d.RetryAfter < wait {
			wait = d.RetryAfter
		}
	}
	return nil, max(wait, 0), nil
}

// note records the headroom a decision showed.
func (t *TargetState) note(reqs []sluice.Request, ds []sluice.Decision, now time.Time) {
	f := 1.0
	var ra time.Duration
	for i, d := range ds {
		if c := reqs[i].Limit.Rate; reqs[i].Algorithm == sluice.SlidingWindowLog && c > 0 { // not the cooldown key
			f = math.Min(f, float64(d.Remaining)/float64(c))
		}
		ra = max(ra, d.RetryAfter)
	}
	t.frac.Store(int64(math.Max(f, -1) * 1e6))
	t.fracAt.Store(now.UnixNano())
	if ra > 0 {
		t.retryAt.Store(now.Add(ra).UnixNano())
	}
}

// order sorts the candidates by the policy, those known to be full or
// cooling last.
func (p *Pool) order(cands []*TargetState, now time.Time) []*TargetState {
	nowNS := now.UnixNano()
	score := func(t *TargetState) float64 {
		switch p.routing.Policy {
		case PolicyLatency:
			return -float64(t.latency.Load())
		case PolicyWeighted:
			// Efraimidis-Spirakis: a weighted random order.
			return math.Log(rand.Float64()+1e-12) / t.Up.Weight
		}
		return t.Headroom(now, p.period)
	}
	type scored struct {
		t       *TargetState
		s       float64
		cooling bool
	}
	var buf [MaxRouteTargets]scored
	ss := buf[:0]
	for _, t := range cands {
		ss = append(ss, scored{t, score(t), t.retryAt.Load() > nowNS})
	}
	slices.SortStableFunc(ss, func(a, b scored) int {
		if a.cooling != b.cooling {
			if a.cooling {
				return 1
			}
			return -1
		}
		switch {
		case a.s > b.s:
			return -1
		case a.s < b.s:
			return 1
		}
		return 0
	})
	for i, s := range ss {
		cands[i] = s.t
	}
	return cands
}

// Settle settles the grant once with in and out actual tokens. A request
// no upstream received (unsent) gives its request and tokens back. An
// Anthropic upstream gives unused tokens back when a request ends, and so
// does the grant; OpenAI and Azure count a request's prompt and max_tokens
// when it arrives and keep them, and so does the grant. Usage beyond the
// reservation is charged, but for the input of OpenAI and Azure, whose
// limits counted their estimate (the reservation's units), not the usage. Refunds take units back from the grant's own
// admission or older ones (Request.AdmittedAgo), never from a later one,
// which would free capacity up to a period too early. Later calls do
// nothing and return false.
func (g *Grant) Settle(ctx context.Context, in, out int64, unsent bool) (bool, error) {
	if g == nil || !g.settled.CompareAndSwap(false, true) {
		return false, nil
	}
	// The store subtracts the age from its own time when it runs the
	// refund: the admission's round trip stands for the refund's transit.
	age := max(g.pool.now().Sub(g.sent)+g.rtt, time.Nanosecond)
	giveBack := unsent || g.Target.Up.Kind == Anthropic
	if k := g.Target.Up.Kind; k == OpenAI || k == Azure {
		// Their limits counted the input as estimated on arrival, in
		// the units reserved (units.go), not the usage's tokens.
		in = min(in, g.in)
	}
	var refunds, charges []sluice.Request
	for j, req := range g.reqs {
		var actual int64
		switch g.kinds[j] {
		case -1:
			continue // the cooldown key
		case limRPM:
			if !unsent {
				continue
			}
		default:
			if !unsent {
				actual = costs(in, out)[g.kinds[j]]
			}
		}
		switch d := req.Cost - actual; {
		case d > 0 && giveBack:
			req.Cost, req.AdmittedAgo = d, age
			refunds = append(refunds, req)
		case d < 0:
			req.Cost = -d
			charges = append(charges, req)
		}
	}
	var errs []error
	if len(refunds) > 0 {
		if _, err := g.pool.store.ApplyAll(ctx, sluice.OpRefund, refunds); err != nil {
			errs = append(errs, fmt.Errorf("upstream %s: refund: %w", g.Target.Up.Name, err))
		}
	}
	if len(charges) > 0 {
		if _, err := g.pool.store.ApplyAll(ctx, sluice.OpCharge, charges); err != nil {
			errs = append(errs, fmt.Errorf("upstream %s: charge: %w", g.Target.Up.Name, err))
		}
	}
	return true, errors.Join(errs...)
}

// Reserved returns the input and output tokens reserved.
func (g *Grant) Reserved() (in, out int64) { return g.in, g.out }

// Counted records the input tokens the provider reported counting for
// g's request, when they are what its limits count (Anthropic's usage:
// input and cache writes): a sample of the learned ratio (units.go).
func (g *Grant) Counted(ctx context.Context, in int64) {
	if g == nil || g.Target.Up.Kind != Anthropic || in <= 0 {
		return
	}
	g.pool.sample(ctx, g.Target, in, g.base, false)
}

// Units returns the request's size as the caller gave it to Acquire.
func (g *Grant) Units() Units { return g.units }

// Refused returns what Judge made of the provider's 429 to g:
// RefusalGeneral when none was judged.
func (g *Grant) Refused() Refusal { return g.refusal }
