package algo_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
	"github.com/sluice-io/sluice/storetest"
)

// TestOracleXTimeRate compares GCRA's and the token bucket's decisions
// with golang.org/x/time/rate's token bucket, the limiter most Go code
// uses, over random arrival patterns (bursts at one instant, short and
// long gaps, costs up to 3) on an injected clock. Limits with an odd
// interval (7/s, 3/s, 7/min) are among them: a burst must admit what
// x/time admits, not one event fewer or more.
//
// The two differ only at a boundary: sluice rounds the interval up to a
// whole nanosecond, x/time computes in floats. An arrival within delta of
// the instant at which x/time's tokens reach its cost is not offered to
// either (delta covers the rounding, under a nanosecond per interval since
// the bucket was last full, and the floats' error).
func TestOracleXTimeRate(t *testing.T) {
	limits := []sluice.Limit{
		sluice.PerSecond(10),
		sluice.PerSecond(7),
		{Rate: 3, Period: time.Second, Burst: 5},
		sluice.PerMinute(3),
		sluice.PerMinute(7),
		{Rate: 100, Period: time.Second, Burst: 1},
		{Rate: 11, Period: time.Hour, Burst: 4},
		{Rate: 1000, Period: 7 * time.Second, Burst: 50},
	}
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket} {
		for _, l := range limits {
			for seed := range uint64(8) {
				oracleRun(t, a, l, seed)
			}
		}
	}
}

func oracleRun(t *testing.T, a sluice.Algorithm, l sluice.Limit, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, uint64(l.Rate)<<32|uint64(l.Period/time.Millisecond)))
	iv := l.Interval()
	delta := 10*time.Microsecond + time.Duration(iv/1000)
	lim := rate.NewLimiter(rate.Limit(float64(l.Rate)/l.Period.Seconds()), int(l.Capacity()))
	var st algo.State
	now := storetest.T0
	var offered, admitted, skipped int
	for range 2000 {
		// Gaps: often none (a burst), else up to three intervals.
		switch r := rng.IntN(10); {
		case r < 3:
		case r < 9:
			now = now.Add(time.Duration(rng.Int64N(iv)))
		default:
			now = now.Add(time.Duration(rng.Int64N(3 * iv)))
		}
		cost := 1 + rng.Int64N(min(3, l.Capacity()))
		lo, hi := lim.TokensAt(now.Add(-delta)), lim.TokensAt(now.Add(delta))
		if lo < float64(cost) && hi >= float64(cost) {
			skipped++ // at a boundary: rounding decides
			continue
		}
		req := sluice.Request{Key: "k", Algorithm: a, Limit: l, Cost: cost}
		d, next, err := algo.Apply(sluice.OpAllow, st, req, now.UnixNano())
		if err != nil {
			t.Fatalf("%s %s: %v", a, l, err)
		}
		want := lim.AllowN(now, int(cost))
		offered++
		if d.Allowed != want {
			t.Fatalf("%s %s seed %d, arrival %d at +%s, cost %d: sluice allowed %v, x/time %v (x/time had %.6f tokens; sluice %+v)",
				a, l, seed, offered, now.Sub(storetest.T0), cost, d.Allowed, want, lo, d)
		}
		if d.Allowed {
			st = next
			admitted++
		}
	}
	if skipped > offered/20 {
		t.Errorf("%s %s seed %d: %d of %d arrivals skipped at a boundary: delta %s too wide", a, l, seed, skipped, offered+skipped, delta)
	}
	if admitted == 0 || admitted == offered {
		t.Errorf("%s %s seed %d: %d of %d admitted: the pattern does not test the limit", a, l, seed, admitted, offered)
	}
}
