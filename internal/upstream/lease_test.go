package upstream

import (
	"context"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-io/sluice"
)

// countingStore counts the calls that reach a store.
type countingStore struct {
	sluice.Store
	calls atomic.Int64
}

func (s *countingStore) Apply(ctx context.Context, op sluice.Op, req sluice.Request) (sluice.Decision, error) {
	s.calls.Add(1)
	return s.Store.Apply(ctx, op, req)
}

func (s *countingStore) ApplyAll(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	s.calls.Add(1)
	return s.Store.ApplyAll(ctx, op, reqs)
}

// hotPool is one upstream model of rpm and tpm per minute, its store
// counting calls; lease sets routing.lease.
func hotPool(t *testing.T, rpm, tpm int64, lease bool) (*Pool, *countingStore, func(time.Duration)) {
	t.Helper()
	defs := []Def{{Name: "a", Kind: OpenAI, BaseURL: "http://a.example/v1", KeyEnv: "A", Models: map[string]Limits{"m-a": {RPM: rpm, TPM: tpm}}}}
	routes := map[string][]Target{"m": {{Upstream: "a", Model: "m-a"}}}
	p, clk := testPool(t, defs, routes, Routing{Lease: &lease})
	cs := &countingStore{Store: p.store}
	p.store = cs
	return p, cs, func(d time.Duration) { clk.Advance(d) }
}

// TestLeaseWhereHot: a steady hot stream on one upstream model is served
// from chunks, one store call per slot or so instead of one per request,
// and admits as many as without leases; a cold one goes to the store each
// time.
func TestLeaseWhereHot(t *testing.T) {
	run := func(lease bool, every time.Duration, n int) (admitted int, calls int64) {
		p, cs, advance := hotPool(t, 60_000, 0, lease)
		r := p.Route("m", "")
		for range n {
			advance(every)
			g, _, err := p.Acquire(context.Background(), r, false, 10, 10, nil)
			if err != nil {
				t.Fatal(err)
			}
			if g != nil {
				admitted++
			}
		}
		return admitted, cs.calls.Load()
	}
	// 500 a second against 1000: 150 a slot of 300 ms.
	hot, hotCalls := run(true, 2*time.Millisecond, 3000)
	base, baseCalls := run(false, 2*time.Millisecond, 3000)
	t.Logf("hot: %d admitted in %d store calls; without leases %d in %d", hot, hotCalls, base, baseCalls)
	if hot != base || hot != 3000 {
		t.Fatalf("admitted %d with leases, %d without, of 3000", hot, base)
	}
	if hotCalls*20 > baseCalls {
		t.Fatalf("%d store calls with leases, %d without: want 20 times fewer", hotCalls, baseCalls)
	}
	// One a second: never hot.
	_, coldCalls := run(true, time.Second, 50)
	if coldCalls != 50 {
		t.Fatalf("a cold stream made %d store calls for 50 requests", coldCalls)
	}
}

// TestLeaseNeverPastWindow: bursts and lulls with random reservations, so
// that chunks are taken, used up, stranded and fetched again: no window of
// one period ever holds more than the limits, as without leases.
func TestLeaseNeverPastWindow(t *testing.T) {
	const rpm, tpm = 3000, 200_000
	p, _, advance := hotPool(t, rpm, tpm, true)
	r := p.Route("m", "")
	rng := rand.New(rand.NewPCG(3, 4))
	type sent struct {
		at  time.Duration
		tok int64
	}
	var log []sent
	var now time.Duration
	for i := range 40_000 {
		step := time.Duration(rng.IntN(4)) * time.Millisecond // a burst
		if (i/2000)%2 == 1 {
			step = time.Duration(rng.IntN(60)) * time.Millisecond // a lull
		}
		advance(step)
		now += step
		in, out := int64(1+rng.IntN(50)), int64(rng.IntN(100))
		g, _, err := p.Acquire(context.Background(), r, false, in, out, nil)
		if err != nil {
			t.Fatal(err)
		}
		if g != nil {
			log = append(log, sent{now, in + out})
		}
	}
	var n, tok int64
	j := 0
	for i := range log {
		n++
		tok += log[i].tok
		for log[i].at-log[j].at >= time.Minute {
			n--
			tok -= log[j].tok
			j++
		}
		if n > rpm || tok > tpm {
			t.Fatalf("%d requests and %d tokens in the minute to %s, limits %d and %d", n, tok, log[i].at, rpm, tpm)
		}
	}
	if len(log) < 4*rpm {
		t.Fatalf("only %d admitted over %s", len(log), now)
	}
	if n := testutil.ToFloat64(p.metrics.chunks.WithLabelValues("a", "m-a")); n < 100 {
		t.Fatalf("%v chunks leased", n)
	}
}

