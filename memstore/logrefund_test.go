package memstore_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/storetest"
)

// TestLogRefundByAgeNeverUnderCounts: random admissions to a sliding
// window log, and random later refunds of parts of them by age
// (Request.AdmittedAgo at least the admission's true age, as a caller that
// measures from sending its call passes; each admission refunded at most
// its own cost). A model takes each refund from the refunded admission's
// own units, which count until its stamp + Period. The log must never
// hold fewer units than the model at any time: it may take a refund from
// an older admission (counting more than the model for a while), never
// from a later one. A newest-first refund fails this.
func TestLogRefundByAgeNeverUnderCounts(t *testing.T) {
	ctx := context.Background()
	for _, g := range []time.Duration{0, time.Millisecond, 7 * time.Millisecond, 50 * time.Millisecond} {
		t.Run(g.String(), func(t *testing.T) {
			clk := clock.NewFake(storetest.T0)
			store := newStore(t, clk)
			lim := sluice.Limit{Rate: 20, Period: 200 * time.Millisecond, Granularity: g}
			req := sluice.Request{Key: "k", Algorithm: sluice.SlidingWindowLog, Limit: lim}
			rng := rand.New(rand.NewPCG(7, uint64(g)))
			type adm struct{ at, stamp, left int64 }
			var adms []*adm
			model := func(now int64) int64 {
				var n int64
				for _, a := range adms {
					if a.stamp+int64(lim.Period) > now {
						n += a.left
					}
				}
				return n
			}
			var refunds, behind int
			for i := range 4000 {
				if rng.IntN(4) == 0 {
					clk.Advance(time.Duration(rng.Int64N(3)))
				} else {
					clk.Advance(time.Duration(rng.Int64N(int64(15 * time.Millisecond))))
				}
				now := clk.Now()
				r := req
				if rng.IntN(2) == 0 || len(adms) == 0 {
					r.Cost = 1 + rng.Int64N(5)
					d, err := store.Apply(ctx, sluice.OpAllow, r)
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed {
						adms = append(adms, &adm{now, algo.SlotEnd(now, g), r.Cost})
					}
				} else {
					// one of the last admissions; its age as the caller
					// measures it: the true one or more
					a := adms[len(adms)-1-rng.IntN(min(len(adms), 8))]
					if a.left == 0 {
						continue
					}
					extra := []int64{0, 0, 0, 1, rng.Int64N(int64(time.Millisecond)), rng.Int64N(int64(20 * time.Millisecond))}[rng.IntN(6)]
					r.AdmittedAgo = time.Duration(max(now-a.at+extra, 1))
					r.Cost = 1 + rng.Int64N(a.left)
					if _, err := store.Apply(ctx, sluice.OpRefund, r); err != nil {
						t.Fatal(err)
					}
					a.left -= r.Cost
					refunds++
					if adms[len(adms)-1] != a {
						behind++
					}
				}
				r.Cost, r.AdmittedAgo = 0, 0
				d, err := store.Apply(ctx, sluice.OpPeek, r)
				if err != nil {
					t.Fatal(err)
				}
				if held, want := lim.Rate-d.Remaining, model(now); held < want {
					t.Fatalf("step %d (t=%s): the log holds %d units, the admissions not refunded %d",
						i, time.Duration(now-storetest.T0.UnixNano()), held, want)
				}
			}
			t.Logf("%d admissions, %d refunds, %d of them with later admissions", len(adms), refunds, behind)
			if behind < 200 {
				t.Fatalf("only %d refunds had later admissions: the test shows little", behind)
			}
		})
	}
}
