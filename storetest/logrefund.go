package storetest

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-io/sluice"
)

// The scenarios of a sliding window log's refund by age
// (Request.AdmittedAgo): it takes units from the newest runs stamped at or
// before now − AdmittedAgo (rounded up to its slot with a Granularity),
// never from a later admission's.

func logRefundScenarios() []scenario {
	return []scenario{
		{"sliding_window_log/RefundByAge", logRefundByAge},
		{"sliding_window_log/RefundByAgeGranularity", logRefundByAgeSlots},
		{"sliding_window_log/RefundByAgeBatch", logRefundByAgeBatch},
		{"sliding_window_log/RefundByAgeErrors", logRefundByAgeErrors},
	}
}

// ageStep is one row of a refund-by-age table: move the clock, apply op
// with cost and AdmittedAgo ago, expect remaining and reset (allowed).
type ageStep struct {
	advance   time.Duration
	op        sluice.Op
	cost      int64
	ago       time.Duration
	remaining int64
	reset     time.Duration
}

func (h *harness) ageSteps(req sluice.Request, rows []ageStep) {
	h.t.Helper()
	ctx := context.Background()
	for i, s := range rows {
		h.clk.Advance(s.advance)
		r := req
		r.Cost, r.AdmittedAgo = s.cost, s.ago
		got, err := h.store.Apply(ctx, s.op, r)
		if err != nil {
			h.t.Fatalf("step %d (t=%s, %s cost %d ago %s): %v", i, h.since(), s.op, s.cost, s.ago, err)
		}
		got.Source = 0
		want := sluice.Decision{Allowed: true, Limit: req.Limit, Remaining: s.remaining, ResetAfter: s.reset}
		if got != want {
			h.t.Fatalf("step %d (t=%s, %s cost %d ago %s):\n got %+v\nwant %+v", i, h.since(), s.op, s.cost, s.ago, got, want)
		}
	}
}

// logRefundByAge: 10 per second, exact. Runs of 2 at 5ms, 2 at 10ms and
// 3 at 30ms. A refund of 1 at T=20ms takes it from the 10ms run, the
// newest at or before T: not from the later 30ms run (which a newest-first
// refund takes), nor from the 5ms one. The timeline after the 5ms and
// 10ms runs slide out tells which run lost it.
func logRefundByAge(h *harness) {
	r := sluice.Request{Key: h.key("ageexact"), Algorithm: sluice.SlidingWindowLog, Limit: sluice.Limit{Rate: 10, Period: s}}
	h.ageSteps(r, []ageStep{
		{5 * ms, sluice.OpAllow, 2, 0, 8, s},
		{5 * ms, sluice.OpAllow, 2, 0, 6, s},
		{20 * ms, sluice.OpAllow, 3, 0, 3, s},
		// t=40ms: T = 20ms
		{10 * ms, sluice.OpRefund, 1, 20 * ms, 4, 990 * ms},
		// T = 9ms: the 5ms run loses 1, the 10ms run is after T
		{0, sluice.OpRefund, 1, 31 * ms, 5, 990 * ms},
		// T = 10ms exactly: the 10ms run (1 left) and then the 5ms one (1 left)
		// give 2; a cost of 3 finds no more at or before T
		{0, sluice.OpRefund, 3, 30 * ms, 7, 990 * ms},
		// nothing is left at or before T: the 30ms run is untouched
		{0, sluice.OpRefund, 3, 11 * ms, 7, 990 * ms},
		// T = 30ms takes from the 30ms run again
		{0, sluice.OpRefund, 1, 10 * ms, 8, 990 * ms},
		// t=1.01s: the old runs are gone whatever they held; 3 remain
		{970 * ms, sluice.OpPeek, 0, 0, 8, 20 * ms},
		{19 * ms, sluice.OpPeek, 0, 0, 8, ms},
		{ms, sluice.OpPeek, 0, 0, 10, 0},
	})
	// An age past Period + Granularity reaches no unit the log counts. A
	// key of its own, a minute long: Redis expires a log's key by its own
	// clock, a period after its newest run, and a second of real time can
	// pass between two steps on a loaded machine.
	m := sluice.Request{Key: h.key("ageexact-min"), Algorithm: sluice.SlidingWindowLog, Limit: sluice.Limit{Rate: 10, Period: time.Minute}}
	h.ageSteps(m, []ageStep{
		{0, sluice.OpAllow, 4, 0, 6, time.Minute},
		{time.Minute - 1, sluice.OpRefund, 4, time.Duration(1 << 62), 6, 1},
		{0, sluice.OpRefund, 4, time.Minute, 6, 1},
		{0, sluice.OpRefund, 1, time.Minute - 1, 7, 1},
	})
}

