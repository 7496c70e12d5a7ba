package storetest

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
	"github.com/sluice-io/sluice/clock"
)

// The scenarios of a sliding window log with a Limit.Granularity: every
// admission is stamped at the end of its slot (the time rounded up to a
// multiple of the granularity since the Unix epoch), so a unit frees at
// that stamp + Period, not earlier.

func logSlotScenarios() []scenario {
	return []scenario{
		{"sliding_window_log/GranularityRoundsUp", logSlotRoundsUp},
		{"sliding_window_log/GranularityEpochAligned", logSlotEpochAligned},
		{"sliding_window_log/GranularityDropped", logSlotDropped},
		{"sliding_window_log/GranularityRandomArrivals", logSlotRandomArrivals},
		{"sliding_window_log/GranularityMatchesAlgo", logSlotMatchesAlgo},
		{"sliding_window_log/GranularityErrors", logSlotErrors},
	}
}

// logSlotRoundsUp: 2 per second in 100ms slots, from T0 (a slot boundary).
// Units admitted at 30ms and 70ms are both stamped 100ms and free at 1.1s;
// an exact log would admit again at 1.03s.
func logSlotRoundsUp(h *harness) {
	lim := sluice.Limit{Rate: 2, Period: s, Granularity: 100 * ms}
	r := sluice.Request{Key: h.key("slot"), Algorithm: sluice.SlidingWindowLog, Limit: lim}
	charge := func(advance time.Duration, remaining int64, reset time.Duration) step {
		return step{advance: advance, op: sluice.OpCharge, cost: 1, want: sluice.Decision{Allowed: true, Remaining: remaining, ResetAfter: reset}}
	}
	h.steps(r, []step{
		allow(30*ms, 1, true, 1, 0, 1070*ms),
		allow(40*ms, 1, true, 0, 0, 1030*ms), // t=70ms, same slot: stamp 100ms
		allow(0, 1, false, 0, 1030*ms, 1030*ms),
		// t=1.03s: the unit admitted at 30ms counts until its stamp + 1s
		allow(960*ms, 1, false, 0, 70*ms, 70*ms),
		peek(70*ms-1, 1, false, 0, 1, 1),
		// t=1.1s, a slot boundary: both units are gone, and a unit admitted
		// on a boundary is stamped there
		allow(1, 1, true, 1, 0, s),
		// t=1.1s+1ns: the next slot, stamp 1.2s
		allow(1, 1, true, 0, 0, 1100*ms-1),
		refund(0, 1, 1, s-1), // drops the newest unit, stamped 1.2s
		charge(0, 0, 1100*ms-1),
		peek(0, 1, false, 0, s-1, 1100*ms-1),
		// t=2.1s: the 1.1s unit is gone; a unit admitted now is stamped 2.1s
		allow(s-1, 1, true, 0, 0, s),
		allow(0, 1, false, 0, 100*ms, s),
		// t=2.2s: the charged unit (1.2s) is gone, the 2.1s one is not
		allow(100*ms, 2, false, 1, 900*ms, 900*ms),
	})
}

// logSlotEpochAligned: 7ms slots do not divide a second; they are aligned
// to the Unix epoch, not to the second. T0 is a multiple of 7ms; a second
// later is 6ms into a slot, which ends 1ms later.
func logSlotEpochAligned(h *harness) {
	const g = 7 * ms
	lim := sluice.Limit{Rate: 1, Period: 70 * ms, Granularity: g}
	r := sluice.Request{Key: h.key("slot7"), Algorithm: sluice.SlidingWindowLog, Limit: lim}
	start := T0.Add(s).UnixNano()
	left := g - time.Duration(start%int64(g)) // from start to its slot's end
	if left == g {
		h.t.Fatalf("T0+1s is a multiple of %s: the scenario tests nothing", g)
	}
	h.steps(r, []step{
		allow(s+1, 1, true, 0, 0, left-1+70*ms),
		allow(0, 1, false, 0, left-1+70*ms, left-1+70*ms),
		peek(left-1+70*ms-1, 1, false, 0, 1, 1),
		peek(1, 1, true, 1, 0, 0),
	})
}

