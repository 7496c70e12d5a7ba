package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
)

// TestPlainMixedFleet asserts docs/redis.md's bound for a fleet running
// with and without PlainWindows (a rolling upgrade to serve's default):
// the two layouts count apart, so a fixed window admits at most 2x its
// limit while both run (here exactly 2x: each layout fills its own), and
// exactly its limit from the first window in which only one runs.
func TestPlainMixedFleet(t *testing.T) {
	url := redistest.Standalone(t).URL()
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC))
	plain := newStore(t, Options{URL: url, Clock: clk, PlainWindows: true, DisableDenyCache: true})
	scripts := newStore(t, Options{URL: url, Clock: clk, DisableDenyCache: true})
	const limit = 10
	req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.FixedWindow, Limit: sluice.PerMinute(limit), Cost: 1}
	admitted := func(stores ...*Store) (n int64) {
		t.Helper()
		for i := range 5 * limit {
			d, err := stores[i%len(stores)].Apply(context.Background(), sluice.OpAllow, req)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				n++
			}
		}
		return n
	}
	if n := admitted(plain, scripts); n != 2*limit {
		t.Errorf("mixed fleet: %d admitted in one window, want 2x the limit (%d), the documented bound", n, 2*limit)
	}
	clk.Advance(time.Minute) // the next window, the old layout's instances gone
	if n := admitted(plain); n != limit {
		t.Errorf("upgraded fleet: %d admitted in one window, want the limit (%d)", n, limit)
	}
}
