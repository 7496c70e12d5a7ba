package guard_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/guard"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/redisstore"
)

func newRedisStore(t testing.TB, url string) *redisstore.Store {
	t.Helper()
	rs, err := redisstore.New(context.Background(), redisstore.Options{URL: url, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rs.Close() })
	return rs
}

// Local's debts are charged once, also when Redis answers slower than the
// call deadline but faster than the probe's: each settling charge then
// reached Redis, missed its 20ms deadline, was owed again and sent again
// at the next probe, so the key was charged its debt once per probe while
// the slowness lasted, and denied for that long after (a debt of 3 became
// 3 per 50ms). Settling charges now have the settle pass's deadline.
func TestLocalDebtChargedOnceWhenRedisIsSlow(t *testing.T) {
	srv := redistest.Standalone(t)
	px := redistest.NewProxy(t, srv.Addr)
	g, err := guard.New(newRedisStore(t, px.URL()), guard.Options{
		Instances: 1, Timeout: 20 * time.Millisecond, ProbeInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	direct := newRedisStore(t, srv.URL())
	ctx := context.Background()
	// 100 an hour: nothing refills during the test.
	req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 100, Period: time.Hour, Burst: 100}, Cost: 1}
	remaining := func() int64 {
		d, err := direct.Apply(ctx, sluice.OpPeek, req)
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}
	waitUntil(t, "guard ready", 10*time.Second, func() bool { return g.Ready(ctx) == nil })
	if d, err := g.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed || d.Degraded {
		t.Fatalf("healthy: %+v %v", d, err)
	}
	// A black hole: the probe opens the circuit, with no traffic.
	px.Hold.Store(true)
	waitUntil(t, "circuit open", 10*time.Second, func() bool { return g.Stats().Open == 1 })
	for range 3 {
		if d, err := g.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed || d.Fallback != "local" {
			t.Fatalf("circuit open: %+v %v", d, err)
		}
	}
	// Redis answers again, 60ms late: probes (100ms deadline) succeed,
	// calls (20ms) do not.
	px.Delay.Store(int64(60 * time.Millisecond))
	px.Hold.Store(false)
	want := int64(100 - 1 - 3)
	waitUntil(t, "debt settled or charged twice", 20*time.Second, func() bool {
		return remaining() < want || g.Stats().Open == 0
	})
	px.Delay.Store(0)
	waitUntil(t, "circuit closed", 10*time.Second, func() bool { return g.Stats().Open == 0 })
	if got := remaining(); got != want {
		t.Fatalf("after settling: %d remaining, want %d: the debt of 3 was charged %d times", got, want, (100-1-got)/3)
	}
}
