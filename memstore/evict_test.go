package memstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/storetest"
)

// floodKind is how a flood charges each of its fresh keys.
type floodKind struct {
	name  string
	limit sluice.Limit
	full  bool // charge the key's whole capacity at once
}

// floods: fresh keys charged once (a tenth of a 10/min limit, the red
// team's run), and keys used up at once under a short limit (an attacker
// making its keys look as used as the victim's, but they recover sooner).
var floods = []floodKind{
	{name: "fresh", limit: sluice.PerMinute(10)},
	{name: "usedup-1s", limit: sluice.PerSecond(10), full: true},
}

// usedUp charges key under a 5/day limit of algorithm a until it is used
// up, and returns the request that is then denied.
func usedUp(t testing.TB, s sluice.Store, a sluice.Algorithm, key string) sluice.Request {
	t.Helper()
	ctx := context.Background()
	for i := range 5 {
		r := sluice.Request{Key: key, Algorithm: a, Limit: sluice.PerDay(5), Cost: 1, Lease: fmt.Sprint("v", i)}
		if d, err := s.Apply(ctx, sluice.OpAllow, r); err != nil || !d.Allowed {
			t.Fatalf("%s: the victim's own limit, charge %d: %+v, %v", a, i+1, d, err)
		}
	}
	r := sluice.Request{Key: key, Algorithm: a, Limit: sluice.PerDay(5), Cost: 1, Lease: "v-more"}
	if d, err := s.Apply(ctx, sluice.OpPeek, r); err != nil || d.Allowed {
		t.Fatalf("%s: the victim is not used up: %+v, %v", a, d, err)
	}
	return r
}

// flood sends n fresh keys of algorithm a through s, a millisecond apart.
func flood(t *testing.T, s *memstore.Store, clk *clock.Fake, a sluice.Algorithm, f floodKind, n, maxKeys int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		clk.Advance(time.Millisecond)
		r := sluice.Request{Key: fmt.Sprint("flood:", i), Algorithm: a, Limit: f.limit, Cost: 1, Lease: "l"}
		if f.full {
			r.Cost = r.Capacity()
		}
		if _, err := s.Apply(ctx, sluice.OpAllow, r); err != nil {
			t.Fatal(err)
		}
		if s.Len() > maxKeys {
			t.Fatalf("%d keys held, over MaxKeys %d", s.Len(), maxKeys)
		}
	}
}

// TestEvictionAcrossAlgorithms: a used-up key of any algorithm survives a
// flood of fresh keys of any algorithm (and of keys used up under a
// shorter limit) ten times MaxKeys; the red team's run was a 5/day GCRA
// key evicted by token-bucket keys, because each algorithm family was
// evicted by its own rank, the same share of each.
func TestEvictionAcrossAlgorithms(t *testing.T) {
	for _, victim := range sluice.Algorithms() {
		for _, fa := range sluice.Algorithms() {
			for _, f := range floods {
				t.Run(fmt.Sprint(victim, "/", fa, "/", f.name), func(t *testing.T) {
					clk := clock.NewFake(storetest.T0)
					s, err := memstore.New(memstore.Options{Clock: clk, MaxKeys: 50, SweepInterval: -1})
					if err != nil {
						t.Fatal(err)
					}
					r := usedUp(t, s, victim, "victim")
					flood(t, s, clk, fa, f, 500, 50)
					if d, _ := s.Apply(context.Background(), sluice.OpAllow, r); d.Allowed {
						t.Fatalf("the used-up %s key was admitted again after 500 %s keys of %s: evicted (%+v)", victim, f.name, fa, d)
					}
				})
			}
		}
	}
}

// TestEvictionRanksByShareInUse: among keys not used up, the more used
// survives the less used, across algorithms: a 5/day key with 3 of 5 used
// outlives a flood of keys with a tenth of theirs used.
func TestEvictionRanksByShareInUse(t *testing.T) {
	for _, victim := range sluice.Algorithms() {
		t.Run(victim.String(), func(t *testing.T) {
			clk := clock.NewFake(storetest.T0)
			s, _ := memstore.New(memstore.Options{Clock: clk, MaxKeys: 100, SweepInterval: -1})
			ctx := context.Background()
			for i := range 3 {
				r := sluice.Request{Key: "victim", Algorithm: victim, Limit: sluice.PerDay(5), Cost: 1, Lease: fmt.Sprint("v", i)}
				if d, err := s.Apply(ctx, sluice.OpAllow, r); err != nil || !d.Allowed {
					t.Fatal(d, err)
				}
			}
			flood(t, s, clk, sluice.TokenBucket, floods[0], 1000, 100)
			r := sluice.Request{Key: "victim", Algorithm: victim, Limit: sluice.PerDay(5), Lease: "peek"}
			if d, _ := s.Apply(ctx, sluice.OpPeek, r); d.Remaining != 2 {
				t.Fatalf("the 60%%-used key was evicted before 10%%-used ones: remaining %d, want 2", d.Remaining)
			}
		})
	}
}

// TestEvictionTies: keys tied at one value (a fixed window's keys charged
// alike all expire at its end) are evicted in the share needed, not all:
// a sweep that dropped every key at its cut emptied the store in the
// 10 M-key flood, and every partly used key started over.
func TestEvictionTies(t *testing.T) {
	clk := clock.NewFake(storetest.T0)
	s, _ := memstore.New(memstore.Options{Clock: clk, MaxKeys: 1000, SweepInterval: -1})
	ctx := context.Background()
	least := 1000
	for i := range 5000 {
		r := sluice.Request{Key: fmt.Sprint("k", i), Algorithm: sluice.FixedWindow, Limit: sluice.PerHour(10), Cost: 1}
		if _, err := s.Apply(ctx, sluice.OpAllow, r); err != nil {
			t.Fatal(err)
		}
		if i >= 1000 {
			least = min(least, s.Len())
		}
	}
	if least < 850 {
		t.Fatalf("the store fell to %d keys of MaxKeys 1000: a sweep evicted every key tied at its cut", least)
	}
}
