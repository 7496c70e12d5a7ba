package storetest

import (
	"context"
	"time"

	"github.com/sluice-io/sluice"
)

// oddLimits have emission intervals that are not whole nanoseconds (7/s is
// one event every 142,857,142.86 ns): the interval is rounded up, and the
// burst's refill time (tau) must be burst × that rounded interval, not the
// burst's exact refill time rounded once, else the last event of a full
// burst finds tau a few nanoseconds short and is denied. Their intervals
// are long (over 100ms): a Redis key's TTL is its state's life in real
// milliseconds while the suite's clock stands still between steps, so a
// short-lived key could expire under a slow test and read as full.
var oddLimits = []sluice.Limit{
	sluice.PerSecond(7),
	sluice.PerMinute(3),
	sluice.PerMinute(7),
	{Rate: 3, Period: time.Second, Burst: 5},
	{Rate: 11, Period: time.Hour, Burst: 4},
	{Rate: 13, Period: 7 * time.Second, Burst: 9},
}

// largeOddLimits have a burst so large that Tau, the burst × the interval
// rounded up, holds a few events more than the burst: a fresh key still
// reports the burst, not more.
var largeOddLimits = []sluice.Limit{
	{Rate: 3, Period: time.Second, Burst: 1_000_000_000},
	{Rate: 7_000_000, Period: time.Second, Burst: 1 << 40},
}

// oddIntervalScenarios: GCRA and the token bucket give a limit with an odd
// interval its full burst at once, and no event more than the burst and
// one per interval after it.
func oddIntervalScenarios() []scenario {
	var out []scenario
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket} {
		out = append(out,
			scenario{a.String() + "/OddIntervalFullBurst", func(h *harness) { oddFullBurst(h, a) }},
			scenario{a.String() + "/OddIntervalNoExtra", func(h *harness) { oddNoExtra(h, a) }},
		)
	}
	return out
}

// drain admits cost-1 requests on req until one is denied and returns how
// many were admitted, failing past max.
func (h *harness) drain(req sluice.Request, max int64) int64 {
	h.t.Helper()
	req.Cost = 1
	var n int64
	for ; n <= max; n++ {
		d, err := h.store.Apply(context.Background(), sluice.OpAllow, req)
		if err != nil {
			h.t.Fatalf("%s %s: %v", req.Algorithm, req.Limit, err)
		}
		if !d.Allowed {
			return n
		}
	}
	return n
}

// oddFullBurst: a fresh key reports its whole burst left and admits it,
// one at a time and in one request.
func oddFullBurst(h *harness, a sluice.Algorithm) {
	ctx := context.Background()
	for i, l := range oddLimits {
		req := sluice.Request{Key: h.key("odd-burst-" + string(rune('a'+i))), Algorithm: a, Limit: l, Cost: 1}
		d, err := h.store.Apply(ctx, sluice.OpPeek, req)
		if err != nil || d.Remaining != l.Capacity() {
			h.t.Fatalf("%s: a fresh key: %+v %v, want %d remaining", l, d, err, l.Capacity())
		}
		if n := h.drain(req, 2*l.Capacity()); n != l.Capacity() {
			h.t.Fatalf("%s: a fresh key admitted %d at once, want its burst %d", l, n, l.Capacity())
		}
	}
	for i, l := range append(oddLimits, largeOddLimits...) {
		req := sluice.Request{Key: h.key("odd-whole-" + string(rune('a'+i))), Algorithm: a, Limit: l, Cost: 1}
		d, err := h.store.Apply(ctx, sluice.OpPeek, req)
		if err != nil || d.Remaining != l.Capacity() {
			h.t.Fatalf("%s: a fresh key: %+v %v, want %d remaining", l, d, err, l.Capacity())
		}
		// (A cost of c takes c × Period ÷ Rate rounded up once, under c
		// rounded intervals: for a burst this large, Tau then leaves an
		// event or two after the whole burst in one request.)
		req.Cost = l.Capacity()
		if d, err := h.store.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed || d.Remaining != 0 && i < len(oddLimits) {
			h.t.Fatalf("%s: a fresh key, the whole burst in one request: %+v %v", l, d, err)
		}
	}
}

// oddNoExtra: once the burst is spent, one event comes back per (rounded)
// interval, none a nanosecond early; after a full refill the key holds
// its burst again, not one more.
func oddNoExtra(h *harness, a sluice.Algorithm) {
	for i, l := range oddLimits {
		req := sluice.Request{Key: h.key("odd-extra-" + string(rune('a'+i))), Algorithm: a, Limit: l, Cost: 1}
		if n := h.drain(req, 2*l.Capacity()); n != l.Capacity() {
			h.t.Fatalf("%s: burst %d, want %d", l, n, l.Capacity())
		}
		iv := time.Duration(l.Interval())
		for k := range 5 {
			h.clk.Advance(iv - 1)
			if n := h.drain(req, 1); n != 0 {
				h.t.Fatalf("%s: interval %d: admitted %d a nanosecond before the interval ended", l, k, n)
			}
			h.clk.Advance(1)
			if n := h.drain(req, 2); n != 1 {
				h.t.Fatalf("%s: interval %d: admitted %d when the interval ended, want 1", l, k, n)
			}
		}
		// Idle for twice the burst's refill time: the burst, not one more.
		h.clk.Advance(2 * time.Duration(l.Capacity()) * iv)
		if n := h.drain(req, 2*l.Capacity()); n != l.Capacity() {
			h.t.Fatalf("%s: after a full refill admitted %d, want the burst %d", l, n, l.Capacity())
		}
		// Over one period from empty: at most the rate, within one.
		h.clk.Advance(l.Period)
		if n := h.drain(req, 2*l.Capacity()+l.Rate); n > min(l.Rate, l.Capacity()) {
			h.t.Fatalf("%s: a period after the burst was spent, admitted %d, more than %d", l, n, min(l.Rate, l.Capacity()))
		}
	}
}
