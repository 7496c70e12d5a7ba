package sluice_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
)

// Limiter.Reserve admits within the max wait, and Wait sleeps exactly the
// reservation's delay; a caller whose context ends during the wait gets
// its reservation refunded, so that the next caller takes its place.
func TestReserveWaitAndCancel(t *testing.T) {
	store, clk := newMem(t)
	var waits []time.Duration
	lim, err := sluice.NewLimiter(sluice.Options{Store: store, Limit: sluice.Limit{Rate: 10, Period: time.Second, Burst: 2}, Sleep: func(ctx context.Context, d time.Duration) error {
		waits = append(waits, d)
		return ctx.Err() // the clock stands still: every reservation is made at once
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var rs []*sluice.Reservation
	for i := range 5 {
		r, err := lim.Reserve(ctx, "k", 1, 300*time.Millisecond)
		if err != nil || !r.Decision.Allowed {
			t.Fatalf("reservation %d: %+v %v", i, r, err)
		}
		if err := r.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond}
	if len(waits) != 3 || waits[0] != want[0] || waits[1] != want[1] || waits[2] != want[2] {
		t.Fatalf("waits %v, want %v (two at once, then one per 100ms)", waits, want)
	}
	r, err := lim.Reserve(ctx, "k", 1, 300*time.Millisecond)
	if err != nil || r.Decision.Allowed || r.Decision.RetryAfter != 100*time.Millisecond {
		t.Fatalf("past the max wait: %+v %v", r.Decision, err)
	}
	// A caller gone during its wait refunds: the slot at 300ms is free again.
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if err := rs[4].Wait(gone); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with a cancelled context: %v", err)
	}
	r, err = lim.Reserve(ctx, "k", 1, 300*time.Millisecond)
	if err != nil || !r.Decision.Allowed || r.Decision.Delay != 300*time.Millisecond {
		t.Fatalf("after the refund: %+v %v, want admitted with delay 300ms", r.Decision, err)
	}
	clk.Advance(time.Second)
	if _, err := lim.Reserve(ctx, "k", 1, -time.Second); !errors.Is(err, sluice.ErrInvalidRequest) {
		t.Fatalf("negative max wait: %v", err)
	}
	fw, _ := sluice.NewLimiter(sluice.Options{Store: store, Limit: sluice.PerSecond(10), Algorithm: sluice.FixedWindow})
	if _, err := fw.Reserve(ctx, "k", 1, time.Second); !errors.Is(err, sluice.ErrInvalidRequest) {
		t.Fatalf("fixed window reservation: %v", err)
	}
}
