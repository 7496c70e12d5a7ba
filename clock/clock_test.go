package clock_test

import (
	"testing"
	"time"

	"github.com/sluice-io/sluice/clock"
)

func TestSystemTracksWallClockAndNeverGoesBack(t *testing.T) {
	c := clock.NewSystem()
	before := time.Now().UnixNano()
	now := c.Now()
	after := time.Now().UnixNano()
	// anchored to the wall clock at creation, within a millisecond
	if now < before-int64(time.Millisecond) || now > after+int64(time.Millisecond) {
		t.Fatalf("System.Now %d outside [%d, %d]", now, before, after)
	}
	prev := now
	for range 10000 {
		n := c.Now()
		if n < prev {
			t.Fatalf("clock went back: %d after %d", n, prev)
		}
		prev = n
	}
}

func TestFake(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := clock.NewFake(t0)
	if f.Now() != t0.UnixNano() || !f.Time().Equal(t0) {
		t.Fatal("NewFake did not start at t0")
	}
	if got := f.Advance(1500 * time.Millisecond); got != t0.Add(1500*time.Millisecond).UnixNano() {
		t.Fatalf("Advance returned %d", got)
	}
	f.Set(t0)
	if f.Now() != t0.UnixNano() {
		t.Fatal("Set did not move the clock")
	}
}

func BenchmarkSystemNow(b *testing.B) {
	c := clock.NewSystem()
	for b.Loop() {
		_ = c.Now()
	}
}

func BenchmarkTimeNow(b *testing.B) {
	for b.Loop() {
		_ = time.Now()
	}
}

func BenchmarkCoarseNow(b *testing.B) {
	c := clock.NewCoarse(0)
	for b.Loop() {
		_ = c.Now()
	}
}

func BenchmarkCoarseNowParallel(b *testing.B) {
	c := clock.NewCoarse(0)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = c.Now()
		}
	})
}
