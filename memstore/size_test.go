package memstore_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/storetest"
)

// serverKey is a key as sluice serve names one: an API key's identity (the
// 64 hex digits of its SHA-256) in a hash tag, the policy and the
// algorithm (89 bytes for gcra).
func serverKey(i int, a sluice.Algorithm) string {
	return fmt.Sprintf("sluice:{key:%064x}:policy:%s", i, a)
}

// heapPerKey fills a fresh store with n keys of algorithm a (each charged
// once, a concurrency key holding one lease) and returns the live heap the
// store took per key, measured after a collection, and what the store
// accounts per key.
func heapPerKey(t testing.TB, a sluice.Algorithm, n int) (measured, accounted float64) {
	clk := clock.NewFake(storetest.T0)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s, err := memstore.New(memstore.Options{Clock: clk, MaxKeys: 2 * n, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range n {
		r := sluice.Request{Key: serverKey(i, a), Algorithm: a, Limit: sluice.PerHour(100), Cost: 1, Lease: "lease-" + strconv.Itoa(i%1000)}
		if _, err := s.Apply(ctx, sluice.OpAllow, r); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if s.Len() != n {
		t.Fatalf("%d keys held, want %d", s.Len(), n)
	}
	measured = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
	accounted = float64(s.Bytes()) / float64(n)
	runtime.KeepAlive(s)
	return measured, accounted
}

// TestBytesPerKey: the store's account of its bytes (MaxBytes) covers
// what its keys really take on the heap, for every algorithm, and is not
// far above it. It prints the figures docs/redis.md gives.
func TestBytesPerKey(t *testing.T) {
	const n = 10_000
	for _, a := range sluice.Algorithms() {
		measured, accounted := heapPerKey(t, a, n)
		t.Logf("%-22s %4.0f B/key measured on the heap, %4.0f accounted (%d-byte keys)", a, measured, accounted, len(serverKey(0, a)))
		if measured > accounted {
			t.Errorf("%s: a key takes %.0f bytes, the store accounts %.0f: MaxBytes would not bound the heap", a, measured, accounted)
		}
		if accounted > 1.5*measured {
			t.Errorf("%s: the store accounts %.0f bytes a key, over 1.5× the %.0f it takes", a, accounted, measured)
		}
	}
}

// TestMaxBytesBoundsMemory: a flood of long keys is held to MaxBytes, as
// the store accounts them, whatever MaxKeys allows.
func TestMaxBytesBoundsMemory(t *testing.T) {
	clk := clock.NewFake(storetest.T0)
	const maxBytes = 1 << 20
	s, _ := memstore.New(memstore.Options{Clock: clk, MaxBytes: maxBytes, SweepInterval: -1})
	ctx := context.Background()
	long := string(make([]byte, 500))
	peak := int64(0)
	for i := range 5000 {
		clk.Advance(time.Millisecond)
		r := sluice.Request{Key: fmt.Sprint(long, i), Algorithm: sluice.Algorithms()[i%6], Limit: sluice.PerMinute(10), Cost: 1, Lease: "l"}
		if _, err := s.Apply(ctx, sluice.OpAllow, r); err != nil {
			t.Fatal(err)
		}
		peak = max(peak, s.Bytes())
	}
	if peak > maxBytes+1024 {
		t.Fatalf("the store held %d accounted bytes, over MaxBytes %d by more than a key", peak, maxBytes)
	}
	if s.Len() < 1000 {
		t.Fatalf("only %d keys held: eviction overshot", s.Len())
	}
	t.Logf("peak %d of %d bytes, %d keys held", peak, maxBytes, s.Len())
}

// TestFloodHeldToBounds: many goroutines adding keys at once cannot outrun
// the sweep: past a bound by an eighth, an adder waits for the sweep.
func TestFloodHeldToBounds(t *testing.T) {
	const maxKeys, workers = 2000, 8
	s, _ := memstore.New(memstore.Options{Clock: clock.NewFake(storetest.T0), MaxKeys: maxKeys, SweepInterval: -1})
	ctx := context.Background()
	var wg sync.WaitGroup
	peaks := make([]int, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5000 {
				r := sluice.Request{Key: fmt.Sprint(w, ":", i), Algorithm: sluice.Algorithms()[i%2], Limit: sluice.PerHour(10), Cost: 1}
				if _, err := s.Apply(ctx, sluice.OpAllow, r); err != nil {
					t.Error(err)
					return
				}
				peaks[w] = max(peaks[w], s.Len())
			}
		}()
	}
	wg.Wait()
	if peak := slices.Max(peaks); peak > maxKeys+maxKeys/8+workers {
		t.Fatalf("%d keys held at once, over MaxKeys %d by more than an eighth and the adders in flight", peak, maxKeys)
	}
}
