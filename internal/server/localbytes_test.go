package server

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/storetest"
)

// downStore is a store that never answers: the guard's policy answers
// every call.
type downStore struct{}

var errStoreDown = fmt.Errorf("dial tcp: connection refused: %w", sluice.ErrUnavailable)

func (downStore) Apply(context.Context, sluice.Op, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, errStoreDown
}

func (downStore) ApplyAll(context.Context, sluice.Op, []sluice.Request) ([]sluice.Decision, error) {
	return nil, errStoreDown
}

func (downStore) Ping(context.Context) error { return errStoreDown }

// TestLocalFallbackTakesStoreMaxBytes: the guard serve builds gives the
// local policy's memory store the byte budget of store.max_bytes, not the
// memory store's default (64 MiB): a key flood while Redis is down stays
// within it, as it would in the memory store.
func TestLocalFallbackTakesStoreMaxBytes(t *testing.T) {
	const maxBytes = config.MinStoreMaxBytes
	clk := clock.NewFake(storetest.T0)
	sc := config.StoreSection{URL: "redis://127.0.0.1:1", FailurePolicy: config.FailLocal, Instances: 1, MaxKeys: 1 << 22, MaxBytes: maxBytes, Timeout: time.Second}
	g, err := newGuard(downStore{}, sc, clk, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	ctx := context.Background()
	var peak int64
	for i := range 30_000 {
		clk.Advance(time.Microsecond)
		r := sluice.Request{Key: "flood-" + strconv.Itoa(i), Algorithm: sluice.GCRA, Limit: sluice.PerMinute(10), Cost: 1}
		if d, err := g.Apply(ctx, sluice.OpAllow, r); err != nil || !d.Allowed || d.Fallback != config.FailLocal {
			t.Fatalf("flood key %d: %+v %v", i, d, err)
		}
		peak = max(peak, g.Stats().LocalBytes)
	}
	if peak > maxBytes+maxBytes/8 || peak < maxBytes*3/4 {
		t.Fatalf("the local store peaked at %d bytes; store.max_bytes %d", peak, maxBytes)
	}
}
