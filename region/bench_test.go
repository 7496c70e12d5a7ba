package region_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
)

// BenchmarkGlobalVsRegional decides, in ap (150ms one way from the home),
// a global key and a regional key in turn, one call each per iteration in
// one interleaved run, and reports both p99s and what the global key adds:
// its decisions come from ap's share, one script on ap's Redis, like the
// regional key's, and its fetches go on in the background.
//
//	go test -run '^$' -bench GlobalVsRegional -benchtime 2000x ./region/
func BenchmarkGlobalVsRegional(b *testing.B) { benchGlobalVsRegional(b, "ap") }

// BenchmarkGlobalHomeVsRegional is BenchmarkGlobalVsRegional in the home
// region (eu), where a global key is decided by the region's store (and
// reports its demand to the key's demand table every 50ms, fair.go).
func BenchmarkGlobalHomeVsRegional(b *testing.B) { benchGlobalVsRegional(b, "eu") }

// benchGlobalVsRegional decides a global key and a regional key in turn
// in region.
func benchGlobalVsRegional(b *testing.B, region string) {
	w := newWorld(b, worldOpts{home: "eu"})
	s := w.inst[region][0]
	lim := sluice.Limit{Rate: 1 << 30, Period: time.Second}
	global := sluice.Request{Key: w.global + "bench", Algorithm: sluice.GCRA, Limit: lim, Cost: 1}
	regional := sluice.Request{Key: w.global[:len(w.global)-2] + "r:bench", Algorithm: sluice.GCRA, Limit: lim, Cost: 1}
	ctx := context.Background()
	// Warm for a second and a half: the first global call waits for ap's
	// first share, and the demand estimate (a 0.5s moving average) sizes
	// the shares to the loop's rate.
	for warm := time.Now(); time.Since(warm) < 1500*time.Millisecond; {
		if _, err := s.Apply(ctx, sluice.OpAllow, global); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Apply(ctx, sluice.OpAllow, regional); err != nil {
			b.Fatal(err)
		}
	}
	var denied int
	g := make([]time.Duration, 0, b.N)
	r := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		reqs := [2]*sluice.Request{&global, &regional}
		if i%2 == 1 {
			reqs[0], reqs[1] = reqs[1], reqs[0]
		}
		for _, req := range reqs {
			t0 := time.Now()
			d, err := s.Apply(ctx, sluice.OpAllow, *req)
			took := time.Since(t0)
			if err != nil {
				b.Fatal(err)
			}
			if !d.Allowed {
				denied++
			}
			if req == &global {
				g = append(g, took)
			} else {
				r = append(r, took)
			}
		}
	}
	b.StopTimer()
	pg, pr := p(g, 0.99), p(r, 0.99)
	b.ReportMetric(float64(pr.Microseconds()), "p99-regional-µs")
	b.ReportMetric(float64(pg.Microseconds()), "p99-global-µs")
	b.ReportMetric(float64(p(r, 0.5).Microseconds()), "p50-regional-µs")
	b.ReportMetric(float64(p(g, 0.5).Microseconds()), "p50-global-µs")
	b.ReportMetric(float64(pg-pr)/1e3, "p99-added-µs")
	b.ReportMetric(float64(denied), "denied")
}

func p(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}
