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

// A $1 budget (10000 units of a hundredth of a cent, no refill to speak
// of) spent from the three regions at once, as a gateway spends one: each
// call reserves its most (50 units) with OpAllow, uses a tenth of it on
// average (1-9 units), and refunds the rest, naming the window its charge
// was taken from (Request.ReservedAhead: the charge's ResetAfter less the
// time since). The units spent in all regions together end at ≤ 10000:
// every reservation was charged at home first, and refunds only give back
// what was reserved. And ≥ 9000: a refund outside the home goes back to
// the region's share, for a window's share as for a bucket's. Measured:
// 9906-9909 for both; with a window's refunds dropped outside the home (as
// before they named their window) 4293: us and ap spent a tenth of what
// they reserved, and their reservations drained the budget.
func TestGlobalBudget(t *testing.T) {
	w := newWorld(t, worldOpts{home: "eu"})
	for _, c := range []struct {
		a   sluice.Algorithm
		lim sluice.Limit
	}{
		// $1 a day as a bucket (in 3s it refills 0.35 units).
		{sluice.GCRA, sluice.Limit{Rate: 10000, Period: 24 * time.Hour, Burst: 10000}},
		// $1 a day as a window.
		{sluice.FixedWindow, sluice.Limit{Rate: 10000, Period: 24 * time.Hour}},
	} {
		t.Run(c.a.String(), func(t *testing.T) { spendBudget(t, w, c.a, c.lim) })
	}
}

// reserve is what each call of spendBudget reserves; it uses 1 to
// reserve/5 - 1, a tenth on average.
const reserve = 50

func spendBudget(t *testing.T, w *world, a sluice.Algorithm, lim sluice.Limit) {
	req := sluice.Request{Key: w.global + "dollar:" + a.String(), Algorithm: a, Limit: lim, Cost: reserve}
	var spent, calls atomic.Int64
	byRegion := map[string]*atomic.Int64{}
	for _, name := range regionNames {
		byRegion[name] = new(atomic.Int64)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, name := range regionNames {
		for _, s := range w.inst[name] {
			for range 2 {
				wg.Go(func() {
					// Every client calls at the same pace, 200 a second, so
					// that the home region's fast calls do not spend the
					// budget before the far regions' first fetch is back.
					tick := time.NewTicker(5 * time.Millisecond)
					defer tick.Stop()
					denied := 0
					for ctx.Err() == nil && denied < 50 {
						select {
						case <-ctx.Done():
							return
						case <-tick.C:
						}
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
							continue
						}
						got := time.Now()
						used := rand.Int64N(reserve/5-1) + 1
						spent.Add(used)
						byRegion[name].Add(used)
						r := req
						r.Cost = reserve - used
						if a == sluice.FixedWindow {
							// The charge's window, as a gateway names it.
							r.ReservedAhead = max(d.ResetAfter-time.Since(got), 1)
						}
						if _, err := s.Apply(ctx, sluice.OpRefund, r); err != nil && ctx.Err() == nil {
							t.Error(err)
						}
					}
				})
			}
		}
	}
	wg.Wait()
	t.Logf("%d calls, %d units spent of 10000 (eu %d, us %d, ap %d)", calls.Load(), spent.Load(),
		byRegion["eu"].Load(), byRegion["us"].Load(), byRegion["ap"].Load())
	if spent.Load() > lim.Rate {
		t.Fatalf("spent %d units of a $1 budget of %d", spent.Load(), lim.Rate)
	}
	if ctx.Err() != nil {
		// A host too loaded to spend the budget in the time given proves
		// nothing about use; the bound above holds all the same.
		t.Logf("the clients did not finish in %s: use not checked", 8*time.Second)
		return
	}
	if spent.Load() < lim.Rate*9/10 {
		t.Fatalf("spent only %d units of %d: reservations drained the budget, not spend", spent.Load(), lim.Rate)
	}
}
