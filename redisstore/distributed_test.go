package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
)

// Two instances whose own clocks are 10s apart share one limit exactly:
// the scripts read Redis TIME, never the client's clock.
func TestSkewedClientsAgree(t *testing.T) {
	srv := redistest.Standalone(t)
	now := time.Now()
	ahead := newStore(t, Options{URL: srv.URL(), LocalClock: clock.NewFake(now.Add(5 * time.Second))})
	behind := newStore(t, Options{URL: srv.URL(), LocalClock: clock.NewFake(now.Add(-5 * time.Second))})
	ctx := context.Background()
	for _, a := range sluice.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: a, Limit: sluice.PerMinute(10), Cost: 1, Lease: "l"}
			admitted := 0
			for i := range 30 {
				s := ahead
				if i%2 == 1 {
					s = behind
				}
				req.Lease = sluice.NewLeaseID()
				d, err := s.Apply(ctx, sluice.OpAllow, req)
				if err != nil {
					t.Fatal(err)
				}
				if d.Degraded {
					t.Fatalf("call %d degraded", i)
				}
				if d.Allowed {
					admitted++
					if i >= 10 {
						t.Fatalf("call %d admitted after the limit of 10", i)
					}
				} else if d.RetryAfter <= 0 || d.RetryAfter > 2*time.Minute { // a sliding counter may wait into the next window
					t.Fatalf("call %d: RetryAfter %s", i, d.RetryAfter)
				}
			}
			if admitted != 10 {
				t.Fatalf("admitted %d, want exactly 10", admitted)
			}
		})
	}
}

// Four instances with their own connections and 50 goroutines each hammer
// one key for 3s: the admitted count is within one of the ideal
// burst + rate·elapsed and at least 99% of it.
func TestConcurrentInstancesHammerOneKey(t *testing.T) {
	srv := redistest.Standalone(t)
	// A burst of a second's worth absorbs scheduling stalls of a loaded
	// CI machine: a stall shorter than the burst's refill time loses no
	// capacity, so the ≥ 99% bound tests the store, not the scheduler.
	lim := sluice.Limit{Rate: 500, Period: time.Second, Burst: 500}
	key := redistest.Prefix(t) + "{hot}"
	stores := make([]*Store, 4)
	for i := range stores {
		stores[i] = newStore(t, Options{URL: srv.URL(), Timeout: 2 * time.Second})
	}
	const run = 3 * time.Second
	var admitted, calls, errs atomic.Int64
	var wg sync.WaitGroup
	ready, begin := make(chan struct{}, 200), make(chan struct{})
	// The lower bound is counted from the first denial on: from then on
	// the bucket is empty, so a late start of the goroutines cannot waste
	// capacity that the bound would count.
	drained := make(chan struct{})
	var drainOnce sync.Once
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, s := range stores {
		for range 50 {
			wg.Go(func() {
				req := sluice.Request{Key: key, Algorithm: sluice.GCRA, Limit: lim, Cost: 1}
				ready <- struct{}{}
				<-begin
				for ctx.Err() == nil {
					d, err := s.Apply(context.Background(), sluice.OpAllow, req)
					calls.Add(1)
					switch {
					case err != nil || d.Degraded:
						errs.Add(1)
					case d.Allowed:
						admitted.Add(1)
					default:
						drainOnce.Do(func() { close(drained) })
					}
				}
			})
		}
	}
	for range 200 {
		<-ready
	}
	// Redis's clock, read on an open connection: the upper bound counts
	// until every call has returned, the lower bound until the load stopped.
	now := func() time.Time {
		ts, err := stores[0].Client().Do(context.Background(), stores[0].Client().B().Time().Build()).AsIntSlice()
		if err != nil || len(ts) != 2 {
			t.Errorf("TIME: %v %v", ts, err)
			return time.Time{}
		}
		return time.Unix(ts[0], ts[1]*1000)
	}
	start := now()
	close(begin)
	<-drained
	drainedAt, admittedBefore := now(), admitted.Load()
	stopped := make(chan time.Time, 1)
	stop := time.AfterFunc(run, func() {
		stopped <- now()
		cancel()
	})
	defer stop.Stop()
	wg.Wait()
	elapsed := now().Sub(start)
	loaded := (<-stopped).Sub(drainedAt)
	if errs.Load() > 0 {
		t.Fatalf("%d of %d calls failed or degraded", errs.Load(), calls.Load())
	}
	ideal := float64(lim.Burst) + float64(lim.Rate)*elapsed.Seconds()
	floor := 0.99 * float64(lim.Rate) * loaded.Seconds()
	got := float64(admitted.Load())
	after := float64(admitted.Load() - admittedBefore)
	var hits uint64
	for _, s := range stores {
		hits += s.Stats().CacheHits
	}
	t.Logf("admitted %.0f of %d calls in %s (ideal %.0f); %d answered by the over-limit caches", got, calls.Load(), elapsed, ideal, hits)
	if got > ideal+1 || after < floor {
		t.Fatalf("admitted %.0f, want ≤ %.0f; after the bucket emptied %.0f in %s, want ≥ %.0f (99%%)", got, ideal+1, after, loaded, floor)
	}
}

