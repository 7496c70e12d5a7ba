package memstore

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
)

// TestSweepLoop drives the background loop with a hand-fed tick.
func TestSweepLoop(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e9, 0))
	s, _ := New(Options{Clock: clk, SweepInterval: -1})
	s.done = make(chan struct{})
	tick := make(chan time.Time)
	go s.sweepLoop(tick)
	if _, err := s.Apply(context.Background(), sluice.OpAllow, sluice.Request{Key: "k", Algorithm: sluice.GCRA, Limit: sluice.PerSecond(1), Cost: 1}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour)
	tick <- time.Time{} // received: the sweep runs
	tick <- time.Time{} // received again: the first sweep has finished
	if s.Len() != 0 {
		t.Fatalf("background sweep left %d keys", s.Len())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
