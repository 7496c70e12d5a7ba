package redisstore

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
)

// TestSharedDeadline: every context handed out expires between timeout
// and 9/8 of it after the call that got it, and calls within the slack
// share one.
func TestSharedDeadline(t *testing.T) {
	const timeout = 800 * time.Millisecond
	var d sharedDeadline
	t0 := time.Now()
	first := d.get(t0, timeout)
	seen := map[context.Context]bool{first: true}
	for at := time.Duration(0); at < 10*timeout; at += timeout / 32 {
		now := t0.Add(at)
		ctx := d.get(now, timeout)
		dl, ok := ctx.Deadline()
		if !ok || dl.Before(now.Add(timeout)) || dl.After(now.Add(timeout+timeout/8)) {
			t.Fatalf("at %s: deadline %s after now, want within [%s, %s]", at, dl.Sub(now), timeout, timeout+timeout/8)
		}
		seen[ctx] = true
	}
	// 10 timeouts of calls, a new context every timeout/8 at most.
	if n := len(seen); n > 81 || n < 70 {
		t.Fatalf("%d contexts for 10 timeouts of calls, want about 80 (one per timeout/8)", n)
	}
	if d.get(t0.Add(10*timeout), timeout) != d.get(t0.Add(10*timeout+timeout/64), timeout) {
		t.Fatal("two calls timeout/64 apart got two contexts")
	}
}

// TestBackgroundCallBoundedByTimeout: a decision asked with
// context.Background of a Redis that never answers fails after the
// store's timeout (at most 9/8 of it, and the machine's scheduling), not
// sooner and not never.
func TestBackgroundCallBoundedByTimeout(t *testing.T) {
	srv := redistest.Standalone(t)
	px := redistest.NewProxy(t, srv.Addr)
	const timeout = 200 * time.Millisecond
	s, err := New(context.Background(), Options{URL: px.URL(), Timeout: timeout, DisableDenyCache: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.GCRA, Limit: sluice.PerHour(100), Cost: 1}
	if _, err := s.Apply(context.Background(), sluice.OpAllow, req); err != nil {
		t.Fatal(err)
	}
	px.Hold.Store(true)
	for range 3 {
		start := time.Now()
		_, err := s.Apply(context.Background(), sluice.OpAllow, req)
		took := time.Since(start)
		if !errors.Is(err, sluice.ErrUnavailable) {
			t.Fatalf("a held call: %v, want ErrUnavailable", err)
		}
		// 2 s of margin for a loaded machine's scheduling.
		if took < timeout || took > timeout+timeout/8+2*time.Second {
			t.Fatalf("a held call failed after %s, store timeout %s", took, timeout)
		}
	}
}