// 10,000 checks of a denied key cost Redis a handful of calls; a refund
// makes the next check ask Redis again.
func TestDenyCacheSparesRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newStore(t, Options{URL: srv.URL()})
	ctx := context.Background()
	// an hour's limit: a step of the machine's clock cannot end the denial
	req := sluice.Request{Key: redistest.Prefix(t) + "abuser", Algorithm: sluice.GCRA, Limit: sluice.PerHour(5), Cost: 1}
	for range 5 {
		if d, err := s.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed {
			t.Fatalf("warm-up: %+v %v", d, err)
		}
	}
	before := scriptCalls(t, srv)
	var denied int
	for range 10_000 {
		d, err := s.Apply(ctx, sluice.OpAllow, req)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			denied++
			if d.RetryAfter <= 0 || d.Remaining != 0 {
				t.Fatalf("denial %+v", d)
			}
		}
	}
	redisCalls := scriptCalls(t, srv) - before
	t.Logf("10000 checks: %d denied, %d Redis script calls", denied, redisCalls)
	if denied != 10_000 || redisCalls > 5 {
		t.Fatalf("%d denied, %d Redis calls; want 10000 and at most 5", denied, redisCalls)
	}
	if _, err := s.Apply(ctx, sluice.OpRefund, req); err != nil {
		t.Fatal(err)
	}
	before = scriptCalls(t, srv)
	if d, err := s.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed {
		t.Fatalf("after refund: %+v %v, want allowed", d, err)
	}
	if n := scriptCalls(t, srv) - before; n != 1 {
		t.Fatalf("after refund: %d Redis calls, want 1 (cache entry dropped)", n)
	}

	// With the cache off, every check goes to Redis.
	off := newStore(t, Options{URL: srv.URL(), DisableDenyCache: true})
	before = scriptCalls(t, srv)
	for range 100 {
		if _, err := off.Apply(ctx, sluice.OpAllow, req); err != nil {
			t.Fatal(err)
		}
	}
	if n := scriptCalls(t, srv) - before; n != 100 {
		t.Fatalf("cache off: %d Redis calls for 100 checks", n)
	}
}

func scriptCalls(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	var total int64
	for _, c := range []string{"evalsha", "eval"} {
		n, err := srv.CommandCalls(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	return total
}

// A SCRIPT FLUSH (as after a restart) is handled: the call still succeeds.
func TestNoScriptIsTransparent(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newStore(t, Options{URL: srv.URL(), DisableDenyCache: true})
	ctx := context.Background()
	req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.TokenBucket, Limit: sluice.PerSecond(5), Cost: 1}
	for i := range 3 {
		if _, err := srv.Do(ctx, "SCRIPT", "FLUSH"); err != nil {
			t.Fatal(err)
		}
		d, err := s.Apply(ctx, sluice.OpAllow, req)
		if err != nil || !d.Allowed || d.Degraded || d.Remaining != int64(4-i) {
			t.Fatalf("call %d after SCRIPT FLUSH: %+v %v", i, d, err)
		}
	}
}

// Keys expire when their state stops mattering, not after a fixed hour.
func TestKeysExpireWithTheirState(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newStore(t, Options{URL: srv.URL(), DisableDenyCache: true})
	ctx := context.Background()
	p := redistest.Prefix(t)
	for _, a := range sluice.Algorithms() {
		req := sluice.Request{Key: p + a.String(), Algorithm: a, Limit: sluice.Limit{Rate: 10, Period: 10 * time.Second}, Cost: 3, Lease: "x"}
		if _, err := s.Apply(ctx, sluice.OpAllow, req); err != nil {
			t.Fatal(err)
		}
		r, err := srv.Do(ctx, "PTTL", req.Key)
		if err != nil {
			t.Fatal(err)
		}
		ttl := time.Duration(r.(int64)) * time.Millisecond
		// GCRA and the bucket refill 3 events in 3s; the windows last ≤ 2 periods.
		want := map[sluice.Algorithm]time.Duration{sluice.GCRA: 3 * time.Second, sluice.TokenBucket: 3 * time.Second, sluice.SlidingWindowLog: 10 * time.Second, sluice.Concurrency: 10 * time.Second}[a]
		switch {
		case want > 0 && (ttl > want || ttl < want-time.Second):
			t.Errorf("%s: TTL %s, want about %s", a, ttl, want)
		case want == 0 && (ttl <= 0 || ttl > 20*time.Second):
			t.Errorf("%s: TTL %s, want within two windows", a, ttl)
		}
	}
}
