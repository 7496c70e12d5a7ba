package storetest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-io/sluice"
)

// reserveScenarios: reservations (sluice.Request.MaxWait), on GCRA and the
// token bucket alike.
func reserveScenarios() []scenario {
	var out []scenario
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket} {
		out = append(out,
			scenario{"Reserve/" + a.String() + "/Burst", func(h *harness) { reserveBurst(h, a) }},
			scenario{"Reserve/" + a.String() + "/RefundReturns", func(h *harness) { reserveRefund(h, a) }},
			scenario{"Reserve/" + a.String() + "/Steps", func(h *harness) { reserveSteps(h, a) }},
			scenario{"Reserve/" + a.String() + "/CancelKeepsLaterSlots", func(h *harness) { reserveCancelStack(h, a) }},
		)
	}
	out = append(out,
		scenario{"Reserve/ApplyAll", reserveBatch},
		scenario{"Reserve/AfterPlainDenial", reserveAfterDenial},
		scenario{"Reserve/CostAboveBurst", reserveAboveBurst},
		scenario{"Reserve/Refused", reserveRefused},
	)
	return out
}

// ReserveCheck is the delay-mode check of issue 15: with 10/s burst 5 and
// a max wait of 1s, 30 simultaneous requests give 5 admitted at once, 10
// admitted with delays of 100ms, 200ms, ... 1s (each within 5ms of that
// ideal; the stores compute them exactly), and 15 denied. It returns the
// delays of the admitted requests, in order.
func ReserveCheck(ctx context.Context, store sluice.Store, req sluice.Request) ([]time.Duration, error) {
	req.Limit, req.Cost, req.MaxWait = sluice.Limit{Rate: 10, Period: time.Second, Burst: 5}, 1, time.Second
	var delays []time.Duration
	for i := range 30 {
		d, err := store.Apply(ctx, sluice.OpAllow, req)
		if err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
		ideal := time.Duration(max(0, i-4)) * 100 * time.Millisecond
		switch {
		case i < 15 && !d.Allowed:
			return nil, fmt.Errorf("request %d denied: %+v", i, d)
		case i < 15 && (d.Delay < ideal-5*time.Millisecond || d.Delay > ideal+5*time.Millisecond):
			return nil, fmt.Errorf("request %d delayed %s, want %s ± 5ms", i, d.Delay, ideal)
		case i >= 15 && d.Allowed:
			return nil, fmt.Errorf("request %d admitted past the max wait: %+v", i, d)
		case i >= 15 && d.RetryAfter != 100*time.Millisecond:
			return nil, fmt.Errorf("request %d: retry after %s, want 100ms (until its wait is 1s)", i, d.RetryAfter)
		}
		if d.Allowed {
			delays = append(delays, d.Delay)
		}
	}
	return delays, nil
}

func reserveBurst(h *harness, a sluice.Algorithm) {
	delays, err := ReserveCheck(context.Background(), h.store, sluice.Request{Key: h.key("burst"), Algorithm: a})
	if err != nil {
		h.t.Fatal(err)
	}
	for i, d := range delays {
		if want := time.Duration(max(0, i-4)) * 100 * ms; d != want {
			h.t.Fatalf("request %d: delay %s, want exactly %s", i, d, want)
		}
	}
}

// reserveRefund: a reservation given back (its client went away) frees
// its place for the next request.
func reserveRefund(h *harness, a sluice.Algorithm) {
	ctx := context.Background()
	req := sluice.Request{Key: h.key("refund"), Algorithm: a, Limit: sluice.Limit{Rate: 10, Period: s, Burst: 5}, Cost: 1, MaxWait: s}
	var last *sluice.Reservation
	for i := range 15 {
		r, err := sluice.ReserveAll(ctx, h.store, []sluice.Request{req})
		if err != nil || !r.Decision.Allowed {
			h.t.Fatalf("reservation %d: %+v %v", i, r, err)
		}
		last = r
	}
	if d, err := h.store.Apply(ctx, sluice.OpPeek, req); err != nil || d.Allowed {
		h.t.Fatalf("a 16th fits before the refund: %+v %v", d, err)
	}
	if err := last.Cancel(ctx); err != nil {
		h.t.Fatal(err)
	}
	if err := last.Cancel(ctx); err != nil { // once only
		h.t.Fatal(err)
	}
	d, err := h.store.Apply(ctx, sluice.OpAllow, req)
	if err != nil || !d.Allowed || d.Delay != s {
		h.t.Fatalf("after the refund: %+v %v, want admitted with delay 1s", d, err)
	}
	if d, err := h.store.Apply(ctx, sluice.OpAllow, req); err != nil || d.Allowed {
		h.t.Fatalf("the refund was given twice: %+v %v", d, err)
	}
}

