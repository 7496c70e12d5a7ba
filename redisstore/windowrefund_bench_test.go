package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
)

// BenchmarkWindowRefund: a single fixed window's refund on real Redis,
// as a settlement sends one: naming no window (ahead=0, the lean
// fixedwindow_fast.lua, as before refunds named their window) and naming
// its charge's window (Request.ReservedAhead: the algorithm's script,
// which checks it), in both layouts. Its time is mostly the round trip's.
func BenchmarkWindowRefund(b *testing.B) {
	url := redistest.Standalone(b).URL()
	for _, plain := range []bool{false, true} {
		for _, ahead := range []time.Duration{0, 10 * time.Minute} {
			name := map[bool]string{false: "scripts", true: "plain"}[plain] + map[bool]string{false: "/ahead=0", true: "/ahead"}[ahead > 0]
			b.Run(name, func(b *testing.B) {
				clk := clock.NewFake(time.Date(2026, 1, 1, 0, 30, 0, 0, time.UTC))
				s := newStore(b, Options{URL: url, Clock: clk, PlainWindows: plain, DisableDenyCache: true})
				req := sluice.Request{Key: redistest.Prefix(b) + "w", Algorithm: sluice.FixedWindow, Limit: sluice.Limit{Rate: 1 << 40, Period: time.Hour}, Cost: 1 << 39}
				ctx := context.Background()
				if d, err := s.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed {
					b.Fatalf("%+v %v", d, err)
				}
				req.Cost, req.ReservedAhead = 1, ahead
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					if d, err := s.Apply(ctx, sluice.OpRefund, req); err != nil || !d.Allowed {
						b.Fatalf("%+v %v", d, err)
					}
				}
			})
		}
	}
}
