package fairqueue

import (
	"context"
	"testing"
	"time"
)

// TestTryGate: items admitted by a Try (the gateway's wait for upstream
// room) wait on their Gate in class order: when room comes, the higher
// class takes it, and an item arriving meanwhile queues behind the
// waiting ones rather than taking the room itself.
func TestTryGate(t *testing.T) {
	q, clk, _ := newQueue(t, Options{
		Classes: []Class{{Name: "hi", Priority: 1}, {Name: "lo"}},
		MaxWait: time.Minute,
	})
	ctx := context.Background()
	// One admission a second, as a provider limit of 1 rpm per second.
	var freeAt int64
	try := func(context.Context) (bool, time.Duration, error) {
		now := clk.Now()
		if now >= freeAt {
			freeAt = now + int64(time.Second)
			return true, 0, nil
		}
		return false, time.Duration(freeAt - now), nil
	}
	gate := &Gate{}
	item := func(key, class string) *Item {
		return &Item{Key: key, Group: "g", Class: class, Try: try, Gate: gate}
	}
	first, _ := q.Submit(ctx, item("a", "hi"))
	lo, _ := q.Submit(ctx, item("b", "lo"))
	clk.Advance(5 * time.Millisecond)
	hi, _ := q.Submit(ctx, item("c", "hi"))
	q.Dispatch(ctx)
	if first.Result().Outcome != Admitted || lo.Result().Outcome != Pending || hi.Result().Outcome != Pending {
		t.Fatalf("first %s, lo %s, hi %s", first.Result().Outcome, lo.Result().Outcome, hi.Result().Outcome)
	}
	clk.Advance(time.Second)
	late, _ := q.Submit(ctx, item("d", "lo")) // arrives as the room does
	if late.Result().Outcome != Pending {
		t.Fatalf("an item arriving as room came took it (%s) ahead of the waiting ones", late.Result().Outcome)
	}
	q.Dispatch(ctx)
	if hi.Result().Outcome != Admitted || lo.Result().Outcome != Pending {
		t.Fatalf("hi %s, lo %s: the higher class must take the room", hi.Result().Outcome, lo.Result().Outcome)
	}
	clk.Advance(time.Second)
	q.Dispatch(ctx)
	if lo.Result().Outcome != Admitted || late.Result().Outcome != Pending {
		t.Fatalf("lo %s, late %s: the older lo item first", lo.Result().Outcome, late.Result().Outcome)
	}
}
