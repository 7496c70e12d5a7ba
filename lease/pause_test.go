package lease_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/lease"
	"github.com/sluice-io/sluice/storetest"
)

// pausing is a store whose next chunk fetch, once armed, is charged and
// then answered an hour later: the instance was stopped (SIGSTOP, a frozen
// VM, starved goroutines) between Redis charging the chunk and the
// instance reading the reply.
type pausing struct {
	sluice.Store
	clk   *clock.Fake
	armed atomic.Bool
	fired atomic.Bool
}

func (p *pausing) Apply(ctx context.Context, op sluice.Op, req sluice.Request) (sluice.Decision, error) {
	d, err := p.Store.Apply(ctx, op, req)
	if op == sluice.OpAllow && req.Cost > 1 && p.armed.CompareAndSwap(true, false) {
		p.clk.Advance(time.Hour)
		p.fired.Store(true)
	}
	return d, err
}

// A chunk charged before a pause longer than TTL is not spent after it:
// the limit refilled meanwhile, and the chunk would land on top of a full
// burst. At the instant after the pause, the instance and another client
// together get at most the burst (+1), and the chunk goes back.
func TestChunkChargedBeforePauseNotSpentAfter(t *testing.T) {
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket} {
		t.Run(a.String(), func(t *testing.T) {
			clk := clock.NewFake(storetest.T0)
			mem := newMem(t, clk)
			p := &pausing{Store: mem, clk: clk}
			s := newLease(t, lease.Options{All: true, Store: p, Clock: clk, SweepEvery: -1})
			lim := sluice.Limit{Rate: 10_000, Period: time.Second, Burst: 2000}
			req := sluice.Request{Key: "paused", Algorithm: a, Limit: lim, Cost: 1}
			// Hot: leased.
			if _, local := drive(t, s, clk, req, 5, time.Millisecond, 200*time.Millisecond); local == 0 {
				t.Fatal("no lease after 200ms at 5000/s")
			}
			s.WaitAsync()
			// The next fetch is answered after the pause.
			p.armed.Store(true)
			for i := 0; !p.fired.Load(); i++ {
				if i == 10_000 {
					t.Fatal("no fetch in 10000 requests")
				}
				if _, err := s.Apply(context.Background(), sluice.OpAllow, req); err != nil {
					t.Fatal(err)
				}
				s.WaitAsync()
			}
			before := s.Stats()
			// The instant after the pause: the instance spends what it
			// can, and another client drains the store.
			var fromLease, fromStore, direct int
			for range 4 * int(lim.Burst) {
				d, err := s.Apply(context.Background(), sluice.OpAllow, req)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					if d.Source == sluice.FromLease {
						fromLease++
					} else {
						fromStore++
					}
				}
			}
			s.WaitAsync()
			for {
				d, err := mem.Apply(context.Background(), sluice.OpAllow, req)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed {
					break
				}
				direct++
			}
			after := s.Stats()
			// Everything the lease admitted now was fetched now: no more
			// than it fetched after the pause.
			fetchedNow := int(after.FetchedUnits - before.FetchedUnits)
			t.Logf("after the pause: %d from the lease (%d fetched since), %d by the store, %d by another client; %+v", fromLease, fetchedNow, fromStore, direct, after)
			if total := fromLease + fromStore + direct; total > int(lim.Burst)+1 {
				t.Fatalf("admitted %d at one instant after the pause, the limit allows %d (+1): a chunk charged an hour ago was spent", total, lim.Burst)
			}
		})
	}
}
