package guard_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/guard"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/lease"
)

// offer sends n requests for req through g, one after another, and counts
// those admitted.
func offer(t *testing.T, g *guard.Guard, req sluice.Request, n int) (admitted int64) {
	t.Helper()
	for range n {
		d, err := g.Apply(context.Background(), sluice.OpAllow, req)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	return admitted
}

// TestLeasedWindowPauseWithinBound: a leased fixed window, Redis paused
// (a proxy holding every byte) while the lease holds a chunk. Local's seed
// was the lease's Remaining, which counts the chunk and what Redis had
// left at the last fetch: Local handed that out, and the lease then spent
// its chunk again when Redis was back (over the limit by a chunk per
// instance). Local now starts a leased key empty, and the window's total
// stays within the limit + 1.
func TestLeasedWindowPauseWithinBound(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Standalone(t)
	px := redistest.NewProxy(t, srv.Addr)
	ls, err := lease.New(lease.Options{All: true, Store: newRedisStore(t, px.URL())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ls.Close() })
	g, err := guard.New(ls, guard.Options{Instances: 1, ProbeInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	// A day's window: it does not end during the test but at midnight UTC.
	lim := sluice.Limit{Rate: 1000, Period: 24 * time.Hour}
	req := sluice.Request{Key: redistest.Prefix(t) + "hot", Algorithm: sluice.FixedWindow, Limit: lim, Cost: 1}
	waitUntil(t, "ready", 10*time.Second, func() bool { return g.Ready(ctx) == nil })
	// Hot until the lease holds a chunk.
	admitted := offer(t, g, req, 200)
	waitUntil(t, "a chunk held", 10*time.Second, func() bool {
		admitted += offer(t, g, req, 1)
		return ls.Stats().Hits > 20 && ls.Stats().FetchedUnits > uint64(ls.Stats().Hits)+1
	})
	px.Hold.Store(true)
	waitUntil(t, "circuit open", 10*time.Second, func() bool { return g.Stats().Open == 1 })
	local := offer(t, g, req, int(lim.Rate))
	px.Hold.Store(false)
	waitUntil(t, "circuit closed", 10*time.Second, func() bool { return g.Stats().Open == 0 })
	admitted += local + offer(t, g, req, int(lim.Rate))
	t.Logf("admitted %d of %d (%d by local while Redis was held); %+v", admitted, lim.Rate, local, ls.Stats())
	if admitted > lim.Rate+1 {
		t.Fatalf("admitted %d in one window of %d: local spent the lease's chunk a second time", admitted, lim.Rate)
	}
}

// TestLocalWindowDebtStaysInItsWindow: what Local admitted in a window
// while Redis was away is charged to Redis before the circuit closes, but
// only while that window lasts. Charged into a later window, it starved it
// (the window after a 2 s pause admitted nothing for 0.6-0.8 s). The hold
// spans a whole window and ends just after the next begins.
func TestLocalWindowDebtStaysInItsWindow(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Standalone(t)
	px := redistest.NewProxy(t, srv.Addr)
	g, err := guard.New(newRedisStore(t, px.URL()), guard.Options{Instances: 1, ProbeInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	const p = time.Second
	lim := sluice.Limit{Rate: 100, Period: p}
	req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.FixedWindow, Limit: lim, Cost: 1}
	waitUntil(t, "ready", 10*time.Second, func() bool { return g.Ready(ctx) == nil })
	// The fault's schedule, not a synchronisation: windows are aligned to
	// the epoch, Redis's (TIME) as the guard's (same host).
	until := func(at time.Time) { time.Sleep(time.Until(at)) }
	w0 := time.Now().Truncate(p).Add(p)
	until(w0.Add(p / 2))
	px.Hold.Store(true)
	waitUntil(t, "circuit open", 5*time.Second, func() bool { return g.Stats().Open == 1 })
	until(w0.Add(p + p/10))
	if got := offer(t, g, req, 2*int(lim.Rate)); got != lim.Rate {
		t.Fatalf("local admitted %d in a window of %d", got, lim.Rate)
	}
	until(w0.Add(2*p + p/20))
	px.Hold.Store(false)
	waitUntil(t, "circuit closed", 5*time.Second, func() bool { return g.Stats().Open == 0 })
	if time.Now().After(w0.Add(2*p + p/2)) {
		t.Skip("the circuit closed late in the window: the machine is too loaded to measure it")
	}
	if got := offer(t, g, req, 2*int(lim.Rate)); got < lim.Rate-1 {
		t.Fatalf("the window after the hold admitted %d of %d: the previous window's debt was charged to it", got, lim.Rate)
	}
}
