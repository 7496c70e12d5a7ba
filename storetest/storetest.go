// Package storetest is sluice's conformance suite: step-table scenarios that
// every sluice.Store must pass with the same answers, to the nanosecond.
//
// A store under test must read the current time from the *clock.Fake the
// suite hands its Factory. Each scenario uses keys unique to the test run
// (with a hash tag, so multi-key scenarios stay in one Redis Cluster slot),
// so the suite may share a store server with other tests and never flushes it.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
)

// Factory returns a store whose time is read from clk. It registers any
// cleanup with t.Cleanup.
type Factory func(t *testing.T, clk *clock.Fake) sluice.Store

// T0 is the instant every scenario starts at: midnight UTC, so that fixed
// windows of a second, minute, hour or day all begin there.
var T0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Run runs every scenario against stores made by newStore.
func Run(t *testing.T, newStore Factory) {
	t.Helper()
	for _, sc := range scenarios() {
		t.Run(sc.name, func(t *testing.T) {
			clk := clock.NewFake(T0)
			store := newStore(t, clk)
			h := &harness{t: t, store: store, clk: clk, tag: uniqueTag()}
			sc.run(h)
		})
	}
}

type scenario struct {
	name string
	run  func(h *harness)
}

// harness drives one scenario.
type harness struct {
	t     *testing.T
	store sluice.Store
	clk   *clock.Fake
	tag   string
}

func uniqueTag() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "{st-" + hex.EncodeToString(b[:]) + "}"
}

// key returns a key unique to this run, in the run's hash slot.
func (h *harness) key(name string) string { return h.tag + ":" + name }

// step is one row of a step table: move the clock, apply op, compare.
type step struct {
	advance time.Duration
	op      sluice.Op
	cost    int64
	lease   string
	want    sluice.Decision // Limit is filled in from the request
	err     error           // wanted error, checked with errors.Is
	note    string
}

// allow is an OpAllow row that expects the given outcome.
func allow(advance time.Duration, cost int64, allowed bool, remaining int64, retry, reset time.Duration) step {
	return step{advance: advance, op: sluice.OpAllow, cost: cost, want: sluice.Decision{Allowed: allowed, Remaining: remaining, RetryAfter: retry, ResetAfter: reset}}
}

func peek(advance time.Duration, cost int64, allowed bool, remaining int64, retry, reset time.Duration) step {
	s := allow(advance, cost, allowed, remaining, retry, reset)
	s.op = sluice.OpPeek
	return s
}

func refund(advance time.Duration, cost int64, remaining int64, reset time.Duration) step {
	return step{advance: advance, op: sluice.OpRefund, cost: cost, want: sluice.Decision{Allowed: true, Remaining: remaining, ResetAfter: reset}}
}

func (h *harness) steps(req sluice.Request, rows []step) {
	h.t.Helper()
	ctx := context.Background()
	for i, s := range rows {
		h.clk.Advance(s.advance)
		r := req
		r.Cost = s.cost
		if s.lease != "" {
			r.Lease = s.lease
		}
		got, err := h.store.Apply(ctx, s.op, r)
		at := time.Duration(h.clk.Now() - T0.UnixNano())
		if s.err != nil {
			if !errors.Is(err, s.err) {
				h.t.Fatalf("step %d (t=%s, %s cost %d %s): error %v, want %v", i, at, s.op, s.cost, s.note, err, s.err)
			}
			continue
		}
		if err != nil {
			h.t.Fatalf("step %d (t=%s, %s cost %d %s): %v", i, at, s.op, s.cost, s.note, err)
		}
		want := s.want
		want.Limit = req.Limit
		// How the store decided (from its state, a cache or a lease) is
		// its own business; the answer is what must agree.
		got.Source = 0
		if got != want {
			h.t.Fatalf("step %d (t=%s, %s cost %d %s):\n got %+v\nwant %+v", i, at, s.op, s.cost, s.note, got, want)
		}
	}
}

const (
	ms = time.Millisecond
	s  = time.Second
)

