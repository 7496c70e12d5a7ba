// Command corebench measures sluice's memory store against
// golang.org/x/time/rate in the same run and prints each figure as a ratio
// of the baseline. Pairs are run alternately, several rounds, and the median
// ratio is reported, so that a noisy machine hurts both sides alike.
//
//	go run ./cmd/corebench -rounds 5
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
)

var huge = sluice.Limit{Rate: 1 << 40, Period: time.Second, Burst: 1 << 40}

func newStore() *memstore.Store {
	s, err := memstore.New(memstore.Options{SweepInterval: -1})
	if err != nil {
		panic(err) // options are constant
	}
	return s
}

func sluiceSerial(b *testing.B) { serial(b, newStore()) }

// sluiceSerialExact is sluiceSerial on the exact system clock instead of
// the memory store's default coarse one (docs/BENCHMARKS.md).
func sluiceSerialExact(b *testing.B) {
	s, err := memstore.New(memstore.Options{SweepInterval: -1, Clock: clock.NewSystem()})
	if err != nil {
		panic(err) // options are constant
	}
	serial(b, s)
}

func serial(b *testing.B, s *memstore.Store) {
	req := sluice.Request{Key: "user:42", Algorithm: sluice.GCRA, Limit: huge, Cost: 1}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = s.Apply(ctx, sluice.OpAllow, req)
	}
}

func xrateSerial(b *testing.B) {
	l := rate.NewLimiter(rate.Inf, 1)
	l.SetLimit(rate.Limit(1 << 40))
	l.SetBurst(1 << 40)
	b.ReportAllocs()
	for b.Loop() {
		_ = l.Allow()
	}
}

func sluiceParallel(b *testing.B) {
	s := newStore()
	req := sluice.Request{Key: "user:42", Algorithm: sluice.GCRA, Limit: huge, Cost: 1}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, _ = s.Apply(ctx, sluice.OpAllow, req)
		}
	})
}

func xrateParallel(b *testing.B) {
	l := rate.NewLimiter(rate.Limit(1<<40), 1<<40)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = l.Allow()
		}
	})
}

const nKeys = 100_000

var keys = func() []string {
	ks := make([]string, nKeys)
	for i := range ks {
		ks[i] = "user:" + strconv.Itoa(i)
	}
	return ks
}()

func sluiceManyKeys(b *testing.B) {
	s := newStore()
	ctx := context.Background()
	for _, k := range keys {
		_, _ = s.Apply(ctx, sluice.OpAllow, sluice.Request{Key: k, Algorithm: sluice.GCRA, Limit: huge, Cost: 1})
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(rand.Uint64(), 2))
		req := sluice.Request{Algorithm: sluice.GCRA, Limit: huge, Cost: 1}
		for pb.Next() {
			req.Key = keys[r.IntN(nKeys)]
			_, _ = s.Apply(ctx, sluice.OpAllow, req)
		}
	})
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

func xrateManyKeys(b *testing.B) {
	m := &mutexMap{m: map[string]*rate.Limiter{}}
	for _, k := range keys {
		m.allow(k)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(rand.Uint64(), 3))
		for pb.Next() {
			m.allow(keys[r.IntN(nKeys)])
		}
	})
}

// bytesPerKey measures heap held per key over n keys, the caller's key
// strings excluded.
func bytesPerKey(n int, fill func() any) float64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	v := fill()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(v)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
}

func main() {
	rounds := flag.Int("rounds", 5, "alternating rounds per pair; the median ratio is reported")
	flag.Parse()
	type pair struct {
		name, target string
		ours, base   func(*testing.B)
	}
	pairs := []pair{
		{"single key, serial", "≤ 0.5", sluiceSerial, xrateSerial},
		{"single key, serial, exact clock", "", sluiceSerialExact, xrateSerial},
		{"single key, RunParallel", "≤ 0.5", sluiceParallel, xrateParallel},
		{"100k random keys, RunParallel", "≤ 0.5", sluiceManyKeys, xrateManyKeys},
	}
	w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "benchmark\tsluice ns/op\tx/time/rate ns/op\tratio (median of %d)\ttarget\tsluice allocs/op\n", *rounds)
	for _, p := range pairs {
		var ours, base, ratios []float64
		var allocs int64
		for range *rounds {
			o := testing.Benchmark(p.ours)
			bb := testing.Benchmark(p.base)
			ours = append(ours, float64(o.NsPerOp()))
			base = append(base, float64(bb.NsPerOp()))
			ratios = append(ratios, float64(o.NsPerOp())/float64(bb.NsPerOp()))
			allocs = o.AllocsPerOp()
		}
		fmt.Fprintf(w, "%s\t%.1f\t%.1f\t%.2f\t%s\t%d\n", p.name, median(ours), median(base), median(ratios), p.target, allocs)
	}
	ctx := context.Background()
	for _, n := range []int{nKeys, 10 * nKeys} {
		ks := keys
		if n != len(keys) {
			ks = make([]string, n)
			for i := range ks {
				ks[i] = "user:" + strconv.Itoa(i)
			}
		}
		ourBytes := bytesPerKey(n, func() any {
			// Bounds above n keys: the figure is the store's cost per key, not its eviction.
			s, err := memstore.New(memstore.Options{SweepInterval: -1, MaxKeys: 2 * n, MaxBytes: 1 << 30})
			if err != nil {
				panic(err) // options are constant
			}
			for _, k := range ks {
				_, _ = s.Apply(ctx, sluice.OpAllow, sluice.Request{Key: k, Algorithm: sluice.GCRA, Limit: sluice.PerHour(10), Cost: 1})
			}
			return s
		})
		baseBytes := bytesPerKey(n, func() any {
			m := &mutexMap{m: map[string]*rate.Limiter{}}
			for _, k := range ks {
				m.allow(k)
			}
			return m
		})
		fmt.Fprintf(w, "bytes per key (%dk keys)\t%.1f B\t%.1f B\t%.2f\t≤ 0.5\t\n", n/1000, ourBytes, baseBytes, ourBytes/baseBytes)
	}
	w.Flush()
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
