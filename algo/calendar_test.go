package algo_test

import (
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
)

// A calendar window's state lives until its window ends (a store's TTL),
// not Period after its start.
func TestCalendarExpiry(t *testing.T) {
	ny, err := sluice.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	req := sluice.Request{Key: "k", Algorithm: sluice.FixedWindow, Limit: sluice.PerCalendar(5, sluice.Calendar{Unit: sluice.Month, Location: ny}), Cost: 1}
	now := time.Date(2026, 2, 10, 12, 0, 0, 0, ny)
	d, st, err := algo.Apply(sluice.OpAllow, algo.State{}, req, now.UnixNano())
	if err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	end := time.Date(2026, 3, 1, 0, 0, 0, 0, ny)
	if got := algo.Expiry(&st, &req); got != end.UnixNano() {
		t.Fatalf("expiry %s, want %s", time.Unix(0, got), end)
	}
	if d.ResetAfter != end.Sub(now) {
		t.Fatalf("ResetAfter %s, want %s", d.ResetAfter, end.Sub(now))
	}
}

// CalendarBounds covers the skew around now with whole seconds, and
// stays short.
func TestCalendarBounds(t *testing.T) {
	k, err := sluice.LoadLocation("Pacific/Kiritimati")
	if err != nil {
		t.Fatal(err)
	}
	c := sluice.Calendar{Unit: sluice.Day, Location: k}
	for _, at := range []time.Time{
		time.Date(2027, 1, 1, 0, 5, 0, 0, k),   // just after a boundary
		time.Date(2027, 1, 1, 23, 55, 0, 0, k), // just before one
		time.Date(2027, 1, 1, 12, 0, 0, 0, k),
	} {
		now := at.UnixNano()
		b := algo.CalendarBounds(c, now, 15*time.Minute)
		if len(b) < 2 || len(b) > 3 {
			t.Fatalf("%s: %d boundaries %v", at, len(b), b)
		}
		if b[0]*1e9 > now-int64(15*time.Minute) || b[len(b)-1]*1e9 <= now+int64(15*time.Minute) {
			t.Fatalf("%s: %v does not cover ±15 min", at, b)
		}
		for i := 1; i < len(b); i++ {
			if s, _ := c.WindowNanos(b[i-1] * 1e9); s != b[i-1]*1e9 || b[i] <= b[i-1] {
				t.Fatalf("%s: %v are not consecutive window starts", at, b)
			}
		}
	}
	// A huge skew is bounded.
	if b := algo.CalendarBounds(c, time.Date(2027, 1, 1, 0, 0, 0, 0, k).UnixNano(), 400*24*time.Hour); len(b) > algo.MaxCalendarWindows+2 {
		t.Fatalf("%d boundaries for a 400-day skew", len(b))
	}
}