func scenarios() []scenario {
	var out []scenario
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket} {
		out = append(out, bucketScenarios(a)...)
	}
	out = append(out, fixedWindowScenarios()...)
	out = append(out, calendarScenarios()...)
	out = append(out, slidingCounterScenarios()...)
	out = append(out, slidingLogScenarios()...)
	out = append(out, logSlotScenarios()...)   // logslot.go
	out = append(out, logRefundScenarios()...) // logrefund.go
	out = append(out, concurrencyScenarios()...)
	out = append(out, allowAllScenarios()...)
	out = append(out, errorScenarios()...)
	out = append(out, reserveScenarios()...)      // reserve.go
	out = append(out, extremeScenarios()...)      // extreme.go
	out = append(out, oddIntervalScenarios()...)  // oddinterval.go
	out = append(out, windowRefundScenarios()...) // windowrefund.go
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.FixedWindow, sluice.SlidingWindowCounter, sluice.SlidingWindowLog} {
		out = append(out, longRun(a))
	}
	return out
}

// bucketScenarios: GCRA and the token bucket give the same answers.
// 10/s burst 5: one event every 100ms, five at once.
func bucketScenarios(a sluice.Algorithm) []scenario {
	lim := sluice.Limit{Rate: 10, Period: s, Burst: 5}
	req := func(h *harness) sluice.Request {
		return sluice.Request{Key: h.key("k"), Algorithm: a, Limit: lim}
	}
	return []scenario{
		{a.String() + "/BurstThenSteady", func(h *harness) {
			h.steps(req(h), []step{
				allow(0, 1, true, 4, 0, 100*ms),
				allow(0, 1, true, 3, 0, 200*ms),
				allow(0, 1, true, 2, 0, 300*ms),
				allow(0, 1, true, 1, 0, 400*ms),
				allow(0, 1, true, 0, 0, 500*ms),
				allow(0, 1, false, 0, 100*ms, 500*ms),
				// one nanosecond early is still too early
				allow(100*ms-1, 1, false, 0, 1, 400*ms+1),
				allow(1, 1, true, 0, 0, 500*ms),
				allow(0, 1, false, 0, 100*ms, 500*ms),
				// steady: one every 100ms
				allow(100*ms, 1, true, 0, 0, 500*ms),
				allow(100*ms, 1, true, 0, 0, 500*ms),
				allow(50*ms, 1, false, 0, 50*ms, 450*ms),
				allow(50*ms, 1, true, 0, 0, 500*ms),
			})
		}},
		{a.String() + "/RefillAfterIdle", func(h *harness) {
			h.steps(req(h), []step{
				allow(0, 5, true, 0, 0, 500*ms),
				peek(0, 0, false, 0, 100*ms, 500*ms),
				peek(250*ms, 0, true, 2, 0, 250*ms),
				peek(time.Hour, 0, true, 5, 0, 0),
				allow(0, 1, true, 4, 0, 100*ms),
			})
		}},
		{a.String() + "/Cost", func(h *harness) {
			h.steps(req(h), []step{
				allow(0, 3, true, 2, 0, 300*ms),
				allow(0, 3, false, 2, 100*ms, 300*ms),
				allow(100*ms, 3, true, 0, 0, 500*ms),
				{op: sluice.OpAllow, cost: 6, err: sluice.ErrCostExceedsBurst},
				{op: sluice.OpAllow, cost: -1, err: sluice.ErrInvalidCost},
				{op: sluice.OpAllow, cost: 0, err: sluice.ErrInvalidCost},
			})
		}},
		{a.String() + "/RefundResetPeek", func(h *harness) {
			h.steps(req(h), []step{
				peek(0, 1, true, 5, 0, 0),
				peek(0, 1, true, 5, 0, 0),
				allow(0, 4, true, 1, 0, 400*ms),
				peek(0, 2, false, 1, 100*ms, 400*ms),
				peek(0, 1, true, 1, 0, 400*ms),
				refund(0, 2, 3, 200*ms),
				refund(0, 10, 5, 0), // never beyond full
				allow(0, 5, true, 0, 0, 500*ms),
				{op: sluice.OpReset, want: sluice.Decision{Allowed: true, Remaining: 5}},
				allow(0, 1, true, 4, 0, 100*ms),
			})
		}},
		{a.String() + "/ChargeGoesIntoDebt", func(h *harness) {
			h.steps(req(h), []step{
				allow(0, 5, true, 0, 0, 500*ms),
				{op: sluice.OpCharge, cost: 3, want: sluice.Decision{Allowed: true, Remaining: -3, ResetAfter: 800 * ms}},
				allow(0, 1, false, 0, 400*ms, 800*ms),
				allow(400*ms, 1, true, 0, 0, 500*ms),
			})
		}},
		{a.String() + "/OddInterval", func(h *harness) {
			// 3/s: 333333334ns per event, rounded up; never drifts ahead.
			r := sluice.Request{Key: h.key("odd"), Algorithm: a, Limit: sluice.Limit{Rate: 3, Period: s, Burst: 1}}
			h.steps(r, []step{
				allow(0, 1, true, 0, 0, 333333334),
				allow(0, 1, false, 0, 333333334, 333333334),
				allow(333333333, 1, false, 0, 1, 1),
				allow(1, 1, true, 0, 0, 333333334),
			})
		}},
	}
}

