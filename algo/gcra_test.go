package algo_test

import (
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
)

// FuzzGCRAAllowAgreesWithApply: the lock-free stores' GCRA step
// (GCRAAllow, whose admitted decision GCRAAdmittedTo writes in place) gives
// exactly Apply's decision and TAT, over limits whose products need 128
// bits and TATs ahead of, at and behind now.
func FuzzGCRAAllowAgreesWithApply(f *testing.F) {
	f.Add(int64(10), int64(time.Second), int64(0), int64(1), int64(0), int64(0))
	f.Add(int64(1<<40), int64(time.Second), int64(1<<40), int64(3), int64(5e8), int64(-7))
	f.Add(int64(7), int64(24*time.Hour), int64(9), int64(9), int64(1e13), int64(1))
	f.Add(int64(1e9), int64(time.Nanosecond*3), int64(0), int64(2), int64(-1e9), int64(2e9))
	f.Fuzz(func(t *testing.T, rate, period, burst, cost, ahead, step int64) {
		lim := sluice.Limit{Rate: rate, Period: time.Duration(period), Burst: burst}
		p, err := algo.NewGCRAParams(lim)
		if err != nil || cost < 1 || cost > lim.Capacity() {
			return
		}
		now := int64(1_800_000_000_000_000_000)
		tat := int64(0)
		if ahead > -now && ahead < 1<<60 {
			tat = now + ahead
		}
		for i := range 4 {
			req := sluice.Request{Key: "k", Algorithm: sluice.GCRA, Limit: lim, Cost: cost}
			want, st, err := algo.Apply(sluice.OpAllow, algo.State{A: tat}, req, now)
			if err != nil {
				t.Fatal(err)
			}
			got, next := algo.GCRAAllow(tat, &p, cost, now)
			if got != want || (want.Allowed && next != st.A) {
				t.Fatalf("step %d, %v cost %d, TAT %d at %d:\nGCRAAllow %+v TAT %d\nApply     %+v TAT %d", i, lim, cost, tat, now, got, next, want, st.A)
			}
			if want.Allowed {
				tat = next
			}
			if step > 0 && step < 1<<50 {
				now += step
			}
		}
	})
}
