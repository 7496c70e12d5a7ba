package storetest

import (
	"context"
	"math"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
)

// extremeScenarios: costs far beyond any limit, as OpCharge and OpRefund
// take them (the gateway charges what an upstream reports used). A key
// charged such a cost stays in debt, whatever the store: its state is
// capped at algo.MaxAhead ahead of now (GCRA, token bucket) or at
// algo.MaxCount (the counting algorithms) rather than wrapping around to
// a full bucket, or being written in a form a Redis script cannot read
// back.
func extremeScenarios() []scenario {
	var out []scenario
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.FixedWindow, sluice.SlidingWindowCounter, sluice.SlidingWindowLog, sluice.Concurrency} {
		out = append(out, scenario{"Extreme/" + a.String() + "/HugeCharge", func(h *harness) { hugeCharge(h, a) }})
	}
	out = append(out, scenario{"Extreme/sliding_window_log/LargeCosts", largeLogCosts})
	return out
}

// largeLogCosts: a sliding log of 2^40 a minute takes costs of 2^39 (one
// run of units per instant, in memory as in Redis), refunds across runs and
// frees the units of an instant when it slides out.
func largeLogCosts(h *harness) {
	r := sluice.Request{Key: h.key("swl-large"), Algorithm: sluice.SlidingWindowLog, Limit: sluice.Limit{Rate: 1 << 40, Period: time.Minute}}
	h.steps(r, []step{
		allow(0, 1<<39, true, 1<<39, 0, time.Minute),
		allow(1, 1<<39-1, true, 1, 0, time.Minute),
		allow(0, 2, false, 1, time.Minute-1, time.Minute),
		refund(0, 1<<38, 1<<38+1, time.Minute),
		allow(time.Minute-1, 1, true, 1<<40-1<<38, 0, time.Minute),
	})
}

// hugeCharge: 10/s (burst 5 for the buckets); one admission, then charges
// of 2^53+1, 2^62 and MaxInt64, three times each. The key stays denied,
// with Remaining as the caps make it, no store fails, and the key comes
// back when the state the caps allow has passed: the window for the
// counting algorithms, or a refund for the buckets.
func hugeCharge(h *harness, a sluice.Algorithm) {
	ctx := context.Background()
	lim := sluice.Limit{Rate: 10, Period: s}
	if sluice.Reserves(a) {
		lim.Burst = 5
	}
	req := sluice.Request{Key: h.key("huge"), Algorithm: a, Limit: lim, Cost: 1, Lease: "a"}
	if d, err := h.store.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed {
		h.t.Fatalf("first request: %+v %v", d, err)
	}
	var wantRemaining int64
	switch a {
	case sluice.GCRA, sluice.TokenBucket:
		wantRemaining = algo.CostsIn(lim, lim.CostInterval(lim.Capacity())-int64(algo.MaxAhead))
	case sluice.FixedWindow, sluice.SlidingWindowCounter:
		wantRemaining = lim.Rate - algo.MaxCount
	case sluice.SlidingWindowLog:
		wantRemaining = 0 // the log keeps at most Rate entries
	}
	for _, cost := range []int64{1<<53 + 1, 1 << 62, math.MaxInt64} {
		for i := range 3 {
			c := req
			c.Cost = cost
			if a == sluice.Concurrency {
				c.Lease = "b"
			}
			d, err := h.store.Apply(ctx, sluice.OpCharge, c)
			if err != nil || !d.Allowed || d.Remaining > 0 {
				h.t.Fatalf("charge %d #%d: %+v %v, want charged into debt", cost, i, d, err)
			}
			if d, err := h.store.Apply(ctx, sluice.OpAllow, req); err != nil || d.Allowed || d.RetryAfter <= 0 {
				h.t.Fatalf("request after charge %d #%d: %+v %v, want denied", cost, i, d, err)
			}
			if a != sluice.Concurrency && d.Remaining != wantRemaining {
				h.t.Fatalf("charge %d #%d: remaining %d, want %d", cost, i, d.Remaining, wantRemaining)
			}
		}
	}
	switch a {
	case sluice.GCRA, sluice.TokenBucket:
		h.clk.Advance(24 * time.Hour)
		d, err := h.store.Apply(ctx, sluice.OpPeek, req)
		if err != nil || d.Allowed || d.ResetAfter != algo.MaxAhead-24*time.Hour {
			h.t.Fatalf("a day later: %+v %v, want denied until %s after the charges", d, err, algo.MaxAhead)
		}
		r := req
		r.Cost = math.MaxInt64
		if d, err := h.store.Apply(ctx, sluice.OpRefund, r); err != nil || d.Remaining != lim.Capacity() {
			h.t.Fatalf("refund %d: %+v %v, want a full bucket", r.Cost, d, err)
		}
	case sluice.Concurrency:
		h.clk.Advance(lim.Period) // the charged leases lapse
	default:
		h.clk.Advance(2 * lim.Period) // the windows the charges counted in have passed
	}
	if d, err := h.store.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed {
		h.t.Fatalf("after the debt: %+v %v, want admitted", d, err)
	}
}