func fixedWindowScenarios() []scenario {
	lim := sluice.Limit{Rate: 3, Period: s}
	return []scenario{
		{"fixed_window/WindowEdges", func(h *harness) {
			r := sluice.Request{Key: h.key("fw"), Algorithm: sluice.FixedWindow, Limit: lim}
			h.steps(r, []step{
				allow(900*ms, 1, true, 2, 0, 100*ms),
				allow(0, 2, true, 0, 0, 100*ms),
				allow(0, 1, false, 0, 100*ms, 100*ms),
				allow(100*ms-1, 1, false, 0, 1, 1),
				allow(1, 1, true, 2, 0, s), // new window at t=1s
				peek(0, 0, true, 2, 0, s),
				refund(0, 1, 3, 0),
				allow(999*ms, 3, true, 0, 0, ms),
				{op: sluice.OpAllow, cost: 4, err: sluice.ErrCostExceedsBurst},
				{op: sluice.OpReset, want: sluice.Decision{Allowed: true, Remaining: 3}},
				allow(0, 1, true, 2, 0, ms),
			})
		}},
		{"fixed_window/AlignedToEpoch", func(h *harness) {
			// 100/min: a window opened at 00:00:30 still ends at 00:01:00.
			r := sluice.Request{Key: h.key("fwm"), Algorithm: sluice.FixedWindow, Limit: sluice.PerMinute(100)}
			h.steps(r, []step{
				allow(30*s, 100, true, 0, 0, 30*s),
				allow(29*s, 1, false, 0, s, s),
				allow(s, 1, true, 99, 0, time.Minute),
			})
		}},
	}
}

func slidingCounterScenarios() []scenario {
	// 10/s. The previous window's count weighs (1s-e)/1s.
	lim := sluice.Limit{Rate: 10, Period: s}
	return []scenario{
		{"sliding_window_counter/Weighted", func(h *harness) {
			r := sluice.Request{Key: h.key("swc"), Algorithm: sluice.SlidingWindowCounter, Limit: lim}
			h.steps(r, []step{
				allow(500*ms, 10, true, 0, 0, 1500*ms), // window [0,1s): 10
				allow(0, 1, false, 0, 600*ms, 1500*ms), // at 1.1s prev weighs 0.9 → 9+1 ≤ 10
				// t=1.2s: prev 10 weighs 0.8 → 8 used, 2 remaining
				allow(700*ms, 1, true, 1, 0, 1800*ms),
				allow(0, 1, true, 0, 0, 1800*ms),
				// curr 2, prev 10·0.8 = 8: full. A cost-1 request needs prev·(1−e) ≤ 7: e ≥ 0.3s.
				allow(0, 1, false, 0, 100*ms, 1800*ms),
				allow(100*ms, 1, true, 0, 0, 1700*ms),
				// t=2.5s: prev = 3, weighs 0.5 → 2 (ceil of 1.5); 8 left
				peek(1200*ms, 0, true, 8, 0, 500*ms),
				refund(0, 0+1, 8, 500*ms),
			})
		}},
		{"sliding_window_counter/Edges", func(h *harness) {
			r := sluice.Request{Key: h.key("swc2"), Algorithm: sluice.SlidingWindowCounter, Limit: sluice.Limit{Rate: 4, Period: s}}
			h.steps(r, []step{
				allow(999*ms, 4, true, 0, 0, 1001*ms),
				// next window starts at 1s; prev 4 weighs 1-e: 1 slot at e ≥ 0.25s
				allow(0, 1, false, 0, 251*ms, 1001*ms),
				allow(251*ms-1, 1, false, 0, 1, 750*ms+1),
				allow(1, 1, true, 0, 0, 1750*ms),
				// the 5s-later key is fresh
				peek(5*s, 4, true, 4, 0, 0),
			})
		}},
	}
}

