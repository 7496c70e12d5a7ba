package region_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
)

// A $1 budget (100 cents, no refill to speak of) spent from the three
// regions at once, as a gateway spends one: each call reserves its most
// (5 cents) with OpAllow, then refunds what it did not use. The cents
// spent in all regions together end at ≤ 100: every reservation was
// charged at home first, and refunds only give back what was reserved.
func TestGlobalBudget(t *testing.T) {
	w := newWorld(t, worldOpts{home: "eu"})
	for _, c := range []struct {
		a   sluice.Algorithm
		lim sluice.Limit
	}{
		// $1 a day as a bucket: refunds go back to the region's share
		// (in 3s it refills 0.003 cents).
		{sluice.GCRA, sluice.Limit{Rate: 100, Period: 24 * time.Hour, Burst: 100}},
		// $1 a day as a window: a window's refunds are dropped (they
		// could land in the next window), so less is spent.
		{sluice.FixedWindow, sluice.Limit{Rate: 100, Period: 24 * time.Hour}},
	} {
		t.Run(c.a.String(), func(t *testing.T) { spendBudget(t, w, c.a, c.lim) })
	}
}

func spendBudget(t *testing.T, w *world, a sluice.Algorithm, lim sluice.Limit) {
	req := sluice.Request{Key: w.global + "dollar:" + a.String(), Algorithm: a, Limit: lim, Cost: 5}
	var spent, calls atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, name := range regionNames {
		for _, s := range w.inst[name] {
			for range 2 {
				wg.Go(func() {
					denied := 0
					for ctx.Err() == nil && denied < 50 {
						calls.Add(1)
						d, err := s.Apply(ctx, sluice.OpAllow, req)
						if err != nil {
							if ctx.Err() == nil {
								t.Error(err)
							}
							return
						}
						if !d.Allowed {
							denied++
							// a client told to come back later, not a synchronisation
							time.Sleep(min(d.RetryAfter, 20*time.Millisecond))
							continue
						}
						used := rand.Int64N(5) + 1
						spent.Add(used)
						if used < 5 {
							r := req
							r.Cost = 5 - used
							if _, err := s.Apply(ctx, sluice.OpRefund, r); err != nil && ctx.Err() == nil {
								t.Error(err)
							}
						}
					}
				})
			}
		}
	}
	wg.Wait()
	t.Logf("%d calls, %d cents spent of 100", calls.Load(), spent.Load())
	if spent.Load() > 100 {
		t.Fatalf("spent %d cents of a $1 budget", spent.Load())
	}
	if spent.Load() < 50 {
		t.Fatalf("spent only %d cents of 100: the shares kept the rest", spent.Load())
	}
}
