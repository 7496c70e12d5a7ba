package redisstore

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
)

// A call that misses its deadline does not cost the connection. It did
// while calls came one at a time (rueidis' synchronous mode closes the
// connection on a deadline), and the next call then paid a redial: the
// handshake's round trip and its own. A Redis answering within the
// deadline but in more than half of it was then never reached again by a
// lone caller, such as the guard's probe: every call timed out and
// redialled. Here replies take 300ms, calls have 550ms, and one call
// missed its deadline once (held by the proxy): every later call must
// succeed. Before, every one failed.
func TestLateReplyKeepsConnection(t *testing.T) {
	srv := redistest.Standalone(t)
	px := redistest.NewProxy(t, srv.Addr)
	s, err := New(context.Background(), Options{URL: px.URL(), Timeout: 550 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.GCRA, Limit: sluice.PerSecond(1_000_000), Cost: 1}
	// rueidis spreads keyed commands over a few connections, each dialled
	// on first use: dial them all before replies slow down, or a call's
	// handshake would cost a round trip of its own.
	for range 100 {
		if _, err := s.Apply(ctx, sluice.OpAllow, req); err != nil {
			t.Fatalf("no delay: %v", err)
		}
	}
	px.Delay.Store(int64(300 * time.Millisecond))
	if _, err := s.Apply(ctx, sluice.OpAllow, req); err != nil {
		t.Fatalf("300ms replies, 550ms deadline: %v", err)
	}
	px.Hold.Store(true)
	if _, err := s.Apply(ctx, sluice.OpAllow, req); err == nil {
		t.Fatal("a held call met its deadline")
	}
	px.Hold.Store(false)
	failed := 0
	for i := range 4 {
		start := time.Now()
		if _, err := s.Apply(ctx, sluice.OpAllow, req); err != nil {
			failed++
			t.Logf("call %d after %s: %v", i, time.Since(start), err)
		}
	}
	if failed > 0 {
		t.Fatalf("%d of 4 calls failed after one late reply, with replies in 300ms and a 550ms deadline", failed)
	}
}

// A refund or a charge keeps its caller's deadline, even one beyond the
// store's timeout: Redis applies it whether or not the reply comes in
// time, so a caller that can wait learns that it was applied instead of
// sending it again. Decisions keep the store's timeout.
func TestSettlingKeepsCallerDeadline(t *testing.T) {
	srv := redistest.Standalone(t)
	px := redistest.NewProxy(t, srv.Addr)
	s, err := New(context.Background(), Options{URL: px.URL(), Timeout: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 100, Period: time.Hour, Burst: 100}, Cost: 1}
	if _, err := s.Apply(context.Background(), sluice.OpPeek, req); err != nil {
		t.Fatal(err)
	}
	px.Delay.Store(int64(300 * time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, op := range []sluice.Op{sluice.OpCharge, sluice.OpRefund} {
		if _, err := s.Apply(ctx, op, req); err != nil {
			t.Fatalf("%s with a 10s deadline, 300ms replies, a 100ms store timeout: %v", op, err)
		}
		if _, err := s.ApplyAll(ctx, op, []sluice.Request{req}); err != nil {
			t.Fatalf("%s batch: %v", op, err)
		}
	}
	// Each applied once: the two charges and the two refunds cancel out.
	d, err := New(context.Background(), Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if p, err := d.Apply(context.Background(), sluice.OpPeek, req); err != nil || p.Remaining != 100 {
		t.Fatalf("after: %+v %v, want 100 remaining", p, err)
	}
	if _, err := s.Apply(ctx, sluice.OpAllow, req); err == nil {
		t.Fatal("a decision waited past the store's timeout")
	}
}