// reserveSteps: every field of a reservation's decision, as time passes.
// 10/s burst 5, max wait 300ms, costs 1 and 2.
func reserveSteps(h *harness, a sluice.Algorithm) {
	lim := sluice.Limit{Rate: 10, Period: s, Burst: 5}
	req := sluice.Request{Key: h.key("steps"), Algorithm: a, Limit: lim, MaxWait: 300 * ms}
	type row struct {
		advance      time.Duration
		op           sluice.Op
		cost         int64
		allowed      bool
		remaining    int64
		delay, retry time.Duration
		reset        time.Duration
	}
	rows := []row{
		{0, sluice.OpAllow, 5, true, 0, 0, 0, 500 * ms},
		{0, sluice.OpPeek, 1, true, 0, 100 * ms, 0, 500 * ms},
		{0, sluice.OpAllow, 2, true, -2, 200 * ms, 0, 700 * ms},
		{0, sluice.OpAllow, 2, false, -2, 0, 100 * ms, 700 * ms},
		{0, sluice.OpAllow, 1, true, -3, 300 * ms, 0, 800 * ms},
		{50 * ms, sluice.OpAllow, 1, false, -3, 0, 50 * ms, 750 * ms},
		{50 * ms, sluice.OpAllow, 1, true, -3, 300 * ms, 0, 800 * ms},
		{0, sluice.OpRefund, 1, true, -2, 0, 0, 700 * ms},
		{700 * ms, sluice.OpAllow, 1, true, 4, 0, 0, 100 * ms},
	}
	ctx := context.Background()
	for i, rw := range rows {
		h.clk.Advance(rw.advance)
		r := req
		r.Cost = rw.cost
		if rw.op == sluice.OpRefund {
			r.MaxWait = 0
		}
		got, err := h.store.Apply(ctx, rw.op, r)
		if err != nil {
			h.t.Fatalf("row %d: %v", i, err)
		}
		got.Source = 0
		want := sluice.Decision{Allowed: rw.allowed, Limit: lim, Remaining: rw.remaining, Delay: rw.delay, RetryAfter: rw.retry, ResetAfter: rw.reset}
		if rw.op == sluice.OpRefund {
			want.Remaining = rw.remaining
		}
		if got != want {
			h.t.Fatalf("row %d (%s cost %d):\n got %+v\nwant %+v", i, rw.op, rw.cost, got, want)
		}
	}
}

