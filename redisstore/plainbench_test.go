package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
)

// BenchmarkPlainAllow: one plain-path decision (OpAllow, cost 1) on
// real Redis, with the test clock mid-window: cold keys (each key once)
// and warm ones (1000 keys, over and over). For allocs/op; its time is
// the round trip's.
func BenchmarkPlainAllow(b *testing.B) {
	url := redistest.Standalone(b).URL()
	for _, warm := range []bool{false, true} {
		b.Run(map[bool]string{false: "cold", true: "warm"}[warm], func(b *testing.B) {
			clk := clock.NewFake(time.Date(2026, 1, 1, 0, 30, 0, 0, time.UTC))
			s := newStore(b, Options{URL: url, Clock: clk, PlainWindows: true, DisableDenyCache: true})
			prefix := redistest.Prefix(b)
			keys := make([]string, 1000)
			for i := range keys {
				keys[i] = prefix + strconv.Itoa(i)
			}
			req := sluice.Request{Algorithm: sluice.FixedWindow, Limit: sluice.Limit{Rate: 1e9, Period: time.Hour}, Cost: 1}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if warm {
					req.Key = keys[i%len(keys)]
				} else {
					b.StopTimer()
					req.Key = prefix + "c" + strconv.Itoa(i)
					b.StartTimer()
				}
				if d, err := s.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed {
					b.Fatalf("%+v %v", d, err)
				}
			}
			if s.Stats().Plain == 0 {
				b.Fatal("the plain path was not taken")
			}
		})
	}
}
