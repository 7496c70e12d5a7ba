package config_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/redisstore"
	"github.com/sluice-io/sluice/storetest"
)

// A model of NGINX's limit_req (src/http/modules/ngx_http_limit_req_module.c,
// ngx_http_limit_req_handler, _lookup and _account), one key per limit,
// in NGINX's integers: excess in 1/1000 requests, rate in 1/1000 requests
// per second, time in whole milliseconds.

// ngxLimit is one limit_req directive with its zone's rate.
type ngxLimit struct {
	rate  int64 // ctx->rate: rate * 1000 / scale
	burst int64 // limit->burst: burst * 1000
	delay int64 // limit->delay: delay * 1000; nodelay: NGX_MAX_INT_T_VALUE / 1000 * 1000
}

// ngxNode is a key's state in a zone.
type ngxNode struct {
	excess, last int64
}

// ngxModel is the limits of one location, in order, and their nodes.
type ngxModel struct {
	limits []ngxLimit
	nodes  []*ngxNode
}

// The outcomes of a request.
const (
	ngxPassed = iota
	ngxDelayed
	ngxRejected
)

// elapsed is lookup's and account's ms since the node's last update.
func ngxElapsed(now, last int64) int64 {
	ms := now - last
	if ms < -60000 {
		return 1
	}
	return max(ms, 0)
}

// request runs one request at now (ms) through the location's limits and
// returns its outcome and delay in ms.
func (m *ngxModel) request(now int64) (int, int64) {
	last := len(m.limits) - 1
	var excess int64
	pending := make([]bool, len(m.limits)) // ctx->node set: looked up, not accounted
	// ngx_http_limit_req_handler's loop over ngx_http_limit_req_lookup.
	n := 0
	for ; n <= last; n++ {
		l, node := m.limits[n], m.nodes[n]
		account := n == last
		if node == nil {
			// A new node: excess 0; not yet accounted, its last is 0.
			excess = 0
			node = &ngxNode{}
			m.nodes[n] = node
			if account {
				node.last = now
				break
			}
			pending[n] = true
			continue
		}
		ms := ngxElapsed(now, node.last)
		excess = max(node.excess-l.rate*ms/1000+1000, 0)
		if excess > l.burst {
			return ngxRejected, 0 // NGX_BUSY: no node changes
		}
		if account {
			node.excess = excess
			if ms != 0 {
				node.last = now
			}
			break
		}
		pending[n] = true
	}
	// ngx_http_limit_req_account.
	var maxDelay int64
	if l := m.limits[last]; excess > l.delay {
		maxDelay = (excess - l.delay) * 1000 / l.rate
	}
	for i := last - 1; i >= 0; i-- {
		if !pending[i] {
			continue
		}
		l, node := m.limits[i], m.nodes[i]
		ms := ngxElapsed(now, node.last)
		e := max(node.excess-l.rate*ms/1000+1000, 0)
		if ms != 0 {
			node.last = now
		}
		node.excess = e
		if e <= l.delay {
			continue
		}
		maxDelay = max(maxDelay, (e-l.delay)*1000/l.rate)
	}
	if maxDelay == 0 {
		return ngxPassed, 0
	}
	return ngxDelayed, maxDelay
}

// ngxConf is one limit_req in nginx.conf's words; burst and delay 0 mean
// left out.
type ngxConf struct {
	rate         string
	burst, delay int64
	nodelay      bool
}

// model is c in NGINX's units.
func (c ngxConf) model() ngxLimit {
	var n, scale int64
	var unit string
	if _, err := fmt.Sscanf(strings.Replace(c.rate, "r/", " ", 1), "%d %s", &n, &unit); err != nil {
		panic(err)
	}
	scale = 1
	if unit == "m" {
		scale = 60
	}
	l := ngxLimit{rate: n * 1000 / scale, burst: c.burst * 1000, delay: c.delay * 1000}
	if c.nodelay {
		l.delay = math.MaxInt64 / 1000 * 1000
	}
	return l
}

// yaml is c as a policy's nginx: section.
func (c ngxConf) yaml() string {
	s := "{rate: " + c.rate
	if c.burst > 0 {
		s += fmt.Sprintf(", burst: %d", c.burst)
	}
	if c.delay > 0 {
		s += fmt.Sprintf(", delay: %d", c.delay)
	}
	if c.nodelay {
		s += ", nodelay: true"
	}
	return s + "}"
}

func (c ngxConf) String() string {
	s := "rate=" + c.rate
	if c.burst > 0 {
		s += fmt.Sprintf(" burst=%d", c.burst)
	}
	if c.delay > 0 {
		s += fmt.Sprintf(" delay=%d", c.delay)
	}
	if c.nodelay {
		s += " nodelay"
	}
	return s
}