// logSlotDropped: a key whose limit loses its granularity keeps its
// stamps, and a unit admitted behind the newest stamp joins that run, so
// the log stays ascending (the oldest unit frees first).
func logSlotDropped(h *harness) {
	lim := sluice.Limit{Rate: 3, Period: s, Granularity: 100 * ms}
	r := sluice.Request{Key: h.key("slotdrop"), Algorithm: sluice.SlidingWindowLog, Limit: lim}
	h.steps(r, []step{
		allow(10*ms, 1, true, 2, 0, 1090*ms), // stamped 100ms
	})
	r.Limit.Granularity = 0
	h.steps(r, []step{
		allow(10*ms, 1, true, 1, 0, 1080*ms), // t=20ms: joins the 100ms run
		allow(200*ms, 1, true, 0, 0, s),      // t=220ms: exact
		allow(0, 1, false, 0, 880*ms, s),
		refund(0, 2, 2, 880*ms), // the 220ms unit and one of the 100ms run
	})
}

// logSlotRandomArrivals offers random costs at random gaps for three
// simulated minutes to a log of 50 per 10s in 250ms slots, and checks that
// no 10s window of the true admission times holds more than 50 units, that
// no unit was readmitted before its slot's end + Period, that a denied
// request retried after its RetryAfter (nothing else changed) is admitted,
// and that the log still admits most of what an exact one would.
func logSlotRandomArrivals(h *harness) {
	ctx := context.Background()
	const rate, period, g = 50, 10 * s, 250 * ms
	lim := sluice.Limit{Rate: rate, Period: period, Granularity: g}
	req := sluice.Request{Key: h.key("slotrand"), Algorithm: sluice.SlidingWindowLog, Limit: lim}
	rng := rand.New(rand.NewPCG(1, 2))
	type adm struct{ at, cost int64 }
	var admitted []adm
	var total, retries int64
	end := h.clk.Now() + int64(3*time.Minute)
	for h.clk.Now() < end {
		h.clk.Advance(time.Duration(rng.Int64N(int64(300 * ms))))
		r := req
		r.Cost = 1 + rng.Int64N(3)
		d, err := h.store.Apply(ctx, sluice.OpAllow, r)
		if err != nil {
			h.t.Fatal(err)
		}
		if !d.Allowed && rng.IntN(4) == 0 {
			// retry at exactly RetryAfter: it must be admitted then, and
			// not 1ns before
			h.clk.Advance(d.RetryAfter - 1)
			if p, err := h.store.Apply(ctx, sluice.OpPeek, r); err != nil || p.Allowed {
				h.t.Fatalf("t=%s: admitted 1ns before RetryAfter %s: %+v %v", h.since(), d.RetryAfter, p, err)
			}
			h.clk.Advance(1)
			if d, err = h.store.Apply(ctx, sluice.OpAllow, r); err != nil || !d.Allowed {
				h.t.Fatalf("t=%s: denied at RetryAfter: %+v %v", h.since(), d, err)
			}
			retries++
		}
		if d.Allowed {
			admitted = append(admitted, adm{h.clk.Now(), r.Cost})
			total += r.Cost
		}
	}
	// ≤ rate in every window [t, t+period) of true admission times; the
	// window starting at an admission is the fullest one ending after it.
	for i, a := range admitted {
		var in int64
		for j := i; j < len(admitted) && admitted[j].at < a.at+int64(period); j++ {
			in += admitted[j].cost
		}
		if in > rate {
			h.t.Fatalf("%d units in the %s from t=%s", in, period, time.Duration(a.at-T0.UnixNano()))
		}
	}
	// The granularity holds a unit at most g too long: over 3 minutes
	// (18 periods) the log admits at least rate per period less what a
	// period loses to the rounding (g/period of it), less one burst.
	h.t.Logf("admitted %d units in %d windows, %d retries", total, len(admitted), retries)
	if want := int64(18 * rate * (period - g) / period); total < want-rate || retries == 0 {
		h.t.Fatalf("admitted %d units (want ≥ %d), %d retries", total, want-rate, retries)
	}
}