// TestLeaseEndsWithItsSlot: a chunk is handed out up to the end of the
// slot the store stamped it in, and not a nanosecond past it: the next
// request after goes to the store.
func TestLeaseEndsWithItsSlot(t *testing.T) {
	p, cs, advance := hotPool(t, 600_000, 0, true)
	r := p.Route("m", "")
	acquire := func() {
		if g, _, err := p.Acquire(context.Background(), r, false, 1, 1, nil); g == nil || err != nil {
			t.Fatal("refused", err)
		}
	}
	for range 2000 { // 1 a millisecond: hot
		advance(time.Millisecond)
		acquire()
	}
	now := p.now().UnixNano()
	slot := int64(p.slot())
	end := (now/slot + 1) * slot
	advance(time.Duration(end - now - 1))
	before := cs.calls.Load()
	acquire()
	if cs.calls.Load() != before {
		t.Fatal("the chunk's slot has a nanosecond left, yet the store was asked")
	}
	advance(1)
	acquire()
	if cs.calls.Load() == before {
		t.Fatal("a chunk was used past its slot's end")
	}
}

// TestLeaseDroppedOnCooldown: a provider 429 drops this replica's chunk
// with the cooldown: nothing more is sent until the cooldown ends.
func TestLeaseDroppedOnCooldown(t *testing.T) {
	p, _, advance := hotPool(t, 600_000, 0, true)
	r := p.Route("m", "")
	var g *Grant
	for range 1000 {
		advance(time.Millisecond)
		g, _, _ = p.Acquire(context.Background(), r, false, 1, 1, nil)
	}
	// Until a chunk holds something.
	held := func() bool {
		c := &g.Target.chunk
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.left[0] > 0 && p.now().Before(c.until)
	}
	for i := 0; !held(); i++ {
		if i == 1000 {
			t.Fatal("no chunk held")
		}
		advance(time.Millisecond)
		g, _, _ = p.Acquire(context.Background(), r, false, 1, 1, nil)
	}
	p.Observe(context.Background(), g, 429, http.Header{"Retry-After": {"2"}}, time.Millisecond)
	if g2, wait, _ := p.Acquire(context.Background(), r, false, 1, 1, nil); g2 != nil || wait != 2*time.Second {
		t.Fatalf("after a 429: grant %v, wait %s", g2, wait)
	}
}

// TestLeaseDroppedOnLowerLimit: a provider reporting a limit below the
// one a chunk was taken under drops the chunk.
func TestLeaseDroppedOnLowerLimit(t *testing.T) {
	p, _, advance := hotPool(t, 600_000, 0, true)
	r := p.Route("m", "")
	var g *Grant
	held := func() bool {
		c := &g.Target.chunk
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.left[0] > 0 && p.now().Before(c.until)
	}
	for i := 0; g == nil || !held(); i++ {
		if i == 3000 {
			t.Fatal("no chunk held")
		}
		advance(time.Millisecond)
		g, _, _ = p.Acquire(context.Background(), r, false, 1, 1, nil)
	}
	p.Observe(context.Background(), g, 200, http.Header{"X-Ratelimit-Limit-Requests": {"1000"}}, time.Millisecond)
	if held() {
		t.Fatal("a chunk taken under 600000 rpm kept after the provider said 1000")
	}
}

// TestLeaseSaturatedNoExtraCalls: a hot upstream model offered twice its
// limit for 150 s, held full from the first half minute on. With leases it
// admits what it admits without (a chunk taken at the end of a slot would
// strand its units, and a chunk refused at every request would double the
// store calls: a replica refused one asks for none until the next slot),
// in fewer store calls.
func TestLeaseSaturatedNoExtraCalls(t *testing.T) {
	run := func(lease bool) (admitted int, calls int64) {
		p, cs, advance := hotPool(t, 6000, 0, lease) // 100 a second
		r := p.Route("m", "")
		for range 30_000 { // 200 a second
			advance(5 * time.Millisecond)
			if g, _, _ := p.Acquire(context.Background(), r, false, 1, 1, nil); g != nil {
				admitted++
			}
		}
		return admitted, cs.calls.Load()
	}
	base, baseCalls := run(false)
	got, calls := run(true)
	t.Logf("without leases %d admitted in %d store calls; with leases %d in %d", base, baseCalls, got, calls)
	if got < base*99/100 {
		t.Fatalf("leases admitted %d, without %d", got, base)
	}
	// Half the run is unsaturated, served from chunks; in the other half
	// every admission is a call, as without leases (a refused chunk and a
	// call each would make it 25000).
	if calls*2 > baseCalls {
		t.Fatalf("leases took %d store calls, without %d: want at most half", calls, baseCalls)
	}
}
