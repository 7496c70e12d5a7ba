// Package core compares sluice's memory store with golang.org/x/time/rate
// as Go benchmarks, so that benchstat (make bench-compare) and callgrind
// can read them: one key serial and under RunParallel, 100k keys at random,
// and the heap per key at 100k and 1M keys. cmd/corebench prints the same
// pairs as ratios within one run.
package core

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/memstore"
)

// huge never denies: every call is a whole admission.
var huge = sluice.Limit{Rate: 1 << 40, Period: time.Second, Burst: 1 << 40}

func newStore(b *testing.B) *memstore.Store {
	s, err := memstore.New(memstore.Options{SweepInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

func keys(n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = "user:" + strconv.Itoa(i)
	}
	return ks
}

// mutexMap is the usual per-key x/time/rate set-up.
type mutexMap struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func (m *mutexMap) allow(k string) bool {
	m.mu.Lock()
	l, ok := m.m[k]
	if !ok {
		l = rate.NewLimiter(rate.Limit(1<<40), 1<<40)
		m.m[k] = l
	}
	m.mu.Unlock()
	return l.Allow()
}

func BenchmarkSingleKey(b *testing.B) {
	b.Run("sluice", func(b *testing.B) {
		s := newStore(b)
		req := sluice.Request{Key: "user:42", Algorithm: sluice.GCRA, Limit: huge, Cost: 1}
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			_, _ = s.Apply(ctx, sluice.OpAllow, req)
		}
	})
	b.Run("xrate", func(b *testing.B) {
		l := rate.NewLimiter(rate.Limit(1<<40), 1<<40)
		b.ReportAllocs()
		for b.Loop() {
			_ = l.Allow()
		}
	})
}

func BenchmarkSingleKeyParallel(b *testing.B) {
	b.Run("sluice", func(b *testing.B) {
		s := newStore(b)
		req := sluice.Request{Key: "user:42", Algorithm: sluice.GCRA, Limit: huge, Cost: 1}
		ctx := context.Background()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_, _ = s.Apply(ctx, sluice.OpAllow, req)
			}
		})
	})
	b.Run("xrate", func(b *testing.B) {
		l := rate.NewLimiter(rate.Limit(1<<40), 1<<40)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_ = l.Allow()
			}
		})
	})
}

func Benchmark100kKeysParallel(b *testing.B) {
	ks := keys(100_000)
	b.Run("sluice", func(b *testing.B) {
		s := newStore(b)
		ctx := context.Background()
		for _, k := range ks {
			_, _ = s.Apply(ctx, sluice.OpAllow, sluice.Request{Key: k, Algorithm: sluice.GCRA, Limit: huge, Cost: 1})
		}
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			r := rand.New(rand.NewPCG(rand.Uint64(), 2))
			req := sluice.Request{Algorithm: sluice.GCRA, Limit: huge, Cost: 1}
			for pb.Next() {
				req.Key = ks[r.IntN(len(ks))]
				_, _ = s.Apply(ctx, sluice.OpAllow, req)
			}
		})
	})
	b.Run("xrate", func(b *testing.B) {
		m := &mutexMap{m: map[string]*rate.Limiter{}}
		for _, k := range ks {
			m.allow(k)
		}
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			r := rand.New(rand.NewPCG(rand.Uint64(), 3))
			for pb.Next() {
				m.allow(ks[r.IntN(len(ks))])
			}
		})
	})
}

// BenchmarkBytesPerKey reports the live heap per key ("B/key"), the key
// strings the caller holds excluded (sluice's copy of each is counted).
func BenchmarkBytesPerKey(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		ks := keys(n)
		ctx := context.Background()
		fills := map[string]func() any{
			"sluice": func() any {
				s, _ := memstore.New(memstore.Options{SweepInterval: -1, MaxKeys: 2 * n, MaxBytes: 1 << 30})
				for _, k := range ks {
					_, _ = s.Apply(ctx, sluice.OpAllow, sluice.Request{Key: k, Algorithm: sluice.GCRA, Limit: sluice.PerHour(10), Cost: 1})
				}
				return s
			},
			"xrate": func() any {
				m := &mutexMap{m: map[string]*rate.Limiter{}}
				for _, k := range ks {
					m.allow(k)
				}
				return m
			},
		}
		for _, name := range []string{"sluice", "xrate"} {
			b.Run(name+"/keys="+strconv.Itoa(n), func(b *testing.B) {
				var perKey float64
				for b.Loop() {
					runtime.GC()
					var before, after runtime.MemStats
					runtime.ReadMemStats(&before)
					v := fills[name]()
					runtime.GC()
					runtime.ReadMemStats(&after)
					runtime.KeepAlive(v)
					perKey = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
				}
				b.ReportMetric(perKey, "B/key")
			})
		}
	}
}