// reserveBatch: a batch is admitted when every member is within its own
// max wait, and waits for the longest; a batch one member denies charges
// nothing and reports the others uncharged. Per-minute limits, so that the
// keys' real-time TTLs in Redis outlast a slow test.
func reserveBatch(h *harness) {
	ctx := context.Background()
	const iv = 6 * s // 10/min
	lim := sluice.Limit{Rate: 10, Period: time.Minute, Burst: 2}
	g := sluice.Request{Key: h.key("g"), Algorithm: sluice.GCRA, Limit: lim, Cost: 1, MaxWait: 5 * iv}
	tb := sluice.Request{Key: h.key("tb"), Algorithm: sluice.TokenBucket, Limit: lim, Cost: 1, MaxWait: 2 * iv}
	plain := sluice.Request{Key: h.key("plain"), Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 100, Period: time.Minute}, Cost: 1}
	if _, err := h.store.Apply(ctx, sluice.OpAllow, sluice.Request{Key: g.Key, Algorithm: sluice.GCRA, Limit: lim, Cost: 2}); err != nil {
		h.t.Fatal(err)
	}
	// g delays one interval, tb none: the batch waits one interval.
	r, err := sluice.ReserveAll(ctx, h.store, []sluice.Request{g, tb, plain})
	if err != nil || !r.Decision.Allowed || r.Decision.Delay != iv || r.Decisions[0].Delay != iv || r.Decisions[1].Delay != 0 || r.Decisions[2].Delay != 0 {
		h.t.Fatalf("first batch: %+v %v", r, err)
	}
	for i, want := range []time.Duration{2 * iv, 3 * iv, 4 * iv} {
		r, err := sluice.ReserveAll(ctx, h.store, []sluice.Request{g, tb, plain})
		if err != nil || !r.Decision.Allowed || r.Decision.Delay != want {
			h.t.Fatalf("batch %d: %+v %v, want delay %s", i, r, err, want)
		}
	}
	// tb's next would wait 3 intervals, past its 2: nothing is charged.
	r, err = sluice.ReserveAll(ctx, h.store, []sluice.Request{g, tb, plain})
	if err != nil || r.Decision.Allowed || r.Decisions[1].Allowed || !r.Decisions[0].Allowed || r.Decisions[0].Delay != 5*iv || r.Decisions[1].RetryAfter != iv {
		h.t.Fatalf("batch past tb's max wait: %+v %v", r, err)
	}
	if err := r.Wait(ctx); !errors.Is(err, sluice.ErrNotReserved) {
		h.t.Fatalf("Wait on a denied reservation: %v", err)
	}
	for _, q := range []sluice.Request{g, plain} {
		d, err := h.store.Apply(ctx, sluice.OpPeek, q)
		if err != nil || !d.Allowed {
			h.t.Fatalf("%s after the denied batch: %+v %v", q.Key, d, err)
		}
		if q.Key == g.Key && d.Delay != 5*iv {
			h.t.Fatalf("g was charged by the denied batch: delay %s, want %s", d.Delay, 5*iv)
		}
		if q.Key == plain.Key && d.Remaining != 96 {
			h.t.Fatalf("plain was charged by the denied batch: remaining %d, want 96", d.Remaining)
		}
	}
	// Cancelling a batch gives back every member.
	r, err = sluice.ReserveAll(ctx, h.store, []sluice.Request{g, plain})
	if err != nil || !r.Decision.Allowed || r.Decision.Delay != 5*iv {
		h.t.Fatalf("g and plain: %+v %v", r, err)
	}
	if err := r.Cancel(ctx); err != nil {
		h.t.Fatal(err)
	}
	if d, err := h.store.Apply(ctx, sluice.OpPeek, g); err != nil || d.Delay != 5*iv {
		h.t.Fatalf("g after the cancelled batch: %+v %v, want delay %s again", d, err, 5*iv)
	}
	if d, err := h.store.Apply(ctx, sluice.OpPeek, plain); err != nil || d.Remaining != 96 {
		h.t.Fatalf("plain after the cancelled batch: %+v %v, want remaining 96 again", d, err)
	}
}

// reserveRefused: a max wait that is negative, too long, or on an
// algorithm that cannot reserve is a bad request, and nothing is charged.
func reserveRefused(h *harness) {
	ctx := context.Background()
	lim := sluice.Limit{Rate: 10, Period: s}
	for _, r := range []sluice.Request{
		{Key: h.key("neg"), Algorithm: sluice.GCRA, Limit: lim, Cost: 1, MaxWait: -ms},
		{Key: h.key("huge"), Algorithm: sluice.GCRA, Limit: lim, Cost: 1, MaxWait: sluice.MaxReserveWait + 1},
		{Key: h.key("fw"), Algorithm: sluice.FixedWindow, Limit: lim, Cost: 1, MaxWait: s},
		{Key: h.key("swc"), Algorithm: sluice.SlidingWindowCounter, Limit: lim, Cost: 1, MaxWait: s},
		{Key: h.key("swl"), Algorithm: sluice.SlidingWindowLog, Limit: lim, Cost: 1, MaxWait: s},
		{Key: h.key("conc"), Algorithm: sluice.Concurrency, Limit: lim, Cost: 1, Lease: "l", MaxWait: s},
	} {
		if _, err := h.store.Apply(ctx, sluice.OpAllow, r); !errors.Is(err, sluice.ErrInvalidRequest) {
			h.t.Fatalf("%s max wait %s: %v, want ErrInvalidRequest", r.Algorithm, r.MaxWait, err)
		}
		if _, err := h.store.ApplyAll(ctx, sluice.OpAllow, []sluice.Request{r}); !errors.Is(err, sluice.ErrInvalidRequest) {
			h.t.Fatalf("batch of %s max wait %s: %v, want ErrInvalidRequest", r.Algorithm, r.MaxWait, err)
		}
	}
}