func slidingLogScenarios() []scenario {
	lim := sluice.Limit{Rate: 3, Period: s}
	return []scenario{
		{"sliding_window_log/Exact", func(h *harness) {
			r := sluice.Request{Key: h.key("swl"), Algorithm: sluice.SlidingWindowLog, Limit: lim}
			h.steps(r, []step{
				allow(0, 1, true, 2, 0, s),
				allow(300*ms, 1, true, 1, 0, s),
				allow(300*ms, 1, true, 0, 0, s),
				allow(300*ms, 1, false, 0, 100*ms, 700*ms),
				allow(100*ms-1, 1, false, 0, 1, 600*ms+1),
				allow(1, 1, true, 0, 0, s),
				// two units at once need the two oldest (0.3s, 0.6s) gone: at 1.6s
				allow(0, 2, false, 0, 600*ms, s),
				allow(600*ms, 2, true, 0, 0, s),
				refund(0, 1, 1, s), // drops one of the newest pair
				peek(0, 1, true, 1, 0, s),
			})
		}},
		{"sliding_window_log/SameInstantMembersAreDistinct", func(h *harness) {
			r := sluice.Request{Key: h.key("swl2"), Algorithm: sluice.SlidingWindowLog, Limit: sluice.Limit{Rate: 5, Period: s}}
			h.steps(r, []step{
				allow(0, 1, true, 4, 0, s),
				allow(0, 1, true, 3, 0, s),
				allow(0, 2, true, 1, 0, s),
				allow(0, 1, true, 0, 0, s),
				allow(0, 1, false, 0, s, s),
				allow(s, 5, true, 0, 0, s),
			})
		}},
	}
}

