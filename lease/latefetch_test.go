package lease_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/lease"
	"github.com/sluice-io/sluice/redisstore"
)

// TestLateFetchKeepsItsChunk: every reply from Redis comes after the
// store's deadline (a proxy delays each 40 or 80 ms; the store's timeout
// is 10 ms), as on a loaded machine missing many deadlines. A chunk fetch
// that gave up on its reply lost its chunk: Redis had charged it, nobody
// admitted it (hot keys fell to 0.971-0.979 of exact). Now a fetch waits
// for its reply, and its takers at most FetchWait (50 ms): at 80 ms they go
// on to the store, and the chunk is credited when it comes. After Close
// has given back what the lease held, Redis has charged what was admitted,
// plus the direct calls that failed (each charged one unit), the limit's
// refill and the returns that timed out (Stats.Stranded): no chunk was
// lost.
func TestLateFetchKeepsItsChunk(t *testing.T) {
	srv := redistest.Standalone(t)
	direct := newRedis(t, redisstore.Options{URL: srv.URL()})
	for _, delay := range []time.Duration{40 * time.Millisecond, 80 * time.Millisecond} {
		t.Run(fmt.Sprint(delay), func(t *testing.T) {
			px := redistest.NewProxy(t, srv.Addr)
			px.Delay.Store(int64(delay))
			rs := newRedis(t, redisstore.Options{URL: px.URL(), Timeout: 10 * time.Millisecond})
			s, err := lease.New(lease.Options{All: true, Store: rs})
			if err != nil {
				t.Fatal(err)
			}
			// 1 a second refills: far from its limit, every call is owed.
			lim := sluice.Limit{Rate: 3600, Period: time.Hour, Burst: 100_000}
			req := sluice.Request{Key: redistest.Prefix(t) + "hot", Algorithm: sluice.GCRA, Limit: lim, Cost: 1}
			start := time.Now()
			var admitted, failed atomic.Int64
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					for time.Since(start) < time.Second {
						d, err := s.Apply(context.Background(), sluice.OpAllow, req)
						switch {
						case err != nil:
							failed.Add(1)
						case d.Allowed:
							admitted.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if err := s.Close(); err != nil { // gives back what the lease holds
				t.Fatal(err)
			}
			elapsed := time.Since(start)
			d, err := direct.Apply(context.Background(), sluice.OpPeek, req)
			if err != nil {
				t.Fatal(err)
			}
			charged := lim.Burst - d.Remaining
			refill := int64(elapsed.Seconds()) + 2
			st := s.Stats()
			t.Logf("admitted %d, %d direct calls failed, Redis charged %d; %+v", admitted.Load(), failed.Load(), charged, st)
			if admitted.Load() < 500 || st.Fetches == 0 {
				t.Fatalf("admitted %d with %d fetches: not leased", admitted.Load(), st.Fetches)
			}
			// A return that timed out at Close is counted Stranded (its
			// refund may still reach Redis after the peek): not a lost chunk.
			if lost := charged - admitted.Load() - failed.Load(); lost > refill+int64(st.Stranded) {
				t.Fatalf("Redis charged %d more than was admitted or failed (refill %d, stranded %d): chunks lost", lost, refill, st.Stranded)
			}
			// What an exact store admits of the same calls: each one Redis
			// charged, less the direct calls that failed.
			if exact := charged - failed.Load() - int64(st.Stranded); float64(admitted.Load()) < 0.99*float64(exact) {
				t.Fatalf("admitted %d, under 0.99 of the %d an exact store would", admitted.Load(), exact)
			}
			if delay > lease.DefaultFetchWait && st.LateFetches == 0 {
				t.Fatal("no fetch came after FetchWait")
			}
		})
	}
}
