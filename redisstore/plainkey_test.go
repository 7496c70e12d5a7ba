package redisstore

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
)

// A key's base name keeps its hash slot, and no two keys share one.
func TestPlainBase(t *testing.T) {
	c := &core{}
	keys := []string{"x", "{x}", "fw{x}", "fw:{x}", "a}b", "a{}b", "}{", "{}", "a{b", "%7D", "fw%{0}a}b", "{x}:1", "x:1", "{{a}}", "}"}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		b := make([]byte, 1+rng.IntN(6))
		for i := range b {
			b[i] = "ab{}%:"[rng.IntN(6)]
		}
		keys = append(keys, string(b))
	}
	seen := map[string]string{}
	for _, k := range keys {
		b := c.plainBase(k)
		if keySlot(b) != keySlot(k) {
			t.Fatalf("%q: base %q is in slot %d, the key in %d", k, b, keySlot(b), keySlot(k))
		}
		if o, ok := seen[b]; ok && o != k {
			t.Fatalf("%q and %q share the base %q", o, k, b)
		}
		seen[b] = k
	}
}

// Keys with a '}' and no hash tag work on Cluster, alone and in batches,
// on the plain path and in the scripts.
func TestPlainOddKeysCluster(t *testing.T) {
	url := redistest.SharedCluster(t).URL()
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC))
	s := newStore(t, Options{URL: url, Clock: clk, PlainWindows: true})
	ctx := context.Background()
	p := redistest.Prefix(t)
	for _, k := range []string{"a}b", "}{", "a{}b", "{}x"} {
		req := sluice.Request{Key: p + k, Algorithm: sluice.FixedWindow, Limit: sluice.PerMinute(2), Cost: 1}
		for i, want := range []bool{true, true, false} {
			d, err := s.Apply(ctx, sluice.OpAllow, req)
			if err != nil || d.Allowed != want {
				t.Fatalf("%q call %d: %+v %v", k, i, d, err)
			}
		}
		// the same key twice in a batch, through the batch script
		if ds, err := s.ApplyAll(ctx, sluice.OpPeek, []sluice.Request{req, req}); err != nil || ds[0].Remaining != 0 {
			t.Fatalf("%q batch: %+v %v", k, ds, err)
		}
		if _, err := s.Apply(ctx, sluice.OpReset, req); err != nil {
			t.Fatalf("%q reset: %v", k, err)
		}
		if d, err := s.Apply(ctx, sluice.OpAllow, req); err != nil || d.Remaining != 1 {
			t.Fatalf("%q after reset: %+v %v", k, d, err)
		}
	}
}

// Close ends the clock sampler, also while Redis does not answer.
func TestPlainSamplerStops(t *testing.T) {
	srv := redistest.NewStandalone(t)
	s, err := New(context.Background(), Options{URL: srv.URL(), PlainWindows: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Thaw() }()
	_ = s.Close()
	buf := make([]byte, 1<<20)
	if st := string(buf[:runtime.Stack(buf, true)]); strings.Contains(st, "startClocks") {
		t.Fatalf("the sampler outlived Close:\n%s", st)
	}
}
