package algo_test

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
)

// FuzzLimitInvariant: whatever the arrivals, costs, refunds and charges, no
// algorithm admits more than its limit allows over the run, and a retry at
// RetryAfter succeeds while one a nanosecond earlier does not.
func FuzzLimitInvariant(f *testing.F) {
	f.Add(uint8(0), uint8(10), uint8(3), []byte{0, 1, 2, 3, 250, 1, 0, 0, 7, 9})
	f.Add(uint8(2), uint8(1), uint8(0), []byte{255, 255, 1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, algIdx, rate, burst uint8, arrivals []byte) {
		a := sluice.Algorithms()[int(algIdx)%5] // concurrency has no rate
		lim := sluice.Limit{Rate: int64(rate%50) + 1, Period: time.Second, Burst: int64(burst % 60)}
		req := sluice.Request{Key: "k", Algorithm: a, Limit: lim}
		var st algo.State
		start := int64(1_700_000_000_000_000_000)
		now := start
		var admitted int64
		for i, b := range arrivals {
			now += int64(b) * int64(time.Millisecond) * 3
			req.Cost = int64(b%3) + 1
			if req.Cost > req.Capacity() {
				req.Cost = 1
			}
			d, next, err := algo.Apply(sluice.OpAllow, st, req, now)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted += req.Cost
				st = next
				continue
			}
			if d.RetryAfter <= 0 {
				t.Fatalf("arrival %d denied with RetryAfter %s", i, d.RetryAfter)
			}
			// exactness of RetryAfter
			if early, _, _ := algo.Apply(sluice.OpPeek, st, req, now+int64(d.RetryAfter)-1); early.Allowed {
				t.Fatalf("arrival %d: admitted 1ns before RetryAfter %s", i, d.RetryAfter)
			}
			if on, _, _ := algo.Apply(sluice.OpPeek, st, req, now+int64(d.RetryAfter)); !on.Allowed {
				t.Fatalf("arrival %d: denied at RetryAfter %s: %+v", i, d.RetryAfter, on)
			}
		}
		elapsed := float64(now-start) / float64(time.Second)
		bound := float64(req.Capacity()) + float64(lim.Rate)*elapsed + 1
		if a == sluice.FixedWindow || a == sluice.SlidingWindowCounter {
			bound = float64(lim.Rate) * (elapsed + 2) // windows touched
		}
		if float64(admitted) > bound {
			t.Fatalf("%s admitted %d in %.3fs, bound %.1f", a, admitted, elapsed, bound)
		}
	})
}

func TestApplyDoesNotAliasState(t *testing.T) {
	req := sluice.Request{Key: "k", Algorithm: sluice.SlidingWindowLog, Limit: sluice.PerSecond(5), Cost: 2}
	_, st, _ := algo.Apply(sluice.OpAllow, algo.State{}, req, 1e18)
	_, st, _ = algo.Apply(sluice.OpAllow, st, req, 1e18+5)
	before := append([]algo.Run(nil), st.Log...)
	for _, op := range []sluice.Op{sluice.OpAllow, sluice.OpRefund, sluice.OpCharge} {
		_, _, _ = algo.Apply(op, st, req, 1e18+5) // the same instant's run grows
		_, _, _ = algo.Apply(op, st, req, 1e18+6)
	}
	for _, ago := range []time.Duration{1, 5, 6} { // by age: one run, or both
		r := req
		r.AdmittedAgo, r.Cost = ago, 3
		if _, next, err := algo.Apply(sluice.OpRefund, st, r, 1e18+6); err != nil || len(next.Log) == 0 {
			t.Fatalf("refund by age %s: %+v %v", ago, next, err)
		}
	}
	for i := range before {
		if st.Log[i] != before[i] || len(st.Log) != len(before) {
			t.Fatal("Apply modified the state it was given")
		}
	}
}

