package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/metrics"
)

// downStore fails every call, as a store whose server is gone; a call whose
// context is already cancelled fails with the context's error.
type downStore struct{ calls int }

func (d *downStore) Apply(ctx context.Context, op sluice.Op, r sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, errors.New("unused")
}

func (d *downStore) ApplyAll(ctx context.Context, _ sluice.Op, _ []sluice.Request) ([]sluice.Decision, error) {
	d.calls++
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return nil, errors.New("dial tcp: connection refused")
}

// TestGuardProbeCancelledByClient: a half-open probe whose client goes away
// must not leave the circuit stuck half-open: the next call probes again.
func TestGuardProbeCancelledByClient(t *testing.T) {
	st := &downStore{}
	clk := clock.NewFake(time.Unix(1e9, 0))
	g := newGuard(st, nil, config.StoreSection{URL: "memory", FailurePolicy: config.FailOpen}, metrics.New(), clk, slog.New(slog.NewTextHandler(io.Discard, nil)))
	reqs := []sluice.Request{{Key: "k", Algorithm: sluice.GCRA, Limit: sluice.PerSecond(1), Cost: 1}}
	for range breakerThreshold {
		if _, err := g.applyAll(context.Background(), sluice.OpAllow, reqs); err != nil {
			t.Fatal(err)
		}
	}
	if g.openUntil.Load() == 0 {
		t.Fatal("circuit did not open")
	}
	clk.Advance(breakerCooldown)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	before := st.calls
	if _, err := g.applyAll(cancelled, sluice.OpAllow, reqs); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled probe: %v", err)
	}
	if st.calls != before+1 {
		t.Fatal("the cancelled call was not the probe")
	}
	if _, err := g.applyAll(context.Background(), sluice.OpAllow, reqs); err != nil {
		t.Fatal(err)
	}
	if st.calls != before+2 {
		t.Fatal("after a cancelled probe the store is never asked again: the circuit is stuck half-open")
	}
}
