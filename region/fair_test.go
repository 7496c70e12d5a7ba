package region_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
)

// TestGlobalFairShare: a key at its limit (twice the limit offered for
// 3 s) has its refill shared by the regions' demand, whatever their
// distance from the home (eu; us 40ms and ap 150ms one way away): with
// even demand each region admits about a third, with 90 % of the demand
// in eu and 10 % in ap about 90/10. Before the demand table the home's
// own calls took each unit as it refilled: ap admitted 69-127 of ~1240,
// 0.2-0.3 of its third (docs/regions.md, fairness).
//
// The bound asserted: each region's part of the admissions in the steady
// part (from 1 s on, 2 s: ~800 units) is within [0.5, 2] × its part of
// the demand. The table allots exactly by the reported demand, but the
// admissions differ from the allotment by (a) a region's allowance, up to
// C × its part (33 units here, 4 % of the steady part's 800), carried
// in or out of the span, (b) the units its share holds when the span
// ends, charged and not spent yet (up to a fetch and the low-water mark
// per instance, ~70 at most, 9 %), (c) the demand's 0.5 s moving
// average, noisy on a loaded host (a region's estimate off by 20 % moves
// its part by as much), and (d) a fetch the table had not yet seen the
// key at its limit for (refunded: under-admission). For a third (267)
// these add to ±30-40 %, so [0.5, 2] holds on a loaded host and still
// fails the first-come home, which left ap 0.2-0.3 of its third. The
// bound (C + r·t + 1) and the use floors are TestGlobalBound's.
func TestGlobalFairShare(t *testing.T) {
	w := newWorld(t, worldOpts{home: "eu"})
	lim := sluice.Limit{Rate: 400, Period: time.Second, Burst: 100}
	for _, c := range []struct {
		name  string
		share func(time.Duration) []float64
		floor float64
	}{
		{"even", even, 0.90},
		{"90-10", func(time.Duration) []float64 { return []float64{0.9, 0, 0.1} }, 0.95},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := sluice.Request{Key: w.global + "fair-" + c.name, Algorithm: sluice.GCRA, Limit: lim, Cost: 1}
			var held1 int64
			r := w.run(t, load{req: req, rate: 2 * float64(lim.Rate), d: 3 * time.Second, share: c.share, during: func(_ context.Context, start time.Time) {
				time.Sleep(time.Until(start.Add(time.Second))) // the measure's schedule
				held1 = w.held(t, req.Key)
			}})
			heldEnd := w.held(t, req.Key)
			if v, err := w.srv["eu"].Do(context.Background(), "HGETALL", "sluice:fair:"+req.Key); err == nil {
				t.Logf("table: %v", v)
			}
			for _, from := range []time.Duration{0, 500 * time.Millisecond, time.Second, 2 * time.Second} {
				t.Logf("from %s: eu store %d share %d, ap %d", from, r.count("eu", from, from+500*time.Millisecond, func(e event) bool { return e.allowed && e.src == sluice.FromStore }), r.count("eu", from, from+500*time.Millisecond, func(e event) bool { return e.allowed && e.src == sluice.FromShare }), r.count("ap", from, from+500*time.Millisecond, func(e event) bool { return e.allowed }))
			}
			t.Log(r)
			for _, name := range regionNames {
				for _, s := range w.inst[name] {
					t.Logf("%s: %+v", name, s.Stats())
				}
			}
			if n, err := r.errs(); n > 0 {
				t.Fatalf("%d errors, first: %v", n, err)
			}
			a, ideal := checkBucket(t, lim, r)
			u := utilization(lim, r, held1, heldEnd)
			t.Logf("admitted %d of an ideal %.0f; utilization after 1s %.3f", a, ideal, u)
			if !r.offered(t, 2*float64(lim.Rate), time.Second) {
				return
			}
			if u < floor(c.floor) {
				t.Fatalf("utilization %.3f < %.2f", u, floor(c.floor))
			}
			allowed := func(e event) bool { return e.allowed }
			total := r.count("", time.Second, r.planned, allowed)
			parts := c.share(0)
			for i, name := range regionNames {
				if parts[i] == 0 {
					continue
				}
				n := r.count(name, time.Second, r.planned, allowed)
				got := float64(n) / float64(total)
				t.Logf("%s: %d of %d admitted from 1s (%.3f, its demand %.2f: %.2f×)", name, n, total, got, parts[i], got/parts[i])
				if got < 0.5*parts[i] || got > 2*parts[i] {
					t.Errorf("%s admitted %.3f of the steady part, its demand %.2f: outside [0.5, 2]×", name, got, parts[i])
				}
			}
		})
	}
}