// TestSlidingLogKeepsRuns: the sliding log keeps one run per instant, not
// one entry per unit, so that a large cost on a large limit (any cost up to
// Rate, 2^40 at most, is valid) takes a few words rather than 8 bytes per
// unit: a cost of 2^39 used to ask for 4 TiB and crash the process.
func TestSlidingLogKeepsRuns(t *testing.T) {
	lim := sluice.Limit{Rate: 1 << 40, Period: time.Minute}
	req := sluice.Request{Key: "k", Algorithm: sluice.SlidingWindowLog, Limit: lim, Cost: 1 << 20}
	now := int64(1e18)
	var st algo.State
	for i, at := range []int64{now, now, now + 1} {
		d, next, err := algo.Apply(sluice.OpAllow, st, req, at)
		if err != nil || !d.Allowed || d.Remaining != lim.Rate-int64(i+1)<<20 {
			t.Fatalf("request %d: %+v %v", i, d, err)
		}
		st = next
	}
	if len(st.Log) > 2 {
		t.Fatalf("the log holds %d entries for two instants", len(st.Log))
	}
	// Refunds take from the newest units, across runs.
	req.Cost = 1<<20 + 1
	d, st, err := algo.Apply(sluice.OpRefund, st, req, now+1)
	if err != nil || d.Remaining != lim.Rate-1<<21+1 {
		t.Fatalf("refund: %+v %v", d, err)
	}
	// Filled up, the next unit waits for the oldest to slide out.
	req.Cost = lim.Rate - 1<<21 + 1
	if d, _, err := algo.Apply(sluice.OpAllow, st, req, now+1); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("fill: %+v %v", d, err)
	}
	_, st, _ = algo.Apply(sluice.OpAllow, st, req, now+1)
	req.Cost = 1
	d, _, err = algo.Apply(sluice.OpAllow, st, req, now+2)
	if err != nil || d.Allowed || d.RetryAfter != time.Minute-2 || d.ResetAfter != time.Minute-1 {
		t.Fatalf("full: %+v %v, want a retry when the first units slide out", d, err)
	}
	if len(st.Log) > 2 {
		t.Fatalf("the log holds %d entries for two instants", len(st.Log))
	}
}

