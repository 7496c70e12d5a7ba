package storetest

import (
	"context"
	"errors"
	"fmt"
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
		if a != sluice.Concurrency {
			out = append(out, scenario{"Extreme/" + a.String() + "/EdgeLimits", func(h *harness) { edgeScenario(h, a) }})
		}
	}
	out = append(out, scenario{"Extreme/sliding_window_log/LargeCosts", largeLogCosts})
	out = append(out, scenario{"Extreme/calendar/HugeCharge", hugeCalendarCharge})
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

// hugeCalendarCharge: a calendar day's count stops at algo.MaxCount too,
// alone and in a batch, and the next day starts afresh.
func hugeCalendarCharge(h *harness) {
	ctx := context.Background()
	req := sluice.Request{Key: h.key("cal-huge"), Algorithm: sluice.FixedWindow, Cost: 1,
		Limit: sluice.PerCalendar(10, sluice.Calendar{Unit: sluice.Day, Location: time.UTC})}
	other := req
	other.Key = h.key("cal-huge-other")
	charge := []sluice.Request{req, other}
	for i := range charge {
		charge[i].Cost = math.MaxInt64
	}
	for i := range 3 {
		d, err := h.store.Apply(ctx, sluice.OpCharge, charge[0])
		if err != nil || d.Remaining != 10-algo.MaxCount {
			h.t.Fatalf("charge #%d: %+v %v, want remaining %d", i, d, err, 10-algo.MaxCount)
		}
		ds, err := h.store.ApplyAll(ctx, sluice.OpCharge, charge)
		if err != nil || ds[0].Remaining != 10-algo.MaxCount || ds[1].Remaining != 10-algo.MaxCount {
			h.t.Fatalf("batch charge #%d: %+v %v, want remaining %d", i, ds, err, 10-algo.MaxCount)
		}
	}
	if d, err := h.store.Apply(ctx, sluice.OpAllow, req); err != nil || d.Allowed {
		h.t.Fatalf("after the charges: %+v %v, want denied", d, err)
	}
	h.clk.Advance(24 * time.Hour)
	if d, err := h.store.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed || d.Remaining != 9 {
		h.t.Fatalf("the next day: %+v %v, want admitted with 9 left", d, err)
	}
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
		wantRemaining = algo.CostsIn(lim, lim.Tau()-int64(algo.MaxAhead))
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
	// The same through a batch, which the Redis store runs in its batch
	// script rather than a one-key one.
	other := req
	other.Key = h.key("huge-other")
	for _, r := range []sluice.Request{req, other} {
		if _, err := h.store.Apply(ctx, sluice.OpAllow, r); err != nil {
			h.t.Fatal(err)
		}
	}
	batch := []sluice.Request{req, other}
	for i := range batch {
		batch[i].Cost = math.MaxInt64
		if a == sluice.Concurrency {
			batch[i].Lease = "b"
		}
	}
	for i := range 3 {
		ds, err := h.store.ApplyAll(ctx, sluice.OpCharge, batch)
		if err != nil || len(ds) != 2 || !ds[0].Allowed || !ds[1].Allowed {
			h.t.Fatalf("batch charge #%d: %+v %v", i, ds, err)
		}
		for j, d := range ds {
			if a != sluice.Concurrency && d.Remaining != wantRemaining {
				h.t.Fatalf("batch charge #%d, member %d: remaining %d, want %d", i, j, d.Remaining, wantRemaining)
			}
		}
	}
	for _, r := range []sluice.Request{req, other} {
		if d, err := h.store.Apply(ctx, sluice.OpAllow, r); err != nil || d.Allowed {
			h.t.Fatalf("%s after batch charges: %+v %v, want denied", r.Key, d, err)
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

// edgeLimits are limits at the edges of what Limit.Validate accepts: the
// largest rate, the longest period, a burst that takes 16 periods or a
// year to refill, intervals that round up, a period in odd nanoseconds.
var edgeLimits = []sluice.Limit{
	{Rate: 1 << 40, Period: time.Minute},
	{Rate: 1 << 40, Period: time.Minute, Burst: 1 << 36},
	{Rate: 1, Period: 366 * 24 * time.Hour},
	{Rate: 1, Period: 366 * 24 * time.Hour, Burst: 16},
	{Rate: 3, Period: 366 * 24 * time.Hour},
	{Rate: 8, Period: 104 * 24 * time.Hour, Burst: 5},
	{Rate: 999999937, Period: 1 << 40},
	{Rate: 2, Period: time.Minute, Burst: 1 << 20},
}

// edgeScenario drives every edge limit through one program of operations on
// algorithm a and checks each decision against algo.Apply, the
// specification, to the nanosecond.
//
// Each limit starts a second into a window and the clock moves in whole
// microseconds, the resolution of Redis TIME, on which the scripts'
// doubles are exact. (On nanoseconds, durations past 2^53 ns, 104 days,
// are not: a GCRA key more than 104 days in debt reads back a few
// nanoseconds off.) The key's state is always either seconds from
// expiring or past it, so that a Redis TTL running out in real time, while
// the test clock stands still, changes nothing.
//
// A store that wraps another (it has an Unwrap() sluice.Store method, as
// package lease's and guard's do) decides by its own documented rules, from
// leased chunks for one: of it the program asks only that it answers
// every step without an error the specification does not give.
func edgeScenario(h *harness, a sluice.Algorithm) {
	ctx := context.Background()
	_, wraps := h.store.(interface{ Unwrap() sluice.Store })
	micro := func(d time.Duration) time.Duration { return (d + time.Microsecond - 1).Truncate(time.Microsecond) }
	for li, lim := range edgeLimits {
		if a != sluice.GCRA && a != sluice.TokenBucket {
			lim.Burst = 0
		}
		p := int64(lim.Period)
		h.clk.Advance(time.Duration(p - h.clk.Now()%p + int64(time.Second)))
		base := sluice.Request{Key: h.key(fmt.Sprint("edge", li)), Algorithm: a, Limit: lim}
		c := base.Capacity()
		var st algo.State
		var last sluice.Decision
		step := func(i int, op sluice.Op, cost int64) {
			r := base
			r.Cost = cost
			want, next, wantErr := algo.Apply(op, st, r, h.clk.Now())
			got, err := h.store.Apply(ctx, op, r)
			if (err == nil) != (wantErr == nil) || (err != nil && !sameSentinel(err, wantErr)) {
				h.t.Fatalf("%s step %d (%s cost %d): error %v, want %v", lim, i, op, cost, err, wantErr)
			}
			if err != nil {
				return
			}
			got.Source = 0
			if !wraps && got != want {
				h.t.Fatalf("%s step %d (%s cost %d):\n got %+v\nwant %+v", lim, i, op, cost, got, want)
			}
			if op != sluice.OpPeek && want.Allowed {
				st = next
			}
			last = got
		}
		step(0, sluice.OpAllow, c)
		step(1, sluice.OpAllow, max(1, c/60))
		step(2, sluice.OpPeek, 0)
		h.clk.Advance(max(0, micro(last.RetryAfter)-time.Microsecond))
		step(3, sluice.OpPeek, max(1, c/60))
		h.clk.Advance(micro(last.RetryAfter))
		step(4, sluice.OpAllow, max(1, c/60))
		step(5, sluice.OpAllow, c+1)
		step(6, sluice.OpRefund, max(1, c/3))
		step(7, sluice.OpAllow, max(1, c/2))
		step(8, sluice.OpCharge, c)
		step(9, sluice.OpPeek, 1)
		step(10, sluice.OpRefund, math.MaxInt64)
		step(11, sluice.OpAllow, c)
		h.clk.Advance(2 * lim.Period)
		step(12, sluice.OpAllow, max(1, c-1))
	}
}

// sameSentinel reports whether two errors wrap the same sluice sentinel.
func sameSentinel(a, b error) bool {
	for _, s := range []error{sluice.ErrInvalidRequest, sluice.ErrInvalidLimit, sluice.ErrInvalidCost, sluice.ErrCostExceedsBurst, sluice.ErrUnknownAlgorithm} {
		if errors.Is(b, s) {
			return errors.Is(a, s)
		}
	}
	return false
}
