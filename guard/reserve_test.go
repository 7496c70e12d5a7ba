package guard

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
)

// Reservations under the local policy: the guard answers them as plain
// requests (admitted at once within the share, never held), and what the
// store had reserved ahead before the outage is not handed out again (its debt,
// seeded from the store's negative Remaining, is charged locally whole).
func TestLocalReservationsDoNotOverAdmit(t *testing.T) {
	f := newFaulty(t)
	clk := clock.NewFake(time.Now())
	g := newGuard(t, f, Options{Instances: 1, ProbeInterval: 10 * time.Millisecond, Clock: clk})
	ctx := context.Background()
	// 60/min burst 5, max wait 20s: 5 at once and 20 reserved ahead, more
	// than twice the burst.
	lim := sluice.Limit{Rate: 60, Period: time.Minute, Burst: 5}
	reserved := sluice.Request{Key: "reserved", Algorithm: sluice.GCRA, Limit: lim, Cost: 1, MaxWait: 20 * time.Second}
	fresh := reserved
	fresh.Key = "fresh"
	admitted := 0
	for range 30 {
		d, err := g.Apply(ctx, sluice.OpAllow, reserved)
		if err != nil || d.Degraded {
			t.Fatalf("%+v %v", d, err)
		}
		if d.Allowed {
			admitted++
		}
	}
	// A minute's rate admits about one more while the loop runs.
	if admitted < 25 || admitted > 26 {
		t.Fatalf("store admitted %d reservations, want 25", admitted)
	}
	if d, err := g.Apply(ctx, sluice.OpPeek, fresh); err != nil || !d.Allowed {
		t.Fatalf("fresh: %+v %v", d, err)
	}
	f.down.Store(true)
	eventually(t, "circuit open", func() bool { return g.Stats().Open == 1 })
	// 12s on, a plain bucket would be full again; this one owes 20s.
	clk.Advance(12 * time.Second)
	for i := range 20 {
		d, err := g.Apply(ctx, sluice.OpAllow, reserved)
		if err != nil || !d.Degraded {
			t.Fatalf("%+v %v", d, err)
		}
		if d.Allowed {
			t.Fatalf("local admitted reservation %d of a key the store had reserved 20s ahead: %+v", i, d)
		}
	}
	admitted = 0
	for range 30 {
		d, err := g.Apply(ctx, sluice.OpAllow, fresh)
		if err != nil || !d.Degraded {
			t.Fatalf("%+v %v", d, err)
		}
		if d.Delay != 0 {
			t.Fatalf("local held a reservation: %+v", d)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("local admitted %d of a fresh key, want its burst 5 and nothing reserved ahead", admitted)
	}
}

// The debt a key's reservations left in the store is seeded whole even when
// the first call the guard answers locally is a plain request (no MaxWait)
// of the same key: the store's state, not the caller's MaxWait, says how
// much was reserved ahead.
func TestLocalSeedsReservedDebtForPlainRequests(t *testing.T) {
	f := newFaulty(t)
	clk := clock.NewFake(time.Now())
	g := newGuard(t, f, Options{Instances: 1, ProbeInterval: 10 * time.Millisecond, Clock: clk})
	ctx := context.Background()
	lim := sluice.Limit{Rate: 60, Period: time.Minute, Burst: 5}
	reserved := sluice.Request{Key: "k", Algorithm: sluice.GCRA, Limit: lim, Cost: 1, MaxWait: 20 * time.Second}
	plain := reserved
	plain.MaxWait = 0
	for range 30 {
		if _, err := g.Apply(ctx, sluice.OpAllow, reserved); err != nil {
			t.Fatal(err)
		}
	}
	f.down.Store(true)
	eventually(t, "circuit open", func() bool { return g.Stats().Open == 1 })
	// The first local call seeds the key; 8s on, the store still owes 12s
	// of what it reserved 20s ahead.
	if d, err := g.Apply(ctx, sluice.OpAllow, plain); err != nil || !d.Degraded || d.Allowed {
		t.Fatalf("%+v %v", d, err)
	}
	clk.Advance(8 * time.Second)
	for i := range 10 {
		d, err := g.Apply(ctx, sluice.OpAllow, plain)
		if err != nil || !d.Degraded {
			t.Fatalf("%+v %v", d, err)
		}
		if d.Allowed {
			t.Fatalf("local admitted plain request %d of a key the store had reserved 20s ahead: %+v", i, d)
		}
	}
}
