package redisstore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/storetest"
)

// Reservations on Redis TIME (no test clock): 30 simultaneous requests at
// 10/s burst 5 with a max wait of 1s. Real time passes while they run, so
// the counts are bounded rather than exact (the exact delays are checked on
// a fake clock by storetest's Reserve scenarios): 5 at once, at least 15 in
// all, never more than the limit allows in the time taken, no delay past
// 1s, and the delays are distinct slots 100ms apart, give or take the time
// between the calls.
func TestReserveRedisTime(t *testing.T) {
	url := redistest.Standalone(t).URL()
	s := newStore(t, Options{URL: url, Timeout: 5 * time.Second})
	req := sluice.Request{Key: "{rt}:reserve", Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 10, Period: time.Second, Burst: 5}, Cost: 1, MaxWait: time.Second}
	var (
		mu     sync.Mutex
		delays []time.Duration
		wg     sync.WaitGroup
	)
	start := time.Now()
	for range 30 {
		wg.Go(func() {
			d, err := s.Apply(context.Background(), sluice.OpAllow, req)
			if err != nil {
				t.Error(err)
				return
			}
			if d.Allowed {
				mu.Lock()
				delays = append(delays, d.Delay)
				mu.Unlock()
			} else if d.RetryAfter <= 0 || d.RetryAfter > 100*time.Millisecond {
				t.Errorf("denied with retry after %s, want (0, 100ms]", d.RetryAfter)
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	extra := int(took / (100 * time.Millisecond))
	if n := len(delays); n < 15 || n > 15+extra+1 {
		t.Fatalf("%d admitted in %s, want 15 (+%d for the time taken)", n, took, extra)
	}
	immediate := 0
	for _, d := range delays {
		if d == 0 {
			immediate++
		}
		if d > time.Second {
			t.Fatalf("delay %s past the max wait", d)
		}
	}
	if immediate < 5 || immediate > 5+extra+1 {
		t.Fatalf("%d admitted at once, want 5", immediate)
	}
}

// A reservation whose refund cannot reach Redis in time (paused) fails
// loudly with ErrUnavailable. The refund may still run when Redis resumes
// (it was sent), or not: either the reservation's capacity came back once,
// or it stays charged. Never more: a second Cancel does not refund again.
func TestReserveRefundWhileRedisPaused(t *testing.T) {
	srv := redistest.NewStandalone(t)
	clk := clock.NewFake(storetest.T0)
	s := newStore(t, Options{URL: srv.URL(), Clock: clk, Timeout: 200 * time.Millisecond})
	ctx := context.Background()
	req := sluice.Request{Key: "{rp}:k", Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 10, Period: time.Minute, Burst: 1}, Cost: 1, MaxWait: time.Minute}
	var last *sluice.Reservation
	for i := range 3 {
		r, err := sluice.ReserveAll(ctx, s, []sluice.Request{req})
		if err != nil || !r.Decision.Allowed || r.Decision.Delay != time.Duration(i)*6*time.Second {
			t.Fatalf("reservation %d: %+v %v", i, r, err)
		}
		last = r
	}
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	err := last.Cancel(ctx)
	if thawErr := srv.Thaw(); thawErr != nil {
		t.Fatal(thawErr)
	}
	if !errors.Is(err, sluice.ErrUnavailable) {
		t.Fatalf("refund against a paused Redis: %v, want ErrUnavailable", err)
	}
	if err := last.Cancel(ctx); !errors.Is(err, sluice.ErrUnavailable) {
		t.Fatalf("second Cancel: %v, want the first one's error", err)
	}
	d, err := s.Apply(ctx, sluice.OpPeek, req)
	if err != nil || (d.Delay != 18*time.Second && d.Delay != 12*time.Second) {
		t.Fatalf("after the timed-out refund: %+v %v, want the next delayed 12s (refunded once) or 18s (still charged)", d, err)
	}
	t.Logf("after the timed-out refund the next waits %s", d.Delay)
}