// sluiceSide decides requests of a tier of nginx: policies on a store,
// the way internal/server does: each policy's Reservation, all of them in
// one ApplyAll (one Apply for a single policy), held by the combined
// Delay.
type sluiceSide struct {
	store    sluice.Store
	clk      *clock.Fake
	policies []*config.Policy
	prefix   string
}

func newSluiceSide(t *testing.T, store sluice.Store, clk *clock.Fake, prefix string, confs []ngxConf) *sluiceSide {
	t.Helper()
	var doc strings.Builder
	doc.WriteString("policies:\n")
	for i, c := range confs {
		fmt.Fprintf(&doc, "  p%d: {nginx: %s}\n", i, c.yaml())
	}
	cfg, err := config.Parse("nginx.yaml", []byte(doc.String()))
	if err != nil {
		t.Fatal(err)
	}
	s := &sluiceSide{store: store, clk: clk, prefix: prefix}
	for i := range confs {
		s.policies = append(s.policies, cfg.Policies[fmt.Sprintf("p%d", i)])
	}
	return s
}

// request decides a request at t after storetest.T0.
func (s *sluiceSide) request(t *testing.T, at time.Duration) (int, time.Duration) {
	t.Helper()
	s.clk.Set(storetest.T0.Add(at))
	reqs := make([]sluice.Request, len(s.policies))
	for i, p := range s.policies {
		l, w := p.Reservation(p.Limit)
		reqs[i] = sluice.Request{Key: fmt.Sprintf("%s:%s", s.prefix, p.Name), Algorithm: p.Algorithm, Limit: l, Cost: 1, MaxWait: w}
	}
	var d sluice.Decision
	if len(reqs) == 1 {
		var err error
		if d, err = s.store.Apply(context.Background(), sluice.OpAllow, reqs[0]); err != nil {
			t.Fatal(err)
		}
	} else {
		ds, err := s.store.ApplyAll(context.Background(), sluice.OpAllow, reqs)
		if err != nil {
			t.Fatal(err)
		}
		d = sluice.Combine(ds)
	}
	switch {
	case !d.Allowed:
		return ngxRejected, 0
	case d.Delay == 0:
		return ngxPassed, 0
	}
	return ngxDelayed, d.Delay
}

// outcomeName names the outcomes in failures.
var outcomeName = []string{"passed", "delayed", "rejected"}

// compare replays arrivals (ms after T0) on NGINX's model and on s and
// fails at the first request where they differ: outcome, or hold time
// (NGINX's whole milliseconds, rounded down, against sluice's
// nanoseconds: within 1 ms).
func compare(t *testing.T, confs []ngxConf, s *sluiceSide, arrivals []int64) (counts [3]int) {
	t.Helper()
	m := &ngxModel{nodes: make([]*ngxNode, len(confs))}
	for _, c := range confs {
		m.limits = append(m.limits, c.model())
	}
	const base = 1_700_000_000_000 // ngx_current_msec is far from 0
	for i, at := range arrivals {
		out, ms := m.request(base + at)
		got, d := s.request(t, time.Duration(at)*time.Millisecond)
		if out == ngxPassed && got == ngxDelayed && d < time.Millisecond {
			got = ngxPassed // NGINX's hold, in whole ms rounded down, is 0: it passes
		}
		if got != out || (d-time.Duration(ms)*time.Millisecond).Abs() >= time.Millisecond {
			t.Fatalf("%v: request %d at %dms: NGINX %s %dms, sluice %s %s (arrivals %v)", confs, i, at, outcomeName[out], ms, outcomeName[got], d, arrivals[:i+1])
		}
		counts[out]++
	}
	return counts
}

// simultaneous is n arrivals at one instant.
func simultaneous(n int) []int64 { return make([]int64, n) }

// stream is n arrivals every gap ms.
func stream(n int, gap int64) []int64 {
	a := make([]int64, n)
	for i := range a {
		a[i] = int64(i) * gap
	}
	return a
}

