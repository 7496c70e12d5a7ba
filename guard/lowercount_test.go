package guard

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/storetest"
)

// TestInstancesNotLoweredWhilePartitioned: while a node's circuit is open
// or Local still owes the store, heartbeats that read fewer instances do
// not lower the count, however many in a row. Fewer then means a fleet
// partitioned (the others cannot reach the membership key, or are still
// answering by Local), and a lower count would raise every instance's
// Local share while they all spend it. Once every circuit is closed and
// every debt settled, lowerAfter fresh readings lower it as before.
func TestInstancesNotLoweredWhilePartitioned(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(storetest.T0)
	m, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	b := newBeats(m, 3)
	// No background probe: the test opens and closes the circuit, and
	// settles, itself.
	g := newGuard(t, b, Options{Clock: clk, Timeout: time.Minute, ProbeInterval: time.Hour, HeartbeatInterval: time.Millisecond})
	// beat answers the heartbeat waiting now with read, and returns once
	// the next is in: its count has been taken.
	beat := func(read int) {
		b.next <- read
		<-b.entered
	}
	<-b.entered
	beat(3) // the second reading: the count is known
	if !g.countKnown() || g.Instances() != 3 {
		t.Fatalf("instances %d, known %v", g.Instances(), g.countKnown())
	}
	n := g.node("")
	n.trip()
	req := sluice.Request{Key: "k", Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 30, Period: time.Hour}, Cost: 1}
	if d, err := g.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed || d.Fallback != "local" {
		t.Fatalf("circuit open: %+v %v, want Local's admission", d, err)
	}
	if !g.local.pending() {
		t.Fatal("Local admitted and owes nothing")
	}
	for i := range 2 * lowerAfter {
		beat(1)
		if g.Instances() != 3 {
			t.Fatalf("circuit open, debts owed: reading %d of 1 instance lowered the count to %d", i+1, g.Instances())
		}
	}
	clk.Advance(time.Second)
	n.reset() // the node answers, the debts are still owed
	for i := range 2 * lowerAfter {
		beat(1)
		if g.Instances() != 3 {
			t.Fatalf("debts owed: reading %d of 1 instance lowered the count to %d", i+1, g.Instances())
		}
	}
	if !g.settle(ctx, "") || g.local.pending() {
		t.Fatal("debts not settled")
	}
	d, err := m.Apply(ctx, sluice.OpPeek, req)
	if err != nil || d.Remaining != req.Limit.Rate-1 {
		t.Fatalf("the store after settling: %+v %v, want Local's admission charged", d, err)
	}
	for i := range lowerAfter - 1 {
		beat(1)
		if g.Instances() != 3 {
			t.Fatalf("settled: reading %d of 1 instance (fewer than %d in a row since) lowered the count to %d", i+1, lowerAfter, g.Instances())
		}
	}
	beat(1)
	if g.Instances() != 1 {
		t.Fatalf("settled, %d readings of 1 in a row: instances %d, want 1", lowerAfter, g.Instances())
	}
}
