package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/lease"
	"github.com/sluice-io/sluice/storetest"
)

// Stats.Hits counts every decision made from a lease, exactly, and never
// goes back (it is exported as a counter): leases count their own
// decisions, and a key's count stays in the Stats when Sweep forgets the
// key and when the key's lease is replaced under another limit.
func TestStatsHitsKeptAcrossForget(t *testing.T) {
	clk := clock.NewFake(storetest.T0)
	s := newLease(t, lease.Options{All: true, Store: newMem(t, clk), Clock: clk, SweepEvery: -1})
	lim := sluice.Limit{Rate: 10_000, Period: time.Second, Burst: 2000}
	ctx := context.Background()
	var hits uint64
	count := func(req sluice.Request, op sluice.Op) {
		t.Helper()
		for range 5 {
			d, err := s.Apply(ctx, op, req)
			if err != nil {
				t.Fatal(err)
			}
			if d.Source == sluice.FromLease {
				hits++
			}
		}
	}
	check := func(when string) {
		t.Helper()
		s.WaitAsync()
		if got := s.Stats().Hits; got != hits {
			t.Fatalf("%s: Stats.Hits %d, want the %d decisions from leases", when, got, hits)
		}
	}
	a := sluice.Request{Key: "a", Algorithm: sluice.GCRA, Limit: lim, Cost: 1}
	b := sluice.Request{Key: "b", Algorithm: sluice.TokenBucket, Limit: lim, Cost: 1}
	for range 200 {
		count(a, sluice.OpAllow)
		count(b, sluice.OpAllow)
		count(a, sluice.OpPeek)
		s.WaitAsync()
		clk.Advance(time.Millisecond)
	}
	if hits == 0 {
		t.Fatal("no decision from a lease")
	}
	check("leased")
	// b under another limit: its lease is replaced.
	b.Limit.Burst = 3000
	for range 100 {
		count(b, sluice.OpAllow)
		s.WaitAsync()
		clk.Advance(time.Millisecond)
	}
	check("b's lease replaced")
	// Idle for long: Sweep gives back, then forgets, both keys.
	for range 3 {
		clk.Advance(10 * time.Second)
		s.Sweep()
	}
	if k := s.Stats().Keys; k != 0 {
		t.Fatalf("%d keys tracked after idling, want 0", k)
	}
	check("forgotten")
}