// TestNGINXEquivalents is docs/API.md's table: each NGINX limit_req
// config and its sluice equivalent give NGINX's counts (checked against
// the model too), on memory.
func TestNGINXEquivalents(t *testing.T) {
	for _, row := range []struct {
		conf     ngxConf
		arrivals []int64
		want     [3]int // passed, delayed, rejected
	}{
		{ngxConf{rate: "10r/s", burst: 5, delay: 2}, simultaneous(30), [3]int{3, 3, 24}},
		{ngxConf{rate: "10r/s", burst: 5, nodelay: true}, simultaneous(30), [3]int{6, 0, 24}},
		{ngxConf{rate: "10r/s", burst: 15, delay: 5}, simultaneous(30), [3]int{6, 10, 14}},
		{ngxConf{rate: "10r/s", burst: 5}, simultaneous(30), [3]int{1, 5, 24}},
		{ngxConf{rate: "10r/s"}, simultaneous(30), [3]int{1, 0, 29}},
		{ngxConf{rate: "10r/s", burst: 15, delay: 5}, stream(30, 50), [3]int{11, 19, 0}},
		{ngxConf{rate: "10r/s", burst: 15, delay: 5}, stream(40, 50), [3]int{11, 24, 5}},
		{ngxConf{rate: "30r/m", burst: 3, delay: 1}, simultaneous(10), [3]int{2, 2, 6}},
		{ngxConf{rate: "3r/s", burst: 5, nodelay: true}, simultaneous(30), [3]int{6, 0, 24}},
		{ngxConf{rate: "10r/m", burst: 1}, simultaneous(10), [3]int{1, 1, 8}},
	} {
		t.Run(row.conf.String(), func(t *testing.T) {
			clk := clock.NewFake(storetest.T0)
			store, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			s := newSluiceSide(t, store, clk, "k", []ngxConf{row.conf})
			if got := compare(t, []ngxConf{row.conf}, s, row.arrivals); got != row.want {
				t.Fatalf("passed/delayed/rejected %v, want %v", got, row.want)
			}
		})
	}
}

// TestNGINXEquivalentForms: every sluice form docs/API.md's table gives
// for a row decides random arrivals as that row's NGINX config does.
func TestNGINXEquivalentForms(t *testing.T) {
	cfg, err := config.Parse("d.yaml", []byte(`policies:
  d2: {limit: 10/s burst 5, delay: 2}
  d2w: {limit: 10/s burst 3, max_wait: 300ms}
  nod: {limit: 10/s burst 6}
  d5: {limit: 10/s burst 15, delay: 5}
  d5w: {limit: 10/s burst 6, max_wait: 1s}
  d0: {limit: 10/s burst 5, delay: 0}
  d0w: {limit: 10/s burst 1, max_wait: 500ms}
  none: {limit: 10/s burst 1}
  min: {limit: 30/min burst 2, max_wait: 4s}
  rmn: {nginx: {rate: 10r/m, burst: 2, delay: 1}}
`))
	if err != nil {
		t.Fatal(err)
	}
	for name, conf := range map[string]ngxConf{
		"d2":   {rate: "10r/s", burst: 5, delay: 2},
		"d2w":  {rate: "10r/s", burst: 5, delay: 2},
		"nod":  {rate: "10r/s", burst: 5, nodelay: true},
		"d5":   {rate: "10r/s", burst: 15, delay: 5},
		"d5w":  {rate: "10r/s", burst: 15, delay: 5},
		"d0":   {rate: "10r/s", burst: 5},
		"d0w":  {rate: "10r/s", burst: 5},
		"none": {rate: "10r/s"},
		"min":  {rate: "30r/m", burst: 3, delay: 1},
		"rmn":  {rate: "10r/m", burst: 2, delay: 1},
	} {
		clk := clock.NewFake(storetest.T0)
		store, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		s := &sluiceSide{store: store, clk: clk, prefix: name, policies: []*config.Policy{cfg.Policies[name]}}
		rng := rand.New(rand.NewPCG(7, uint64(len(name))))
		step, interval := int64(1), int64(100)
		if strings.HasSuffix(conf.rate, "r/m") {
			step, interval = 1000, 6
		}
		a := randomArrivals(rng, 200, interval)
		for i := range a {
			a[i] *= step
		}
		compare(t, []ngxConf{conf}, s, a)
	}
}

// exactRates are NGINX rates and the grid of arrivals on which NGINX's
// arithmetic is exact: whole milliseconds for rates per second, whole
// seconds for most per minute (NGINX rounds each update's refill down to
// 1/1000 request); per-minute rates also exercise NGINX's rounding of the
// rate to 1/1000 requests per second (10r/m is 166/1000 per second).
var exactRates = []struct {
	rate string
	ms   int64 // the arrival grid
	int  int64 // the interval in ms, to scale the gaps
}{
	{"1r/s", 1, 1000}, {"2r/s", 1, 500}, {"4r/s", 1, 250}, {"5r/s", 1, 200}, {"8r/s", 1, 125},
	{"10r/s", 1, 100}, {"20r/s", 1, 50}, {"25r/s", 1, 40}, {"50r/s", 1, 20}, {"100r/s", 1, 10},
	{"200r/s", 1, 5}, {"1000r/s", 1, 1},
	{"30r/m", 1000, 2000}, {"60r/m", 1, 1000}, {"120r/m", 1, 500}, {"600r/m", 1, 100},
	// Intervals of fractional nanoseconds (NGINXLimit): holds in whole ms
	// rounded down; per minute at whole seconds.
	{"3r/s", 1, 333}, {"7r/s", 1, 142}, {"10r/m", 1000, 6000}, {"7r/m", 1000, 8571},
}

