package memstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
)

// BenchmarkReserve compares a reservation (Request.MaxWait) with a plain
// admission on one key, both always admitted: the cost of delay mode's
// decision in memory. Report it as a ratio to the plain one.
func BenchmarkReserve(b *testing.B) {
	for _, c := range []struct {
		name string
		wait time.Duration
	}{{"plain", 0}, {"reserve", time.Second}} {
		b.Run(c.name, func(b *testing.B) {
			s := benchStore(b)
			ctx := context.Background()
			req := sluice.Request{Key: "user:42", Algorithm: sluice.GCRA, Limit: huge, Cost: 1, MaxWait: c.wait}
			b.ReportAllocs()
			for b.Loop() {
				if d, _ := s.Apply(ctx, sluice.OpAllow, req); !d.Allowed {
					b.Fatal("denied")
				}
			}
		})
	}
}
