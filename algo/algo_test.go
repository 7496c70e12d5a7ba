package algo_test

import (
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
	before := append([]algo.Run(nil), st.Log...)
	for _, op := range []sluice.Op{sluice.OpAllow, sluice.OpRefund, sluice.OpCharge} {
		_, _, _ = algo.Apply(op, st, req, 1e18) // the same instant's run grows
		_, _, _ = algo.Apply(op, st, req, 1e18+1)
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
