package guard

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/storetest"
)

// TestLocalStoreHeldToMaxBytes: Local's memory store takes its byte
// budget from Options.LocalMaxBytes (serve's store.max_bytes), as the
// memory store does, not the memory store's default: a key flood answered
// by Local while the store is down stays within it, and a used-up key is
// not evicted before the flood's fresh ones (it stays denied).
func TestLocalStoreHeldToMaxBytes(t *testing.T) {
	ctx := context.Background()
	const maxBytes = 1 << 20
	f := newFaulty(t)
	f.down.Store(true)
	clk := clock.NewFake(storetest.T0)
	// LocalMaxKeys far above what the flood reaches within the bytes: the
	// byte budget is the bound that holds.
	g := newGuard(t, f, Options{Clock: clk, Instances: 1, LocalMaxKeys: 1 << 22, LocalMaxBytes: maxBytes, ProbeInterval: time.Hour})
	g.node("").trip()
	victim := sluice.Request{Key: "victim", Algorithm: sluice.GCRA, Limit: sluice.PerDay(5), Cost: 1}
	for i := range 6 {
		d, err := g.Apply(ctx, sluice.OpAllow, victim)
		if err != nil || d.Fallback != "local" || d.Allowed != (i < 5) {
			t.Fatalf("victim, call %d: %+v %v", i, d, err)
		}
	}
	const n = 20_000 // about 3 MiB of keys, at 100-200 bytes each
	peak := int64(0)
	for i := range n {
		clk.Advance(time.Microsecond)
		a := []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.FixedWindow}[i%3]
		r := sluice.Request{Key: "flood-" + strconv.Itoa(i), Algorithm: a, Limit: sluice.PerMinute(10), Cost: 1}
		if d, err := g.Apply(ctx, sluice.OpAllow, r); err != nil || !d.Allowed || d.Fallback != "local" {
			t.Fatalf("flood key %d: %+v %v", i, d, err)
		}
		peak = max(peak, g.local.store.Bytes())
	}
	// Adders sweep past the bound and wait for the sweep past an eighth
	// more (memstore.grew).
	if peak > maxBytes+maxBytes/8 {
		t.Errorf("Local's store reached %d bytes under a flood of %d keys; LocalMaxBytes %d", peak, n, maxBytes)
	}
	if peak < maxBytes*3/4 {
		t.Errorf("Local's store peaked at %d bytes: the flood never reached LocalMaxBytes %d", peak, maxBytes)
	}
	if d, err := g.Apply(ctx, sluice.OpAllow, victim); err != nil || d.Allowed {
		t.Fatalf("the used-up key after the flood: %+v %v, want denied (evicted, its limit started over)", d, err)
	}
}
