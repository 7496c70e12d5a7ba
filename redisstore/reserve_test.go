package redisstore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
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