func concurrencyScenarios() []scenario {
	// Two slots, leases lapse after 10s.
	lim := sluice.Limit{Rate: 2, Period: 10 * s}
	acquire := func(adv time.Duration, lease string, allowed bool, remaining int64, retry, reset time.Duration) step {
		st := allow(adv, 1, allowed, remaining, retry, reset)
		st.lease = lease
		return st
	}
	release := func(lease string, remaining int64, reset time.Duration) step {
		st := refund(0, 1, remaining, reset)
		st.lease = lease
		return st
	}
	return []scenario{
		{"concurrency/Leases", func(h *harness) {
			r := sluice.Request{Key: h.key("conc"), Algorithm: sluice.Concurrency, Limit: lim}
			h.steps(r, []step{
				acquire(0, "a", true, 1, 0, 10*s),
				acquire(s, "b", true, 0, 0, 10*s),
				acquire(0, "c", false, 0, 9*s, 10*s),
				acquire(0, "a", true, 0, 0, 10*s), // renewing a held lease takes no slot
				release("a", 1, 10*s),             // b, taken at 1s, lapses at 11s
				// twice is harmless, and says the lease was not held
				{op: sluice.OpRefund, cost: 1, lease: "a", want: sluice.Decision{Remaining: 1, ResetAfter: 10 * s}},
				acquire(0, "c", true, 0, 0, 10*s),
				// a crashed holder's lease lapses: b at 11s, c at 11s
				acquire(10*s, "d", true, 1, 0, 10*s),
				acquire(0, "e", true, 0, 0, 10*s),
				acquire(0, "f", false, 0, 10*s, 10*s),
			})
		}},
		{"concurrency/ChargeHeldLease", func(h *harness) {
			// A charge to a held lease adds its slots to that lease and
			// renews it, as an acquire renews: they go together.
			r := sluice.Request{Key: h.key("conc-charge"), Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: 3, Period: 10 * s}}
			charge := step{op: sluice.OpCharge, cost: 1, lease: "a", want: sluice.Decision{Allowed: true, Remaining: 1, ResetAfter: 10 * s}}
			charge.advance = 5 * s
			h.steps(r, []step{
				acquire(0, "a", true, 2, 0, 10*s),
				charge,
				acquire(5*s, "b", true, 0, 0, 10*s), // a, charged at 5s, holds 2 until 15s
				acquire(0, "c", false, 0, 5*s, 10*s),
				release("a", 2, 10*s),
				acquire(0, "c", true, 1, 0, 10*s),
			})
		}},
		{"concurrency/Take", func(h *harness) {
			// A take gets what is free, up to its cost, and sets its lease
			// to that: asking again replaces the share, it does not add.
			r := sluice.Request{Key: h.key("conc-take"), Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: 10, Period: 10 * s}}
			take := func(advance time.Duration, lease string, cost, taken, remaining int64, retry, reset time.Duration) step {
				return step{advance: advance, op: sluice.OpTake, cost: cost, lease: lease,
					want: sluice.Decision{Allowed: taken > 0, Taken: taken, Remaining: remaining, RetryAfter: retry, ResetAfter: reset}}
			}
			h.steps(r, []step{
				take(0, "a", 6, 6, 4, 0, 10*s),
				take(s, "b", 6, 4, 0, 0, 10*s),   // partial: what is left
				take(0, "c", 3, 0, 0, 9*s, 10*s), // nothing left: a lapses first, at 10s
				take(s, "a", 2, 2, 4, 0, 10*s),   // a shrinks to 2, renewed to 12s
				take(0, "c", 30, 4, 0, 0, 10*s),  // more than the rate: up to what is free
				take(0, "b", 9, 4, 0, 0, 10*s),   // b keeps its own 4 (8 are the others')
				{op: sluice.OpPeek, cost: 1, lease: "z", want: sluice.Decision{Remaining: 0, RetryAfter: 10 * s, ResetAfter: 10 * s}},
				take(10*s+1, "d", 5, 5, 5, 0, 10*s), // all three lapsed
				release("d", 10, 0),
			})
			// Each request of a batch takes on its own (not all or
			// nothing), in order; a repeated key sees the earlier takes.
			k := h.key("conc-take-batch")
			reqs := []sluice.Request{
				{Key: k, Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: 5, Period: 10 * s}, Cost: 4, Lease: "x"},
				{Key: k, Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: 5, Period: 10 * s}, Cost: 4, Lease: "y"},
				{Key: k, Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: 5, Period: 10 * s}, Cost: 4, Lease: "z"},
			}
			ds, err := h.store.ApplyAll(context.Background(), sluice.OpTake, reqs)
			if err != nil || len(ds) != 3 {
				h.t.Fatalf("take batch: %v %v", ds, err)
			}
			if ds[0].Taken != 4 || ds[1].Taken != 1 || ds[2].Taken != 0 || ds[2].Allowed || !ds[1].Allowed {
				h.t.Fatalf("take batch: taken %d, %d, %d (allowed %v), want 4, 1, 0", ds[0].Taken, ds[1].Taken, ds[2].Taken, ds[2].Allowed)
			}
			// A take is for concurrency only.
			g := sluice.Request{Key: h.key("take-gcra"), Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 5, Period: s}, Cost: 1}
			if _, err := h.store.Apply(context.Background(), sluice.OpTake, g); !errors.Is(err, sluice.ErrInvalidRequest) {
				h.t.Fatalf("take on gcra: %v, want ErrInvalidRequest", err)
			}
		}},
	}
}

