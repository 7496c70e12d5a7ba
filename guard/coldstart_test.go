package guard_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/guard"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/redisstore"
)

// TestColdStartWithinBound starts three instances while their Redis is not
// up yet. Under the default local policy they had never read the instance
// count, so each counted itself alone and the fleet admitted 3× the limit.
// Now an instance that has not read the count denies (and is not ready)
// until it has, unless Options.Instances (serve's store.instances) gives
// the fleet's size: then each keeps limit ÷ 3. Once Redis is up the count
// is read and the decisions are Redis's.
func TestColdStartWithinBound(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewStandalone(t)
	srv.Kill() // not up yet: its port refuses connections
	prefix := redistest.Prefix(t)
	// 30 an hour: nothing refills during the test.
	limit := sluice.Limit{Rate: 30, Period: time.Hour, Burst: 30}
	start := func(instances int, key string) []*guard.Guard {
		var gs []*guard.Guard
		for range 3 {
			rs, err := redisstore.New(ctx, redisstore.Options{URL: srv.URL(), InstancesKey: prefix + key + ":instances", Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			g, err := guard.New(rs, guard.Options{Instances: instances, Timeout: 20 * time.Millisecond, ProbeInterval: 20 * time.Millisecond,
				HeartbeatInterval: 100 * time.Millisecond, CloseStore: true, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = g.Close() })
			gs = append(gs, g)
		}
		for _, g := range gs {
			waitUntil(t, "circuit open", 10*time.Second, func() bool { return g.Stats().Open == 1 })
		}
		return gs
	}
	offer := func(gs []*guard.Guard, key string) (admitted int) {
		req := sluice.Request{Key: prefix + key, Algorithm: sluice.GCRA, Limit: limit, Cost: 1}
		for _, g := range gs {
			for range 2 * limit.Rate {
				d, err := g.Apply(ctx, sluice.OpAllow, req)
				if err != nil || !d.Degraded || d.Fallback != "local" {
					t.Fatalf("Redis down: %+v %v", d, err)
				}
				if d.Allowed {
					admitted++
				}
			}
		}
		return admitted
	}

	learn := start(0, "learn")
	if got := offer(learn, "learn"); got != 0 {
		t.Errorf("count never read: the fleet admitted %d of a limit of %d, want 0 (it does not know its share)", got, limit.Rate)
	}
	if err := learn[0].Ready(ctx); err == nil || !strings.Contains(err.Error(), "instance count") {
		t.Errorf("Ready before the count is read: %v", err)
	}
	fixed := start(3, "fixed")
	if got := offer(fixed, "fixed"); got != int(limit.Rate) {
		t.Errorf("Instances 3: the fleet admitted %d, want the limit's %d (a third on each)", got, limit.Rate)
	}

	srv.Restart(t)
	for _, g := range learn {
		waitUntil(t, "ready", 10*time.Second, func() bool { return g.Ready(ctx) == nil })
		waitUntil(t, "the count confirmed", 10*time.Second, func() bool { return g.Instances() == 3 })
	}
	req := sluice.Request{Key: prefix + "learn", Algorithm: sluice.GCRA, Limit: limit, Cost: 1}
	if d, err := learn[0].Apply(ctx, sluice.OpAllow, req); err != nil || d.Degraded || !d.Allowed || d.Remaining != limit.Rate-1 {
		t.Fatalf("Redis up: %+v %v, want Redis's decision with %d left", d, err, limit.Rate-1)
	}
}
