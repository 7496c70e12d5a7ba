package upstream

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestFailCircuit: FailThreshold failures in quick succession (from any
// replica: they share the store) cool the upstream model for every
// replica for FailCooldown; then one request probes it, and a probe that
// fails right away cools it again.
func TestFailCircuit(t *testing.T) {
	defs, routes := twoUpstreams()
	defs, routes = defs[:1], map[string][]Target{"m": routes["m"][:1]} // only a
	p, clk := testPool(t, defs, routes, Routing{})
	// A second replica on the same store and clock.
	q, err := New(Options{Upstreams: defs, Routes: routes, Routing: p.routing, Store: p.store, Getenv: func(string) string { return "k" }, Now: clk.Time, Metrics: p.metrics})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ta, tb := p.Route("m", "").Targets[0], q.Route("m", "").Targets[0]
	for i := range FailThreshold - 1 {
		p.Fail(ctx, ta)
		if g, _, err := q.Acquire(ctx, q.Route("m", ""), false, 1, 1, nil); err != nil || g == nil {
			t.Fatalf("after %d failures the other replica was refused (%v)", i+1, err)
		}
	}
	p.Fail(ctx, ta)
	g, wait, err := q.Acquire(ctx, q.Route("m", ""), false, 1, 1, nil)
	// FailCooldown, or the 6 s interval of a's 10 rpm.
	if err != nil || g != nil || wait < FailCooldown*9/10 || wait > 6*time.Second {
		t.Fatalf("after %d failures the other replica got %v, wait %v (%v); want a cooldown of %v", FailThreshold, g, wait, err, FailCooldown)
	}
	clk.Advance(wait)
	if g, _, _ := q.Acquire(ctx, q.Route("m", ""), false, 1, 1, nil); g == nil {
		t.Fatal("no probe after the cooldown")
	}
	q.Fail(ctx, tb) // the probe failed
	if n := testutil.ToFloat64(p.metrics.cooldowns.WithLabelValues("a", "m-a")); n != 2 {
		t.Fatalf("%v cooldowns, want 2: a failed probe did not cool it again", n)
	}
	if g, _, _ := p.Acquire(ctx, p.Route("m", ""), false, 1, 1, nil); g != nil {
		t.Fatal("admitted right after a failed probe")
	}
}