// logRefundByAgeSlots: 10 per second in 100ms slots, from T0 (a slot
// boundary). An admission at 30ms is stamped 100ms; its refund at 250ms,
// 220ms after it, finds its run because T = 30ms is rounded up to 100ms.
// T = 100ms on the boundary stays there; 1ns later it is the next slot.
func logRefundByAgeSlots(h *harness) {
	r := sluice.Request{Key: h.key("ageslot"), Algorithm: sluice.SlidingWindowLog, Limit: sluice.Limit{Rate: 10, Period: s, Granularity: 100 * ms}}
	h.ageSteps(r, []ageStep{
		{30 * ms, sluice.OpAllow, 2, 0, 8, 1070 * ms},
		{40 * ms, sluice.OpAllow, 1, 0, 7, 1030 * ms}, // same slot
		{60 * ms, sluice.OpAllow, 3, 0, 4, 1070 * ms}, // t=130ms: stamped 200ms
		// t=250ms: 220ms after the 30ms admission
		{120 * ms, sluice.OpRefund, 2, 220 * ms, 6, 950 * ms},
		// T = 100ms, a boundary: the 100ms run's last unit, no more
		{0, sluice.OpRefund, 2, 150 * ms, 7, 950 * ms},
		// T = 100ms + 1ns rounds up to 200ms: the 200ms run
		{0, sluice.OpRefund, 1, 150*ms - 1, 8, 950 * ms},
		// t=1.1s: the 200ms run holds 2
		{850 * ms, sluice.OpPeek, 0, 0, 8, 100 * ms},
		{100 * ms, sluice.OpPeek, 0, 0, 10, 0},
	})
}

// logRefundByAgeBatch refunds three logs and a GCRA key in one ApplyAll:
// a by age (exact), b newest first, c by age with 20ms slots, d plainly.
// Each was admitted 2 at 10ms and 3 at 30ms (c's stamps: 20ms and 40ms);
// the refund of 2 at 45ms, 35ms after the first, takes the first
// admission's units from a and c, the second's from b.
func logRefundByAgeBatch(h *harness) {
	ctx := context.Background()
	lim := sluice.Limit{Rate: 10, Period: s}
	slot := lim
	slot.Granularity = 20 * ms // stamps 20ms and 40ms
	reqs := []sluice.Request{
		{Key: h.key("agebatch-a"), Algorithm: sluice.SlidingWindowLog, Limit: lim},
		{Key: h.key("agebatch-b"), Algorithm: sluice.SlidingWindowLog, Limit: lim},
		{Key: h.key("agebatch-c"), Algorithm: sluice.SlidingWindowLog, Limit: slot},
		{Key: h.key("agebatch-d"), Algorithm: sluice.GCRA, Limit: lim},
	}
	batch := func(op sluice.Op, cost int64, ago []time.Duration) []sluice.Decision {
		h.t.Helper()
		rs := append([]sluice.Request(nil), reqs...)
		for i := range rs {
			rs[i].Cost = cost
			if ago != nil {
				rs[i].AdmittedAgo = ago[i]
			}
		}
		ds, err := h.store.ApplyAll(ctx, op, rs)
		if err != nil {
			h.t.Fatalf("t=%s: %s: %v", h.since(), op, err)
		}
		return ds
	}
	h.clk.Advance(10 * ms)
	batch(sluice.OpAllow, 2, nil)
	h.clk.Advance(20 * ms)
	batch(sluice.OpAllow, 3, nil)
	h.clk.Advance(15 * ms)
	// t=45ms: the 10ms admission is 35ms old; a by its age, b newest
	// first, c by its age (T = 10ms rounds up to its 20ms stamp), d plain
	ds := batch(sluice.OpRefund, 2, []time.Duration{35 * ms, 0, 35 * ms, 0})
	for i, want := range []int64{7, 7, 7, 7} {
		if ds[i].Remaining != want || !ds[i].Allowed {
			h.t.Fatalf("key %d: refund %+v, want remaining %d", i, ds[i], want)
		}
	}
	// t=1.02s: the first admission slid out; in a and c the refund took
	// it, in b 2 of the later 3
	h.clk.Advance(975 * ms)
	ds = batch(sluice.OpPeek, 0, nil)
	for i, want := range []int64{7, 9, 7} {
		if ds[i].Remaining != want {
			h.t.Fatalf("key %d at t=%s: %+v, want remaining %d", i, h.since(), ds[i], want)
		}
	}
}

