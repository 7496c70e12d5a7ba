package memstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/storetest"
)

// TestNewKeyRacesItsFirstCharge releases many goroutines at once on a key
// the store has never seen, for every algorithm, through Apply and through
// ApplyAll, while sweeps run: the key's cell is created by one of them and
// found by the others, and a cell that a sweep drops before its first
// charge (a new key reads as expired) is created again. The count admitted
// must be the limit exactly: a charge lost to a second, replaced cell
// admits more, a charge that landed on a dropped cell too.
func TestNewKeyRacesItsFirstCharge(t *testing.T) {
	const (
		limit   = 10
		workers = 16
	)
	rounds := 400
	if raceOn {
		rounds = 60
	}
	clk := clock.NewFake(storetest.T0) // frozen: nothing refills
	s, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	for _, a := range sluice.Algorithms() {
		for _, batch := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/batch=%v", a, batch), func(t *testing.T) {
				lim := sluice.Limit{Rate: limit, Period: time.Hour}
				for round := range rounds {
					key := fmt.Sprintf("new-%s-%v-%d", a, batch, round)
					var admitted atomic.Int64
					start := make(chan struct{})
					stop := make(chan struct{})
					var sweeps sync.WaitGroup
					sweeps.Go(func() { // sweeps drop the new, still-empty key's cell
						for round%2 == 1 {
							select {
							case <-stop:
								return
							default:
								s.Sweep()
							}
						}
					})
					var wg sync.WaitGroup
					for w := range workers {
						wg.Go(func() {
							req := sluice.Request{Key: key, Algorithm: a, Limit: lim, Cost: 1}
							if a == sluice.Concurrency {
								req.Lease = fmt.Sprint("lease-", w)
							}
							<-start
							var d sluice.Decision
							var err error
							if batch {
								var ds []sluice.Decision
								if ds, err = s.ApplyAll(ctx, sluice.OpAllow, []sluice.Request{req}); err == nil {
									d = ds[0]
								}
							} else {
								d, err = s.Apply(ctx, sluice.OpAllow, req)
							}
							if err != nil {
								t.Error(err)
								return
							}
							if d.Allowed {
								admitted.Add(1)
							}
						})
					}
					close(start)
					wg.Wait()
					close(stop)
					sweeps.Wait()
					if got := admitted.Load(); got != limit {
						t.Fatalf("round %d: %d goroutines on a new key admitted %d, want the limit %d exactly", round, workers, got, limit)
					}
				}
				// Every key expired and swept: nothing is left accounted. A
				// new cell accounted after another goroutine had charged it
				// (its size read after it was shared) leaves bytes behind.
				clk.Advance(2 * time.Hour)
				s.Sweep()
				if s.Len() != 0 || s.Bytes() != 0 {
					t.Fatalf("all keys swept: Len %d, Bytes %d, want 0 and 0", s.Len(), s.Bytes())
				}
			})
		}
	}
}