func allowAllScenarios() []scenario {
	return []scenario{
		{"AllowAll/AllOrNothing", func(h *harness) {
			ctx := context.Background()
			perSec := sluice.Request{Key: h.key("sec"), Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 10, Period: s}, Cost: 1}
			perMin := sluice.Request{Key: h.key("min"), Algorithm: sluice.FixedWindow, Limit: sluice.Limit{Rate: 3, Period: time.Minute}, Cost: 1}
			for i := range 3 {
				d, ds, err := sluice.AllowAll(ctx, h.store, []sluice.Request{perSec, perMin})
				if err != nil || !d.Allowed || len(ds) != 2 {
					h.t.Fatalf("batch %d: %+v %v", i, d, err)
				}
			}
			d, ds, err := sluice.AllowAll(ctx, h.store, []sluice.Request{perSec, perMin})
			if err != nil {
				h.t.Fatal(err)
			}
			if d.Allowed || !ds[0].Allowed || ds[1].Allowed || d.RetryAfter != time.Minute {
				h.t.Fatalf("4th batch: combined %+v, members %+v", d, ds)
			}
			// the per-second limit was not charged by the denied batch
			if ds[0].Remaining != 7 {
				h.t.Fatalf("denied batch reports per-second remaining %d, want 7 (uncharged)", ds[0].Remaining)
			}
			p, err := h.store.Apply(ctx, sluice.OpPeek, perSec)
			if err != nil || p.Remaining != 7 {
				h.t.Fatalf("per-second peek after denied batch: %+v %v, want remaining 7", p, err)
			}
			// a cost beyond a member's burst fails the batch with nothing charged
			big := perSec
			big.Cost = 11
			if _, err := h.store.ApplyAll(ctx, sluice.OpAllow, []sluice.Request{perMin, big}); !errors.Is(err, sluice.ErrCostExceedsBurst) {
				h.t.Fatalf("oversized member: %v", err)
			}
			// the same key twice in one batch sees its own charge
			twice := sluice.Request{Key: h.key("twice"), Algorithm: sluice.TokenBucket, Limit: sluice.Limit{Rate: 2, Period: s}, Cost: 1}
			if d, _, err := sluice.AllowAll(ctx, h.store, []sluice.Request{twice, twice}); err != nil || !d.Allowed || d.Remaining != 0 {
				h.t.Fatalf("same key twice: %+v %v", d, err)
			}
			if d, _, err := sluice.AllowAll(ctx, h.store, []sluice.Request{twice}); err != nil || d.Allowed {
				h.t.Fatalf("same key after double charge: %+v %v", d, err)
			}
			// mixed algorithms charge together
			lease := sluice.Request{Key: h.key("conc"), Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: 1, Period: time.Minute}, Cost: 1, Lease: "x"}
			log := sluice.Request{Key: h.key("log"), Algorithm: sluice.SlidingWindowLog, Limit: sluice.Limit{Rate: 5, Period: s}, Cost: 2}
			swc := sluice.Request{Key: h.key("swc"), Algorithm: sluice.SlidingWindowCounter, Limit: sluice.Limit{Rate: 5, Period: s}, Cost: 2}
			if d, _, err := sluice.AllowAll(ctx, h.store, []sluice.Request{lease, log, swc}); err != nil || !d.Allowed {
				h.t.Fatalf("mixed batch: %+v %v", d, err)
			}
			other := lease
			other.Lease = "y"
			d, ds, err = sluice.AllowAll(ctx, h.store, []sluice.Request{log, swc, other})
			if err != nil || d.Allowed || !ds[0].Allowed || !ds[1].Allowed || ds[2].Allowed {
				h.t.Fatalf("mixed batch over the lease limit: %+v %+v %v", d, ds, err)
			}
			for _, r := range []sluice.Request{log, swc} {
				if p, err := h.store.Apply(ctx, sluice.OpPeek, r); err != nil || p.Remaining != 3 {
					h.t.Fatalf("%s after denied batch: %+v %v, want remaining 3", r.Algorithm, p, err)
				}
			}
			// Settling with a lease: the first refund batch releases the
			// lease and refunds; a second, with the lease gone, refunds nothing.
			tokens := sluice.Request{Key: h.key("tok"), Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 100, Period: time.Minute}, Cost: 40}
			if _, err := h.store.Apply(ctx, sluice.OpAllow, tokens); err != nil {
				h.t.Fatal(err)
			}
			tokens.Cost = 30
			for i, wantApplied := range []bool{true, false} {
				ds, err := h.store.ApplyAll(ctx, sluice.OpRefund, []sluice.Request{lease, tokens})
				if err != nil || ds[0].Allowed != wantApplied {
					h.t.Fatalf("settle %d: %+v %v, want lease held %v", i, ds, err, wantApplied)
				}
				if p, err := h.store.Apply(ctx, sluice.OpPeek, tokens); err != nil || p.Remaining != 90 {
					h.t.Fatalf("settle %d: tokens %+v %v, want remaining 90 (refunded once)", i, p, err)
				}
			}
		}},
	}
}