// logRefundByAgeErrors: a negative AdmittedAgo, one on another algorithm
// or on another op than a refund is an invalid request, alone and in a
// batch, and the batch does nothing.
func logRefundByAgeErrors(h *harness) {
	ctx := context.Background()
	good := sluice.Request{Key: h.key("agebad"), Algorithm: sluice.SlidingWindowLog, Limit: sluice.Limit{Rate: 5, Period: s}, Cost: 1}
	if _, err := h.store.Apply(ctx, sluice.OpAllow, good); err != nil {
		h.t.Fatal(err)
	}
	cases := []struct {
		name string
		op   sluice.Op
		mod  func(r *sluice.Request)
	}{
		{"negative", sluice.OpRefund, func(r *sluice.Request) { r.AdmittedAgo = -1 }},
		{"gcra", sluice.OpRefund, func(r *sluice.Request) { r.AdmittedAgo, r.Algorithm = ms, sluice.GCRA }},
		{"sliding counter", sluice.OpRefund, func(r *sluice.Request) { r.AdmittedAgo, r.Algorithm = ms, sluice.SlidingWindowCounter }},
		{"allow", sluice.OpAllow, func(r *sluice.Request) { r.AdmittedAgo = ms }},
		{"peek", sluice.OpPeek, func(r *sluice.Request) { r.AdmittedAgo = ms }},
		{"charge", sluice.OpCharge, func(r *sluice.Request) { r.AdmittedAgo = ms }},
	}
	for _, c := range cases {
		r := good
		c.mod(&r)
		if _, err := h.store.Apply(ctx, c.op, r); !errors.Is(err, sluice.ErrInvalidRequest) {
			h.t.Errorf("%s: Apply error %v, want %v", c.name, err, sluice.ErrInvalidRequest)
		}
		other := good
		other.Key = h.key("agebad-other")
		if _, err := h.store.ApplyAll(ctx, c.op, []sluice.Request{other, r}); !errors.Is(err, sluice.ErrInvalidRequest) {
			h.t.Errorf("%s: ApplyAll error %v, want %v", c.name, err, sluice.ErrInvalidRequest)
		}
	}
	// the failed calls changed nothing: one unit is still held
	good.Cost = 0
	if d, err := h.store.Apply(ctx, sluice.OpPeek, good); err != nil || d.Remaining != 4 {
		h.t.Fatalf("after failed calls: %+v %v", d, err)
	}
	other := good
	other.Key = h.key("agebad-other")
	if d, err := h.store.Apply(ctx, sluice.OpPeek, other); err != nil || d.Remaining != 5 {
		h.t.Fatalf("after failed batches, the other key: %+v %v", d, err)
	}
}