// logSlotMatchesAlgo runs random ops (allow, peek, charge, refund
// newest first and by age; costs 1 to 4; gaps from 0 to 40ms, some of a
// nanosecond) on logs with several granularities and an exact one, one
// key each, and checks every decision against package algo's for the same
// ops on the same clock: the store (a Redis script included) stamps,
// merges, expires, refunds and answers as algo does. A refund's age is
// an earlier admission's, to the nanosecond or a little more, or random
// (sub-millisecond parts, past Period + Granularity).
func logSlotMatchesAlgo(h *harness) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 6))
	ops := []sluice.Op{sluice.OpAllow, sluice.OpAllow, sluice.OpAllow, sluice.OpPeek, sluice.OpCharge, sluice.OpRefund, sluice.OpRefund}
	for _, g := range []time.Duration{ms, 7 * ms, 40 * ms, 250 * ms, 0} {
		req := sluice.Request{Key: h.key("slotalgo" + g.String()), Algorithm: sluice.SlidingWindowLog,
			Limit: sluice.Limit{Rate: 8, Period: 250 * ms, Granularity: g}}
		var st algo.State
		var admitted []int64
		for i := range 400 {
			if rng.IntN(5) == 0 {
				h.clk.Advance(time.Duration(rng.Int64N(3)))
			} else {
				h.clk.Advance(time.Duration(rng.Int64N(int64(40 * ms))))
			}
			op := ops[rng.IntN(len(ops))]
			r := req
			r.Cost = 1 + rng.Int64N(4)
			if op == sluice.OpRefund && rng.IntN(3) > 0 {
				r.AdmittedAgo = refundAge(rng, h.clk.Now(), admitted)
			}
			got, err := h.store.Apply(ctx, op, r)
			if err != nil {
				h.t.Fatalf("granularity %s, step %d: %v", g, i, err)
			}
			want, next, err := algo.Apply(op, st, r, h.clk.Now())
			if err != nil {
				h.t.Fatal(err)
			}
			if op != sluice.OpPeek && want.Allowed {
				st = next
				if op != sluice.OpRefund {
					admitted = append(admitted, h.clk.Now())
				}
			}
			got.Source = 0
			if got != want {
				h.t.Fatalf("granularity %s, step %d (t=%s, %s cost %d ago %s):\n got %+v\nwant %+v", g, i, h.since(), op, r.Cost, r.AdmittedAgo, got, want)
			}
		}
	}
}

// refundAge is a random Request.AdmittedAgo at now: the age of one of the
// last admissions (Unix ns), exact or a little more, or a random one.
func refundAge(rng *rand.Rand, now int64, admitted []int64) time.Duration {
	switch k := rng.IntN(8); {
	case k < 5 && len(admitted) > 0:
		at := admitted[len(admitted)-1-rng.IntN(min(len(admitted), 6))]
		extra := []int64{0, 0, 1, rng.Int64N(int64(ms)), rng.Int64N(int64(30 * ms))}[rng.IntN(5)]
		return time.Duration(max(now-at+extra, 1))
	case k == 5:
		return time.Duration(1 + rng.Int64N(int64(time.Hour)))
	}
	return time.Duration(1 + rng.Int64N(int64(400*ms)))
}

// since is the scenario's time since T0.
func (h *harness) since() time.Duration { return time.Duration(h.clk.Now() - T0.UnixNano()) }

