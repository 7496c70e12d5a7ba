package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/redisstore"
)

// run64 runs fn from callers goroutines (64 on any GOMAXPROCS) on nkeys
// keys at random, all admitted, against srv, and reports Redis's CPU per
// decision (INFO cpu, network I/O included) besides the time per decision:
// time/op is 1 ÷ decisions per second. It also reports the issue's "Redis
// time per call": INFO commandstats' usec per script call (EVAL and
// EVALSHA; the script's run alone, wall time), and script calls per
// decision.
func run64(b *testing.B, srv *redistest.Server, fn func(context.Context, string) error) {
	b.ReportAllocs()
	b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
	var seq atomic.Int64
	if _, err := srv.Do(context.Background(), "CONFIG", "RESETSTAT"); err != nil {
		b.Fatal(err)
	}
	cpu0 := redisCPU(b, srv)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(uint64(seq.Add(1)), 1))
		for pb.Next() {
			if err := fn(context.Background(), keyName(r.IntN(nkeys))); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric((redisCPU(b, srv)-cpu0)*1e3/float64(b.N), "redis-cpu-ns/op")
	if calls, usec := scriptStats(b, srv); calls > 0 {
		b.ReportMetric(usec*1e3/float64(calls), "script-ns/call")
		b.ReportMetric(float64(calls)/float64(b.N), "calls/op")
	}
}

// BenchmarkRedis64: the Redis targets in Go benchmark form, for
// benchstat (make bench-compare): redis_rate's GCRA and sluice's GCRA,
// token bucket and fixed window (default options: plain windows, group
// commit) at 64 callers, each on a redis-server of its own.
//
//	cd bench && go test -run '^$' -bench Redis64 -benchtime 3s -count 3 ./redis/
func BenchmarkRedis64(b *testing.B) {
	b.Run("redis_rate", func(b *testing.B) {
		srv := redistest.NewStandalone(b)
		run64(b, srv, redisRateFn(newGoRedis(b, srv)))
	})
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.FixedWindow} {
		b.Run("sluice/"+a.String(), func(b *testing.B) {
			srv := redistest.NewStandalone(b)
			run64(b, srv, sluiceFn(newStore(b, srv.URL(), redisstore.Options{DisableDenyCache: true}), a))
		})
	}
}

// BenchmarkLeaseHot: hotKeys keys, 64 callers, redis_rate beside sluice's
// GCRA through three leased stores on one redis-server (the lease report's
// set-up, TestLeaseReport).
func BenchmarkLeaseHot(b *testing.B) {
	keys := make([]string, hotKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("hot:%03d", i)
	}
	hot := func(b *testing.B, srv *redistest.Server, fn func(ctx context.Context, caller int, key string) error) {
		b.ReportAllocs()
		b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
		var seq atomic.Int64
		cpu0 := redisCPU(b, srv)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			c := int(seq.Add(1))
			r := rand.New(rand.NewPCG(uint64(c), 2))
			for pb.Next() {
				if err := fn(context.Background(), c, keys[r.IntN(hotKeys)]); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.StopTimer()
		b.ReportMetric((redisCPU(b, srv)-cpu0)*1e3/float64(b.N), "redis-cpu-ns/op")
	}
	b.Run("redis_rate", func(b *testing.B) {
		srv := redistest.NewStandalone(b)
		fn := redisRateFn(newGoRedis(b, srv))
		hot(b, srv, func(ctx context.Context, _ int, key string) error { return fn(ctx, key) })
	})
	b.Run("sluice/leased", func(b *testing.B) {
		srv := redistest.NewStandalone(b)
		stores := leasedStores(b, srv, 3)
		hot(b, srv, func(ctx context.Context, c int, key string) error {
			d, err := stores[c%3].Apply(ctx, sluice.OpAllow, sluice.Request{Key: key, Algorithm: sluice.GCRA, Limit: benchLimit, Cost: 1, UseLease: true})
			if err == nil && (!d.Allowed || d.Degraded) {
				err = fmt.Errorf("unexpected decision %+v", d)
			}
			return err
		})
	})
}
