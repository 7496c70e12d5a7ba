package sluice_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
)

func newMem(t *testing.T) (*memstore.Store, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, clk
}

// fakeSleep advances the fake clock instead of sleeping, and records the waits.
func fakeSleep(clk *clock.Fake, waits *[]time.Duration) func(context.Context, time.Duration) error {
	return func(ctx context.Context, d time.Duration) error {
		*waits = append(*waits, d)
		clk.Advance(d)
		return ctx.Err()
	}
}

func TestWaitSleepsExactlyRetryAfter(t *testing.T) {
	store, clk := newMem(t)
	var waits []time.Duration
	lim, err := sluice.NewLimiter(sluice.Options{Store: store, Limit: sluice.Limit{Rate: 10, Period: time.Second, Burst: 2}, Sleep: fakeSleep(clk, &waits)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 2 {
		if d, err := lim.Wait(ctx, "u", 1); err != nil || !d.Allowed {
			t.Fatalf("burst Wait: %+v %v", d, err)
		}
	}
	if len(waits) != 0 {
		t.Fatalf("burst waited %v", waits)
	}
	if d, err := lim.Wait(ctx, "u", 2); err != nil || !d.Allowed {
		t.Fatalf("Wait(2): %+v %v", d, err)
	}
	if len(waits) != 1 || waits[0] != 200*time.Millisecond {
		t.Fatalf("waits %v, want exactly [200ms]: one sleep, no polling", waits)
	}
}

func TestWaitFailsFast(t *testing.T) {
	store, clk := newMem(t)
	var waits []time.Duration
	lim, _ := sluice.NewLimiter(sluice.Options{Store: store, Limit: sluice.Limit{Rate: 1, Period: time.Minute}, Sleep: fakeSleep(clk, &waits)})
	if _, err := lim.Wait(context.Background(), "u", 2); !errors.Is(err, sluice.ErrCostExceedsBurst) {
		t.Fatalf("cost above burst: %v", err)
	}
	if _, err := lim.Allow(context.Background(), "u"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := lim.Wait(ctx, "u", 1); !errors.Is(err, sluice.ErrWaitTooLong) {
		t.Fatalf("wait past deadline: %v", err)
	}
	if len(waits) != 0 {
		t.Fatalf("slept %v before failing", waits)
	}
	cancelled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if _, err := lim.Wait(cancelled, "u", 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
}

func TestLimiterOperations(t *testing.T) {
	store, _ := newMem(t)
	ctx := context.Background()
	lim, err := sluice.NewLimiter(sluice.Options{Store: store, Limit: sluice.PerMinute(3), Prefix: "api:"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if d, _ := lim.Allow(ctx, "k"); !d.Allowed || d.Remaining != int64(2-i) {
			t.Fatalf("allow %d: %+v", i, d)
		}
	}
	if d, _ := lim.Allow(ctx, "k"); d.Allowed || d.RetryAfter != 20*time.Second {
		t.Fatalf("4th: %+v", d)
	}
	if d, _ := lim.Peek(ctx, "other", 0); !d.Allowed || d.Remaining != 3 {
		t.Fatalf("keys are separate: %+v", d)
	}
	if d, _ := lim.Refund(ctx, "k", 1); d.Remaining != 1 {
		t.Fatalf("refund: %+v", d)
	}
	if d, _ := lim.Charge(ctx, "k", 3); d.Remaining != -2 {
		t.Fatalf("charge: %+v", d)
	}
	if err := lim.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if d, _ := lim.Peek(ctx, "k", 1); d.Remaining != 3 {
		t.Fatalf("after reset: %+v", d)
	}
	if _, _, err := lim.Acquire(ctx, "k"); !errors.Is(err, sluice.ErrInvalidRequest) {
		t.Fatalf("Acquire on GCRA: %v", err)
	}
}

func TestNewLimiterValidates(t *testing.T) {
	store, _ := newMem(t)
	if _, err := sluice.NewLimiter(sluice.Options{Limit: sluice.PerSecond(1)}); err == nil {
		t.Error("nil store accepted")
	}
	if _, err := sluice.NewLimiter(sluice.Options{Store: store}); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("zero limit: %v", err)
	}
	if _, err := sluice.NewLimiter(sluice.Options{Store: store, Limit: sluice.PerSecond(1), Algorithm: 99}); !errors.Is(err, sluice.ErrUnknownAlgorithm) {
		t.Errorf("bad algorithm: %v", err)
	}
}

func TestAcquireRelease(t *testing.T) {
	store, clk := newMem(t)
	ctx := context.Background()
	lim, _ := sluice.NewLimiter(sluice.Options{Store: store, Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: 1, Period: 30 * time.Second}})
	lease, d, err := lim.Acquire(ctx, "job")
	if err != nil || !d.Allowed || lease.ID == "" {
		t.Fatalf("acquire: %+v %+v %v", lease, d, err)
	}
	if _, d, _ := lim.Acquire(ctx, "job"); d.Allowed {
		t.Fatal("second holder admitted")
	}
	if _, err := lim.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
	if _, d, _ := lim.Acquire(ctx, "job"); !d.Allowed {
		t.Fatal("slot not freed by release")
	}
	// the new holder crashes; its lease lapses after 30s
	clk.Advance(30 * time.Second)
	if _, d, _ := lim.Acquire(ctx, "job"); !d.Allowed {
		t.Fatal("crashed holder's slot leaked")
	}
}

func TestCombine(t *testing.T) {
	a := sluice.Decision{Allowed: true, Limit: sluice.PerSecond(10), Remaining: 5, ResetAfter: time.Second}
	b := sluice.Decision{Allowed: false, Limit: sluice.PerDay(100), Remaining: 0, RetryAfter: time.Hour, ResetAfter: 2 * time.Hour}
	got := sluice.Combine([]sluice.Decision{a, b})
	want := sluice.Decision{Allowed: false, Limit: sluice.PerDay(100), Remaining: 0, RetryAfter: time.Hour, ResetAfter: 2 * time.Hour}
	if got != want {
		t.Fatalf("Combine = %+v, want %+v", got, want)
	}
	if got := sluice.Combine(nil); !got.Allowed {
		t.Fatal("Combine(nil) denies")
	}
	// A batch denied from a cache: the source is the denial's.
	b.Source = sluice.FromCache
	want.Source = sluice.FromCache
	if got := sluice.Combine([]sluice.Decision{a, b}); got != want {
		t.Fatalf("Combine(store, cached denial) = %+v, want %+v", got, want)
	}
	// All allowed: from the store if any member went there.
	a2 := a
	a2.Source = sluice.FromLease
	if got := sluice.Combine([]sluice.Decision{a2, a}); !got.Allowed || got.Source != sluice.FromStore {
		t.Fatalf("Combine(lease, store) = %+v, want allowed from the store", got)
	}
	if got := sluice.Combine([]sluice.Decision{a2, a2}); got.Source != sluice.FromLease {
		t.Fatalf("Combine(lease, lease) = %+v, want from the lease", got)
	}
}
