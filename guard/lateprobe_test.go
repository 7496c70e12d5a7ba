package guard_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/sluice-io/sluice/guard"
	"github.com/sluice-io/sluice/internal/redistest"
)

// TestLateProbeAskedAgain: a node whose answers are read late (here a
// proxy delays each 150 ms, past the 100 ms probe deadline, as a loaded
// machine reads a live node's answers late) is asked again with a longer
// deadline before a probe counts as failed: its circuit stays closed with
// no traffic. Two late probes in a row opened it, and the policy answered
// a live node's keys. A node that does not answer at all still opens.
func TestLateProbeAskedAgain(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Standalone(t)
	px := redistest.NewProxy(t, srv.Addr)
	g, err := guard.New(newRedisStore(t, px.URL()), guard.Options{Instances: 1, ProbeInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	waitUntil(t, "ready", 10*time.Second, func() bool { return g.Ready(ctx) == nil })
	px.Delay.Store(int64(150 * time.Millisecond))
	// The probe's rhythm, not a synchronisation: about five probe rounds
	// of late answers.
	time.Sleep(time.Second)
	if st := g.Stats(); st.Openings != 0 {
		t.Fatalf("a node answering in 150 ms had its circuit opened %d times by late probes", st.Openings)
	}
	px.Delay.Store(0)
	px.Hold.Store(true)
	waitUntil(t, "circuit open on a black hole", 10*time.Second, func() bool { return g.Stats().Open == 1 })
	px.Hold.Store(false)
	waitUntil(t, "circuit closed", 10*time.Second, func() bool { return g.Stats().Open == 0 })
}