// reserveAfterDenial: a key denied to a plain request (which the Redis
// store caches) still takes a reservation, and a denied reservation does
// not answer a reservation with a longer max wait.
func reserveAfterDenial(h *harness) {
	ctx := context.Background()
	plain := sluice.Request{Key: h.key("k"), Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 10, Period: s, Burst: 5}, Cost: 1}
	for i := range 6 {
		if d, err := h.store.Apply(ctx, sluice.OpAllow, plain); err != nil || d.Allowed != (i < 5) {
			h.t.Fatalf("plain %d: %+v %v", i, d, err)
		}
	}
	short := plain
	short.MaxWait = 100 * ms
	if d, err := h.store.Apply(ctx, sluice.OpAllow, short); err != nil || !d.Allowed || d.Delay != 100*ms {
		h.t.Fatalf("reservation after a plain denial: %+v %v, want delay 100ms", d, err)
	}
	if d, err := h.store.Apply(ctx, sluice.OpAllow, short); err != nil || d.Allowed || d.RetryAfter != 100*ms {
		h.t.Fatalf("second short reservation: %+v %v, want denied, retry 100ms", d, err)
	}
	long := plain
	long.MaxWait = 200 * ms
	if d, err := h.store.Apply(ctx, sluice.OpAllow, long); err != nil || !d.Allowed || d.Delay != 200*ms {
		h.t.Fatalf("longer reservation after a short one's denial: %+v %v, want delay 200ms", d, err)
	}
}

// reserveAboveBurst: a cost above the burst is held until the rest of it
// has refilled, if that is within the max wait; beyond, it could never be
// admitted and is refused as any cost above the burst.
func reserveAboveBurst(h *harness) {
	ctx := context.Background()
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket} {
		req := sluice.Request{Key: h.key("big-" + a.String()), Algorithm: a, Limit: sluice.Limit{Rate: 10, Period: s, Burst: 5}, Cost: 15, MaxWait: s}
		if d, err := h.store.Apply(ctx, sluice.OpPeek, req); err != nil || !d.Allowed || d.Delay != s {
			h.t.Fatalf("%s: peek of 15: %+v %v, want admitted after 1s", a, d, err)
		}
		if d, err := h.store.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed || d.Delay != s || d.Remaining != -10 {
			h.t.Fatalf("%s: 15 of burst 5: %+v %v, want admitted after 1s, remaining -10", a, d, err)
		}
		req.Cost = 1
		if d, err := h.store.Apply(ctx, sluice.OpAllow, req); err != nil || d.Allowed || d.RetryAfter != 100*ms {
			h.t.Fatalf("%s: after 15: %+v %v, want denied for 100ms", a, d, err)
		}
		req.Cost = 16
		if _, err := h.store.Apply(ctx, sluice.OpAllow, req); !errors.Is(err, sluice.ErrCostExceedsBurst) {
			h.t.Fatalf("%s: 16 with 1s of wait at 10/s burst 5: %v, want ErrCostExceedsBurst", a, err)
		}
	}
}

// reserveCancelStack: a caller who fills the queue (10/s burst 1, max
// wait 1s: 11 reservations) and cancels all but the newest gets nothing
// back, since the newest keeps its time behind them (Reservation.Cancel
// sends Request.ReservedAhead): otherwise the next round would queue 10
// more, its newest acting beside the first round's, and rounds of it would
// stack the whole max wait's capacity on one instant. Cancelled newest
// first, every one comes back.
func reserveCancelStack(h *harness, a sluice.Algorithm) {
	ctx := context.Background()
	req := sluice.Request{Key: h.key("stack"), Algorithm: a, Limit: sluice.Limit{Rate: 10, Period: s, Burst: 1}, Cost: 1, MaxWait: s}
	fill := func() []*sluice.Reservation {
		var rs []*sluice.Reservation
		for range 20 {
			r, err := sluice.ReserveAll(ctx, h.store, []sluice.Request{req})
			if err != nil {
				h.t.Fatal(err)
			}
			if !r.Decision.Allowed {
				break
			}
			rs = append(rs, r)
		}
		return rs
	}
	rs := fill()
	if len(rs) != 11 {
		h.t.Fatalf("%s: %d reservations fill 1s at 10/s burst 1, want 11", a, len(rs))
	}
	for _, r := range rs[:10] {
		if err := r.Cancel(ctx); err != nil {
			h.t.Fatal(err)
		}
	}
	if again := fill(); len(again) != 0 {
		h.t.Fatalf("%s: after cancelling all but the newest, %d more reservations, the last acting at %s beside the kept one at %s; want 0",
			a, len(again), again[len(again)-1].Decision.Delay, rs[10].Decision.Delay)
	}
	req.Key = h.key("lifo")
	rs = fill()
	for i := len(rs) - 1; i >= 0; i-- { // newest first: each is the queue's end when cancelled
		if err := rs[i].Cancel(ctx); err != nil {
			h.t.Fatal(err)
		}
	}
	if again := fill(); len(again) != 11 {
		h.t.Fatalf("%s: after cancelling everything newest first, %d reservations, want 11", a, len(again))
	}
}