// logSlotErrors: a granularity that is negative, not whole milliseconds,
// longer than the period, or on another algorithm is an invalid limit.
func logSlotErrors(h *harness) {
	ctx := context.Background()
	good := sluice.Request{Key: h.key("slotbad"), Algorithm: sluice.SlidingWindowLog, Limit: sluice.Limit{Rate: 5, Period: s, Granularity: 10 * ms}, Cost: 1}
	cases := []struct {
		name string
		mod  func(r *sluice.Request)
	}{
		{"negative", func(r *sluice.Request) { r.Limit.Granularity = -ms }},
		{"not whole ms", func(r *sluice.Request) { r.Limit.Granularity = 1500 * time.Microsecond }},
		{"over the period", func(r *sluice.Request) { r.Limit.Granularity = s + ms }},
		{"gcra", func(r *sluice.Request) { r.Algorithm = sluice.GCRA }},
		{"sliding counter", func(r *sluice.Request) { r.Algorithm = sluice.SlidingWindowCounter }},
	}
	for _, c := range cases {
		r := good
		c.mod(&r)
		if _, err := h.store.Apply(ctx, sluice.OpAllow, r); !errors.Is(err, sluice.ErrInvalidLimit) {
			h.t.Errorf("%s: Apply error %v, want %v", c.name, err, sluice.ErrInvalidLimit)
		}
		if _, err := h.store.ApplyAll(ctx, sluice.OpAllow, []sluice.Request{good, r}); !errors.Is(err, sluice.ErrInvalidLimit) {
			h.t.Errorf("%s: ApplyAll error %v, want %v", c.name, err, sluice.ErrInvalidLimit)
		}
	}
	// nothing was charged by the failed batches; a granularity of the
	// whole period is valid
	if d, err := h.store.Apply(ctx, sluice.OpPeek, good); err != nil || d.Remaining != 5 {
		h.t.Fatalf("after failed batches: %+v %v", d, err)
	}
	whole := good
	whole.Limit.Granularity = s
	if d, err := h.store.Apply(ctx, sluice.OpAllow, whole); err != nil || !d.Allowed {
		h.t.Fatalf("granularity = period: %+v %v", d, err)
	}
}

// LogRuns returns how many runs (entries) store keeps for the sliding
// window log at key: the length of the Redis list, or of the memory
// store's log.
type LogRuns func(t *testing.T, store sluice.Store, key string) int

// RunLogRuns checks, with runs, that a sliding window log with a
// Granularity keeps at most Period/Granularity + 1 runs per key however
// many admissions it takes, alone and in batches, and that without one it
// keeps one per admission instant.
func RunLogRuns(t *testing.T, newStore Factory, runs LogRuns) {
	t.Helper()
	for _, exact := range []bool{false, true} {
		name := map[bool]string{false: "Granularity", true: "Exact"}[exact]
		t.Run(name, func(t *testing.T) {
			clk := clock.NewFake(T0)
			store := newStore(t, clk)
			h := &harness{t: t, store: store, clk: clk, tag: uniqueTag()}
			logRuns(h, runs, exact)
		})
	}
}

func logRuns(h *harness, runs LogRuns, exact bool) {
	ctx := context.Background()
	const period, g = s, 50 * ms
	lim := sluice.Limit{Rate: 10_000, Period: period, Granularity: g}
	if exact {
		lim.Granularity = 0
	}
	req := sluice.Request{Key: h.key("runs"), Algorithm: sluice.SlidingWindowLog, Limit: lim, Cost: 1}
	other := req
	other.Key = h.key("runs-other")
	rng := rand.New(rand.NewPCG(3, 4))
	const calls = 1200
	most := 0
	for i := range calls {
		h.clk.Advance(time.Duration(1 + rng.Int64N(int64(4*ms))))
		var err error
		var d sluice.Decision
		if i%3 == 0 {
			var ds []sluice.Decision
			ds, err = h.store.ApplyAll(ctx, sluice.OpAllow, []sluice.Request{req, other, req})
			if err == nil {
				d = ds[0]
			}
		} else {
			d, err = h.store.Apply(ctx, sluice.OpAllow, req)
		}
		if err != nil || !d.Allowed {
			h.t.Fatalf("call %d: %+v %v", i, d, err)
		}
		if i%50 == 49 || i == calls-1 {
			most = max(most, runs(h.t, h.store, req.Key))
		}
	}
	h.t.Logf("at most %d runs", most)
	// 1200 calls of ~2ms span ~2.4s: past two periods
	if limit := int(period/g) + 1; !exact && most > limit {
		h.t.Fatalf("a log in %s slots kept %d runs, want ≤ %d", g, most, limit)
	} else if exact && most < 200 {
		h.t.Fatalf("an exact log kept at most %d runs: the hook does not see them", most)
	}
}
