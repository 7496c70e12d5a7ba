package guard

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-io/sluice/memstore"
)

// TestReadyUsesTheColdStartRule: readiness follows the rule Local decides
// by. An instance is not ready (ErrInstancesUnknown, which /readyz answers
// 503 under the local policy) until two heartbeats have read the instance
// count, for as long as Local denies: after one, instances started
// together while the store was down may each have counted only itself.
// With Options.Instances it is ready at once.
func TestReadyUsesTheColdStartRule(t *testing.T) {
	ctx := context.Background()
	m, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	b := newBeats(m, 1) // the first to renew counts itself alone
	g := newGuard(t, b, Options{Timeout: time.Minute, HeartbeatInterval: time.Millisecond})
	if g.countKnown() {
		t.Fatal("one heartbeat read: Local takes the count as known")
	}
	if err := g.Ready(ctx); !errors.Is(err, ErrInstancesUnknown) {
		t.Fatalf("Ready after one heartbeat: %v, want ErrInstancesUnknown (Local still denies)", err)
	}
	// The other policies do not divide by the count: ready.
	if err := g.WithPolicy(FailClosed).Ready(ctx); err != nil {
		t.Fatalf("fail_closed's Ready after one heartbeat: %v", err)
	}
	<-b.entered
	b.next <- 3
	<-b.entered // the second heartbeat's count is taken
	if !g.countKnown() {
		t.Fatal("two heartbeats read: the count is not known")
	}
	if err := g.Ready(ctx); err != nil {
		t.Fatalf("Ready after two heartbeats: %v", err)
	}

	// Instances given: ready whatever the heartbeats read.
	fb := newBeats(m, 1)
	fixed := newGuard(t, fb, Options{Timeout: time.Minute, Instances: 3, HeartbeatInterval: time.Hour})
	if err := fixed.Ready(ctx); err != nil {
		t.Fatalf("Ready with Instances set, one heartbeat read: %v", err)
	}
}
