package upstream

import (
	"context"
	"testing"
	"time"
)

// TestStatusShowsFleetCooldown: a cooldown one replica started shows in
// another's status, with its end, as no room.
func TestStatusShowsFleetCooldown(t *testing.T) {
	defs, routes := twoUpstreams()
	a, _ := testPool(t, defs, routes, Routing{})
	b, err := New(Options{Upstreams: defs, Routes: routes, Routing: a.routing, Store: a.store, Getenv: func(string) string { return "k" }, Now: a.now})
	if err != nil {
		t.Fatal(err)
	}
	a.Cooldown(context.Background(), a.Route("m", "").Targets[0], 5*time.Second)
	st, err := b.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s := st[0]; s.Up || s.CooldownUntil == nil || !s.CooldownUntil.Equal(b.now().Add(5*time.Second).UTC()) || s.Remaining["rpm"] != 0 || s.Headroom != 0 {
		t.Fatalf("cooling upstream on the other replica: %+v", s)
	}
	if s := st[1]; !s.Up || s.CooldownUntil != nil || s.Remaining["rpm"] != 5 {
		t.Fatalf("the other upstream: %+v", s)
	}
}
