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
	if _, err := s.Apply(ctx, sluice.OpAllow, req); err != nil {
		t.Fatalf("no delay: %v", err)
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
	for range 4 {
		if _, err := s.Apply(ctx, sluice.OpAllow, req); err != nil {
			failed++
			t.Log(err)
		}
	}
	if failed > 0 {
		t.Fatalf("%d of 4 calls failed after one late reply, with replies in 300ms and a 550ms deadline", failed)
	}
}