// randomArrivals is n arrivals on a grid of step ms, their gaps drawn
// around interval ms: simultaneous runs, faster and slower than the rate,
// and idle pauses.
func randomArrivals(rng *rand.Rand, n int, interval int64) []int64 {
	a := make([]int64, n)
	var at int64
	for i := range a {
		switch rng.IntN(6) {
		case 0: // simultaneous
		case 1:
			at += rng.Int64N(interval/2 + 1)
		case 2, 3:
			at += rng.Int64N(2*interval + 1)
		case 4:
			at += interval
		case 5:
			at += rng.Int64N(20*interval + 1)
		}
		a[i] = at
	}
	return a
}

// must is the first of two results.
func must(a, _ int64) int64 { return a }

// randomConf draws a limit_req whose holds fit sluice's MaxMaxWait, its
// rate's interval at least minInterval ms.
func randomConf(rng *rand.Rand, minInterval int64) ngxConf {
	r := exactRates[rng.IntN(len(exactRates))]
	for r.int < minInterval {
		r = exactRates[rng.IntN(len(exactRates))]
	}
	for {
		c := ngxConf{rate: r.rate}
		if rng.IntN(6) > 0 {
			c.burst = 1 + rng.Int64N(20)
		}
		switch rng.IntN(4) {
		case 0:
		case 1:
			c.nodelay = true
		default:
			c.delay = 1 + rng.Int64N(c.burst+3)
		}
		hold := (c.burst - min(c.delay, c.burst)) * r.int
		if c.nodelay || time.Duration(hold)*time.Millisecond <= config.MaxMaxWait {
			return c
		}
	}
}

// rateOf is exactRates' entry for rate.
func rateOf(rate string) (step, interval int64) {
	for _, r := range exactRates {
		if r.rate == rate {
			return r.ms, r.int
		}
	}
	panic(rate)
}

// differential replays random configs and arrival patterns, one limit or
// two at once (a tier's policies, NGINX's limit_req directives of one
// location), on a store, drawing rates of intervals of at least
// minInterval ms.
func differential(t *testing.T, store sluice.Store, clk *clock.Fake, prefix string, seed uint64, rounds, n int, minInterval int64) {
	rng := rand.New(rand.NewPCG(seed, 28))
	var total [3]int
	for round := range rounds {
		var confs []ngxConf
		for range 1 + rng.IntN(2) {
			c := randomConf(rng, minInterval)
			confs = append(confs, c)
		}
		// Arrivals on the coarsest grid of the limits, their gaps around
		// the first one's interval.
		var step int64 = 1
		for _, c := range confs {
			step = max(step, must(rateOf(c.rate)))
		}
		_, interval := rateOf(confs[0].rate)
		a := randomArrivals(rng, n, max(interval/step, 1))
		for i := range a {
			a[i] *= step
		}
		s := newSluiceSide(t, store, clk, fmt.Sprintf("%s:%d", prefix, round), confs)
		got := compare(t, confs, s, a)
		for i := range got {
			total[i] += got[i]
		}
	}
	t.Logf("seed %d: %d passed, %d delayed, %d rejected, all as NGINX", seed, total[0], total[1], total[2])
	if total[0] == 0 || total[1] == 0 || total[2] == 0 {
		t.Fatalf("outcomes %v: the patterns miss a case", total)
	}
}

// TestNGINXDifferential: sluice's nginx: policies decide random arrival
// patterns exactly as NGINX's limit_req does, outcome by outcome and
// hold by hold, on the memory store.
func TestNGINXDifferential(t *testing.T) {
	for seed := range uint64(4) {
		clk := clock.NewFake(storetest.T0)
		store, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		differential(t, store, clk, "k", seed, 100, 60, 0)
	}
}

// TestNGINXDifferentialRedis: the same on a real Redis, whose Lua scripts
// decide (on the store's injected clock). Redis expires keys on its own
// clock, which runs on while the injected one stands still, so a key living
// a few milliseconds (1000r/s) could vanish under a starved CPU: only rates
// of a second or slower are drawn here (their keys live at least 1 s; the
// per-minute rates keep the fractional intervals). In production the
// scripts read Redis's TIME and the two clocks are one.
func TestNGINXDifferentialRedis(t *testing.T) {
	clk := clock.NewFake(storetest.T0)
	store, err := redisstore.New(context.Background(), redisstore.Options{URL: redistest.Standalone(t).URL(), Clock: clk, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	differential(t, store, clk, redistest.Prefix(t), 1, 40, 40, 1000)
}
