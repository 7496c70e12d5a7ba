package algo_test

import (
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
)

func BenchmarkGCRAAllow(b *testing.B) {
	p, _ := algo.NewGCRAParams(sluice.Limit{Rate: 1 << 40, Period: time.Second, Burst: 1 << 40})
	now := int64(1_700_000_000_000_000_000)
	var tat int64
	for b.Loop() {
		now++
		_, tat = algo.GCRAAllow(tat, &p, 1, now)
	}
}

func BenchmarkApply(b *testing.B) {
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.FixedWindow, sluice.SlidingWindowCounter} {
		b.Run(a.String(), func(b *testing.B) {
			req := sluice.Request{Key: "k", Algorithm: a, Limit: sluice.Limit{Rate: 1 << 40, Period: time.Second}, Cost: 1}
			now := int64(1_700_000_000_000_000_000)
			var st algo.State
			b.ReportAllocs()
			for b.Loop() {
				now++
				_, st, _ = algo.Apply(sluice.OpAllow, st, req, now)
			}
		})
	}
}
