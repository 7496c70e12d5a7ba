package memstore_test

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/memstore"
)

// The baselines these are compared with (x/time/rate) live in the bench
// module; see docs/BENCHMARKS.md.

func benchStore(b *testing.B) *memstore.Store {
	s, err := memstore.New(memstore.Options{SweepInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// huge never denies, so every call takes the full path of an admission.
var huge = sluice.Limit{Rate: 1 << 40, Period: time.Second, Burst: 1 << 40}

func BenchmarkAllowSingleKey(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	req := sluice.Request{Key: "user:42", Algorithm: sluice.GCRA, Limit: huge, Cost: 1}
	b.ReportAllocs()
	for b.Loop() {
		_, _ = s.Apply(ctx, sluice.OpAllow, req)
	}
}

func BenchmarkAllowSingleKeyParallel(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	req := sluice.Request{Key: "user:42", Algorithm: sluice.GCRA, Limit: huge, Cost: 1}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, _ = s.Apply(ctx, sluice.OpAllow, req)
		}
	})
}

// keys returns n distinct keys.
func keys(n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = "user:" + strconv.Itoa(i)
	}
	return ks
}

func BenchmarkAllow100kKeysParallel(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	ks := keys(100_000)
	for _, k := range ks {
		_, _ = s.Apply(ctx, sluice.OpAllow, sluice.Request{Key: k, Algorithm: sluice.GCRA, Limit: huge, Cost: 1})
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(rand.Uint64(), 1))
		req := sluice.Request{Algorithm: sluice.GCRA, Limit: huge, Cost: 1}
		for pb.Next() {
			req.Key = ks[r.IntN(len(ks))]
			_, _ = s.Apply(ctx, sluice.OpAllow, req)
		}
	})
}

// BenchmarkBytesPerKey reports the heap the store holds per GCRA key,
// with its copy of the key string ("user:N", a 16-byte allocation);
// TestBytesPerKey measures every algorithm with sluice serve's keys.
func BenchmarkBytesPerKey(b *testing.B) {
	const n = 100_000
	ks := keys(n)
	ctx := context.Background()
	var perKey float64
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		s, _ := memstore.New(memstore.Options{SweepInterval: -1})
		for _, k := range ks {
			_, _ = s.Apply(ctx, sluice.OpAllow, sluice.Request{Key: k, Algorithm: sluice.GCRA, Limit: sluice.PerHour(10), Cost: 1})
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		perKey = float64(after.HeapAlloc-before.HeapAlloc) / n
		runtime.KeepAlive(s)
	}
	b.ReportMetric(perKey, "B/key")
}

func BenchmarkAllowAll3(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	reqs := []sluice.Request{
		{Key: "{u}:s", Algorithm: sluice.GCRA, Limit: huge, Cost: 1},
		{Key: "{u}:m", Algorithm: sluice.TokenBucket, Limit: huge, Cost: 1},
		{Key: "{u}:d", Algorithm: sluice.FixedWindow, Limit: sluice.Limit{Rate: 1 << 40, Period: 24 * time.Hour}, Cost: 1},
	}
	b.ReportAllocs()
	for b.Loop() {
		_, _ = s.ApplyAll(ctx, sluice.OpAllow, reqs)
	}
}

func BenchmarkAlgorithms(b *testing.B) {
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.FixedWindow, sluice.SlidingWindowCounter} {
		b.Run(a.String(), func(b *testing.B) {
			s := benchStore(b)
			ctx := context.Background()
			req := sluice.Request{Key: "k", Algorithm: a, Limit: huge, Cost: 1}
			b.ReportAllocs()
			for b.Loop() {
				_, _ = s.Apply(ctx, sluice.OpAllow, req)
			}
		})
	}
}

// BenchmarkFloodNewKeys: every call a key never seen, through a store
// bounded at 100,000 keys, so the cost of eviction is in the figure,
// spread over the calls.
func BenchmarkFloodNewKeys(b *testing.B) {
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket} {
		b.Run(a.String(), func(b *testing.B) {
			s, err := memstore.New(memstore.Options{MaxKeys: 100_000, SweepInterval: -1})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			req := sluice.Request{Algorithm: a, Limit: sluice.PerHour(10), Cost: 1}
			var buf []byte
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				buf = strconv.AppendInt(append(buf[:0], "flood:"...), int64(i), 10)
				req.Key = string(buf)
				i++
				_, _ = s.Apply(ctx, sluice.OpAllow, req)
			}
		})
	}
}