// TestChargedLeaseStaysOne: charging a held concurrency lease, however
// often, keeps one lease for its holder (memory per key is one lease per
// holder), with the slots added up to algo.MaxCount.
func TestChargedLeaseStaysOne(t *testing.T) {
	req := sluice.Request{Key: "k", Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: 2, Period: time.Minute}, Cost: 1, Lease: "a"}
	_, st, err := algo.Apply(sluice.OpAllow, algo.State{}, req, 1e18)
	if err != nil {
		t.Fatal(err)
	}
	req.Cost = 1 << 50
	for i := range 1000 {
		if _, st, err = algo.Apply(sluice.OpCharge, st, req, 1e18+int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if len(st.Leases) != 1 || st.Leases[0].Cost != algo.MaxCount || st.Leases[0].Expiry != 1e18+999+int64(time.Minute) {
		t.Fatalf("leases after 1000 charges: %+v", st.Leases)
	}
}

// FuzzChargeNeverFrees: on any limit Validate accepts, down to its edges,
// and with any cost up to MaxInt64, a charge never leaves a key more
// capacity than it had (nor admits a request it denied), and a refund
// never leaves it less. A charge whose arithmetic wrapped used to hand
// back a full bucket.
func FuzzChargeNeverFrees(f *testing.F) {
	f.Add(uint8(0), uint8(0), []byte{0, 0x17, 0, 0x11, 3, 0x27})
	f.Add(uint8(2), uint8(3), []byte{0, 0x07, 0, 0x21, 1, 0x37, 2, 0x10})
	f.Add(uint8(4), uint8(5), []byte{0, 0x13, 0, 0x17, 4, 0x27, 5, 0x11})
	f.Add(uint8(5), uint8(1), []byte{0, 0x10, 0, 0x14, 0, 0x15, 3, 0x26})
	f.Fuzz(func(t *testing.T, algIdx, limIdx uint8, prog []byte) {
		limits := []sluice.Limit{
			{Rate: 10, Period: time.Second, Burst: 5},
			{Rate: 1 << 40, Period: time.Nanosecond},
			{Rate: 1, Period: 366 * 24 * time.Hour, Burst: 16},
			{Rate: 1 << 40, Period: 366 * 24 * time.Hour},
			{Rate: 3, Period: time.Minute},
			{Rate: 999999937, Period: 1 << 40},
		}
		a := sluice.Algorithms()[int(algIdx)%6]
		lim := limits[int(limIdx)%len(limits)]
		if a != sluice.GCRA && a != sluice.TokenBucket {
			lim.Burst = 0
		}
		req := sluice.Request{Key: "k", Algorithm: a, Limit: lim, Lease: "a"}
		capacity := req.Capacity()
		costs := []int64{1, 2, capacity, capacity + 1, 1 << 40, 1<<53 + 1, 1 << 62, math.MaxInt64}
		advances := []time.Duration{0, 1, time.Millisecond, time.Second, lim.Period, 30 * 24 * time.Hour}
		ops := []sluice.Op{sluice.OpAllow, sluice.OpCharge, sluice.OpRefund, sluice.OpAllow}
		var st algo.State
		now := int64(1_790_000_000_000_000_000)
		peek := func(cost int64) sluice.Decision {
			r := req
			r.Cost = cost
			d, _, err := algo.Apply(sluice.OpPeek, st, r, now)
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
		for i := 0; i+1 < len(prog) && i < 128; i += 2 {
			now += int64(advances[int(prog[i])%len(advances)])
			op := ops[int(prog[i+1]>>4)%len(ops)]
			r := req
			r.Cost = costs[int(prog[i+1]&0xf)%len(costs)]
			if a == sluice.Concurrency && op == sluice.OpCharge {
				r.Lease = "b"
			}
			before, beforeOne := peek(0), peek(1)
			d, next, err := algo.Apply(op, st, r, now)
			if err != nil {
				continue // a cost the operation refuses
			}
			if op == sluice.OpPeek || d.Allowed {
				st = next
			}
			after, afterOne := peek(0), peek(1)
			switch op {
			case sluice.OpCharge:
				if after.Remaining > before.Remaining || (afterOne.Allowed && !beforeOne.Allowed) {
					t.Fatalf("step %d: %s cost %d freed capacity: %+v then %+v", i/2, a, r.Cost, before, after)
				}
			case sluice.OpRefund:
				if after.Remaining < before.Remaining {
					t.Fatalf("step %d: %s refund %d took capacity: %+v then %+v", i/2, a, r.Cost, before, after)
				}
			}
		}
	})
}

// TestCostsInSaturates: events in a span whose count passes an int64
// saturate rather than wrap: 2^23 ns of debt at 2^40 a nanosecond is
// -2^63 events, not +2^40 (which a key deep in debt reported as its
// Remaining, and a local fallback would have seeded from).
func TestCostsInSaturates(t *testing.T) {
	l := sluice.Limit{Rate: 1 << 40, Period: time.Nanosecond}
	for _, c := range []struct {
		ns, want int64
	}{
		{1 << 22, 1 << 62},
		{1<<23 - 1, math.MaxInt64 - 1<<40 + 1},
		{1 << 23, math.MaxInt64},
		{1<<24 - 1, math.MaxInt64},
		{-(1 << 22), -(1 << 62)},
		{-(1 << 23), math.MinInt64},
		{-(1<<24 - 1), math.MinInt64},
		{math.MinInt64 + 1, math.MinInt64},
	} {
		if got := algo.CostsIn(l, c.ns); got != c.want {
			t.Errorf("CostsIn(%s, %d) = %d, want %d", l, c.ns, got, c.want)
		}
	}
}

func TestSlotEnd(t *testing.T) {
	const g = 100 * time.Millisecond
	ms := int64(time.Millisecond)
	for _, c := range []struct {
		now  int64
		g    time.Duration
		want int64
	}{
		{1234, 0, 1234},
		{0, g, 0},
		{1, g, 100 * ms},
		{100 * ms, g, 100 * ms},
		{100*ms + 1, g, 200 * ms},
		{-1, g, 0},
		{-100*ms - 1, g, -100 * ms},
		// 1e18 is 1ms past a multiple of 7ms: epoch-aligned, not now-aligned
		{1e18 + 5*ms, 7 * time.Millisecond, 1e18 + 6*ms},
		{math.MaxInt64 - 1, time.Second, math.MaxInt64},
	} {
		if got := algo.SlotEnd(c.now, c.g); got != c.want {
			t.Errorf("SlotEnd(%d, %s) = %d, want %d", c.now, c.g, got, c.want)
		}
	}
}

// A log with a granularity stamps its units at the slot's end, one run per
// slot; units stamped behind the newest run (a clock that stepped back, a
// granularity changed or dropped) join it, so the runs stay ascending.
func TestSlidingLogSlots(t *testing.T) {
	ms := int64(time.Millisecond)
	lim := sluice.Limit{Rate: 100, Period: time.Second, Granularity: 100 * time.Millisecond}
	req := sluice.Request{Key: "k", Algorithm: sluice.SlidingWindowLog, Limit: lim, Cost: 1}
	var st algo.State
	apply := func(op sluice.Op, at int64) {
		t.Helper()
		d, next, err := algo.Apply(op, st, req, at)
		if err != nil || !d.Allowed {
			t.Fatalf("%s at %d: %+v %v", op, at, d, err)
		}
		st = next
	}
	apply(sluice.OpAllow, 10*ms)
	apply(sluice.OpCharge, 99*ms)
	apply(sluice.OpAllow, 100*ms)
	apply(sluice.OpAllow, 101*ms)
	apply(sluice.OpAllow, 150*ms) // joins the 200ms run
	apply(sluice.OpAllow, 50*ms)  // the clock stepped back: joins it too
	req.Limit.Granularity = 0
	apply(sluice.OpAllow, 180*ms) // exact now, still behind the newest run
	want := []algo.Run{{At: 100 * ms, N: 3}, {At: 200 * ms, N: 4}}
	if len(st.Log) != len(want) || st.Log[0] != want[0] || st.Log[1] != want[1] {
		t.Fatalf("log %+v, want %+v", st.Log, want)
	}
	if got := algo.Expiry(&st, &req); got != 1200*ms {
		t.Fatalf("expiry %d, want %d", got, 1200*ms)
	}
}

// A refund by age takes units from the newest runs stamped at or before
// now − AdmittedAgo (rounded up to its slot), across runs, and leaves the
// later runs whole.
func TestSlidingLogRefundByAge(t *testing.T) {
	ms := int64(time.Millisecond)
	for _, c := range []struct {
		g    time.Duration
		ago  time.Duration
		cost int64
		want []algo.Run
	}{
		{0, 0, 3, []algo.Run{{10 * ms, 2}, {20 * ms, 2}, {40 * ms, 1}}}, // newest first
		{0, 25 * time.Millisecond, 3, []algo.Run{{10 * ms, 1}, {40 * ms, 4}}},
		{0, 30 * time.Millisecond, 1, []algo.Run{{10 * ms, 2}, {20 * ms, 1}, {40 * ms, 4}}},
		{0, 31 * time.Millisecond, 9, []algo.Run{{20 * ms, 2}, {40 * ms, 4}}}, // fewer than the cost
		{0, 41 * time.Millisecond, 1, []algo.Run{{10 * ms, 2}, {20 * ms, 2}, {40 * ms, 4}}},
		{10 * time.Millisecond, 40 * time.Millisecond, 1, []algo.Run{{10 * ms, 1}, {20 * ms, 2}, {40 * ms, 4}}},   // T on a slot's end
		{10 * time.Millisecond, 40*time.Millisecond - 1, 1, []algo.Run{{10 * ms, 2}, {20 * ms, 1}, {40 * ms, 4}}}, // rounded up to 20ms
		{10 * time.Millisecond, 31 * time.Millisecond, 1, []algo.Run{{10 * ms, 2}, {20 * ms, 1}, {40 * ms, 4}}},
		{10 * time.Millisecond, time.Hour, 1, []algo.Run{{10 * ms, 2}, {20 * ms, 2}, {40 * ms, 4}}},
	} {
		lim := sluice.Limit{Rate: 100, Period: time.Second, Granularity: c.g}
		req := sluice.Request{Key: "k", Algorithm: sluice.SlidingWindowLog, Limit: lim, Cost: c.cost, AdmittedAgo: c.ago}
		st := algo.State{Log: []algo.Run{{10 * ms, 2}, {20 * ms, 2}, {40 * ms, 4}}}
		_, next, err := algo.Apply(sluice.OpRefund, st, req, 50*ms)
		if err != nil || !slices.Equal(next.Log, c.want) {
			t.Errorf("granularity %s, refund %d by age %s: %+v %v, want %+v", c.g, c.cost, c.ago, next.Log, err, c.want)
		}
	}
}