func errorScenarios() []scenario {
	return []scenario{
		{"Errors", func(h *harness) {
			ctx := context.Background()
			good := sluice.Request{Key: h.key("e"), Algorithm: sluice.GCRA, Limit: sluice.PerSecond(1), Cost: 1}
			cases := []struct {
				name string
				mod  func(r *sluice.Request)
				want error
			}{
				{"empty key", func(r *sluice.Request) { r.Key = "" }, sluice.ErrInvalidRequest},
				{"no algorithm", func(r *sluice.Request) { r.Algorithm = 0 }, sluice.ErrInvalidRequest},
				{"zero rate", func(r *sluice.Request) { r.Limit.Rate = 0 }, sluice.ErrInvalidLimit},
				{"negative period", func(r *sluice.Request) { r.Limit.Period = -s }, sluice.ErrInvalidLimit},
				{"negative cost", func(r *sluice.Request) { r.Cost = -5 }, sluice.ErrInvalidCost},
				{"lease missing", func(r *sluice.Request) { r.Algorithm = sluice.Concurrency }, sluice.ErrInvalidRequest},
			}
			for _, c := range cases {
				r := good
				c.mod(&r)
				if _, err := h.store.Apply(ctx, sluice.OpAllow, r); !errors.Is(err, c.want) {
					h.t.Errorf("%s: Apply error %v, want %v", c.name, err, c.want)
				}
				if _, err := h.store.ApplyAll(ctx, sluice.OpAllow, []sluice.Request{good, r}); !errors.Is(err, c.want) {
					h.t.Errorf("%s: ApplyAll error %v, want %v", c.name, err, c.want)
				}
			}
			// nothing was charged by the failed batches
			if d, err := h.store.Apply(ctx, sluice.OpPeek, good); err != nil || d.Remaining != 1 {
				h.t.Fatalf("after failed batches: %+v %v", d, err)
			}
		}},
	}
}

// longRun offers twice the rate for a simulated day, one request at a time
// on a fixed beat, and checks that the admitted count is within the limit
// (≤ burst + rate·t + 1) and not far under it (≥ 0.999 of the ideal).
func longRun(a sluice.Algorithm) scenario {
	return scenario{fmt.Sprintf("%s/SimulatedDay", a), func(h *harness) {
		ctx := context.Background()
		lim := sluice.Limit{Rate: 100, Period: time.Hour, Burst: 20}
		if a != sluice.GCRA && a != sluice.TokenBucket {
			lim.Burst = 0
		}
		r := sluice.Request{Key: h.key("day"), Algorithm: a, Limit: lim, Cost: 1}
		const day = 24 * time.Hour
		beat := lim.Period / time.Duration(2*lim.Rate)
		var admitted int64
		for at := time.Duration(0); at <= day; at += beat {
			d, err := h.store.Apply(ctx, sluice.OpAllow, r)
			if err != nil {
				h.t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
			h.clk.Advance(beat)
		}
		ideal := lim.Capacity() + lim.Rate*int64(day/lim.Period)
		lower := float64(ideal) * 0.999
		switch a {
		case sluice.FixedWindow, sluice.SlidingWindowLog:
			// a window admits Rate per Period; the burst is not extra
			lower = float64(lim.Rate*int64(day/lim.Period)) * 0.999
		case sluice.SlidingWindowCounter:
			// The counter's weighted estimate of the previous window
			// admits slightly under Rate per Period under steady
			// overload (2378 of 2400 here).
			lower = float64(lim.Rate*int64(day/lim.Period)) * 0.99
		}
		if admitted > ideal+1 || float64(admitted) < lower {
			h.t.Fatalf("admitted %d over a day, want ≤ %d and ≥ %.0f", admitted, ideal+1, lower)
		}
	}}
}
