package storetest

import (
	"context"
	"time"

	"github.com/sluice-io/sluice"
)

// The scenarios of a fixed window's refund that names its charge's window
// (Request.ReservedAhead: the charge's ResetAfter less the time since): a
// refund is given back only to the window its charge was taken from, and
// dropped once that window has ended, so that a refund landing after the
// window turned never frees the next window's capacity.

func windowRefundScenarios() []scenario {
	return []scenario{
		{"fixed_window/RefundNamesItsWindow", windowRefundPeriodic},
		{"fixed_window/RefundNamesItsWindowCalendar", windowRefundCalendar},
		{"fixed_window/RefundNamesItsWindowBatch", windowRefundBatch},
	}
}

// aheadStep is one row of a window refund table: move the clock, apply op
// with cost and ReservedAhead ahead, expect remaining and reset (allowed).
type aheadStep struct {
	advance   time.Duration
	op        sluice.Op
	cost      int64
	ahead     time.Duration
	remaining int64
	reset     time.Duration
}

func (h *harness) aheadSteps(req sluice.Request, rows []aheadStep) {
	h.t.Helper()
	ctx := context.Background()
	for i, s := range rows {
		h.clk.Advance(s.advance)
		r := req
		r.Cost, r.ReservedAhead = s.cost, s.ahead
		got, err := h.store.Apply(ctx, s.op, r)
		if err != nil {
			h.t.Fatalf("step %d (t=%s, %s cost %d ahead %s): %v", i, h.since(), s.op, s.cost, s.ahead, err)
		}
		got.Source = 0
		want := sluice.Decision{Allowed: true, Limit: req.Limit, Remaining: s.remaining, ResetAfter: s.reset}
		if got != want {
			h.t.Fatalf("step %d (t=%s, %s cost %d ahead %s):\n got %+v\nwant %+v", i, h.since(), s.op, s.cost, s.ahead, got, want)
		}
	}
}

// windowRefundPeriodic: 10 a minute. Charges at 30s (ResetAfter 30s) are
// refunded within their window, however late in it; a refund of the
// minute's charges that lands at 60.1s, in the next window, is dropped:
// without the check it would give the second minute 3 units back that it
// never charged (remaining 10 where 7 were left). The window is named
// with up to half a window's error: now + ReservedAhead past the current
// window's middle (90s at 60.1s) is this window, at or before it an
// earlier one. Windows of a minute: Redis expires a key by its own clock,
// and real time passes between steps on a loaded machine.
func windowRefundPeriodic(h *harness) {
	r := sluice.Request{Key: h.key("winrefund"), Algorithm: sluice.FixedWindow, Limit: sluice.PerMinute(10)}
	h.aheadSteps(r, []aheadStep{
		{30 * s, sluice.OpAllow, 4, 0, 6, 30 * s},
		// 29.9s later, 100ms before the window's end: its own window
		{29*s + 900*ms, sluice.OpRefund, 1, 100 * ms, 7, 100 * ms},
		// an estimate 10s late (a slow reply): still this window
		{0, sluice.OpRefund, 1, 10 * s, 8, 100 * ms},
		// t=60.1s: the next window, 3 charged in it
		{200 * ms, sluice.OpAllow, 3, 0, 7, 59*s + 900*ms},
		// the first window's refund, its charge's window ended (ResetAfter
		// 30s less 30.1s: at least 1ns): dropped
		{0, sluice.OpRefund, 2, 1, 7, 59*s + 900*ms},
		// an estimate of the first window's end 29.9s late reaches 90s,
		// the window's middle: still the first window, dropped
		{0, sluice.OpRefund, 2, 29*s + 900*ms, 7, 59*s + 900*ms},
		// 1ns past the middle names this window: given back
		{0, sluice.OpRefund, 2, 29*s + 900*ms + 1, 9, 59*s + 900*ms},
		// this window's charge refunded with its own ResetAfter
		{0, sluice.OpRefund, 1, 59*s + 900*ms, 10, 0},
	})
}

// windowRefundCalendar: 10 a day in Berlin, on 2026-03-29, a day of 23
// hours (it ends at 22:00 UTC). The day's charge at 12:00 local is
// refunded within the day, and dropped once the refund lands in the next
// day, 500ms after local midnight, whatever the next day was charged.
func windowRefundCalendar(h *harness) {
	b, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		h.t.Fatal(err)
	}
	r := sluice.Request{Key: h.key("winrefund-cal"), Algorithm: sluice.FixedWindow, Limit: sluice.PerCalendar(10, sluice.Calendar{Unit: sluice.Day, Location: b})}
	noon := time.Date(2026, 3, 29, 12, 0, 0, 0, b)
	end := time.Date(2026, 3, 30, 0, 0, 0, 0, b)
	nextEnd := time.Date(2026, 3, 31, 0, 0, 0, 0, b)
	h.clk.Set(noon)
	h.aheadSteps(r, []aheadStep{
		{0, sluice.OpAllow, 5, 0, 5, end.Sub(noon)},
		// a second before midnight, the day's own refund
		{end.Sub(noon) - s, sluice.OpRefund, 1, s, 6, s},
		// 500ms into the next day: 2 charged there
		{s + 500*ms, sluice.OpAllow, 2, 0, 8, nextEnd.Sub(end) - 500*ms},
		// yesterday's refund (its ResetAfter passed): dropped
		{0, sluice.OpRefund, 3, 1, 8, nextEnd.Sub(end) - 500*ms},
		// today's: given back
		{0, sluice.OpRefund, 2, nextEnd.Sub(end) - 500*ms, 10, 0},
	})
}

// windowRefundBatch: one refund batch of two windows' keys and a GCRA
// key, in ApplyAll: the key whose charge's window ended keeps its count,
// the other window and the bucket are given back.
func windowRefundBatch(h *harness) {
	ctx := context.Background()
	lim := sluice.PerMinute(10)
	old := sluice.Request{Key: h.key("winbatch-old"), Algorithm: sluice.FixedWindow, Limit: lim, Cost: 3}
	cur := sluice.Request{Key: h.key("winbatch-cur"), Algorithm: sluice.FixedWindow, Limit: lim, Cost: 3}
	bucket := sluice.Request{Key: h.key("winbatch-gcra"), Algorithm: sluice.GCRA, Limit: lim, Cost: 3}
	h.clk.Advance(30 * s)
	if _, err := h.store.ApplyAll(ctx, sluice.OpAllow, []sluice.Request{old}); err != nil {
		h.t.Fatal(err)
	}
	h.clk.Advance(30*s + 100*ms) // t=60.1s
	if _, err := h.store.ApplyAll(ctx, sluice.OpAllow, []sluice.Request{old, cur, bucket}); err != nil {
		h.t.Fatal(err)
	}
	o, c, g := old, cur, bucket
	o.ReservedAhead = 1             // the first window's charge
	c.ReservedAhead = 59*s + 900*ms // this window's
	g.Cost = 3                      // a bucket's plain refund
	ds, err := h.store.ApplyAll(ctx, sluice.OpRefund, []sluice.Request{o, c, g})
	if err != nil {
		h.t.Fatal(err)
	}
	if ds[0].Remaining != 7 || ds[1].Remaining != 10 || ds[2].Remaining != 10 {
		h.t.Fatalf("remaining after the refund batch %d, %d, %d; want 7 (the ended window's refund dropped), 10, 10",
			ds[0].Remaining, ds[1].Remaining, ds[2].Remaining)
	}
}
