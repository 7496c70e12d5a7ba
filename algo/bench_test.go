package algo_test

import (
	"testing"
	"time"
	_ "time/tzdata"

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

// BenchmarkCalendarWindow compares a fixed window on calendar days in a
// zone with DST (Europe/Berlin) against the epoch-aligned fixed window of
// the same rate, the baseline, in one run: the price of the zone rules.
func BenchmarkCalendarWindow(b *testing.B) {
	berlin, err := sluice.LoadLocation("Europe/Berlin")
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		limit sluice.Limit
	}{
		{"epoch_day", sluice.PerDay(1 << 40)},
		{"calendar_day_berlin", sluice.PerCalendar(1<<40, sluice.Calendar{Unit: sluice.Day, Location: berlin})},
		{"calendar_month_berlin", sluice.PerCalendar(1<<40, sluice.Calendar{Unit: sluice.Month, Location: berlin})},
	} {
		b.Run(c.name, func(b *testing.B) {
			req := sluice.Request{Key: "k", Algorithm: sluice.FixedWindow, Limit: c.limit, Cost: 1}
			now := int64(1_790_000_000_000_000_000)
			var st algo.State
			b.ReportAllocs()
			for b.Loop() {
				now += 1000
				_, st, _ = algo.Apply(sluice.OpAllow, st, req, now)
			}
		})
	}
}
