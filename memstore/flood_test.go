package memstore_test

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/storetest"
)

// floodRun is a key flood against a store: a used-up 5/day key of every
// algorithm, then n distinct keys of every algorithm, charged once each
// under 10/min (so that they stay in use for 6 s and must be evicted, not
// merely expire), from as many goroutines as there are CPUs, on a clock
// that moves a microsecond a key.
type floodRun struct {
	n        int
	opts     memstore.Options
	progress func(done int, s *memstore.Store) // every n/10 keys, if set
}

// run floods and fails t if a victim is admitted again or the store goes
// over its bounds (by more than an eighth: adders wait past that).
func (f floodRun) run(t testing.TB) *memstore.Store {
	t.Helper()
	clk := clock.NewFake(storetest.T0)
	f.opts.Clock = clk
	f.opts.SweepInterval = -1
	s, err := memstore.New(f.opts)
	if err != nil {
		t.Fatal(err)
	}
	maxKeys, maxBytes := int64(f.opts.MaxKeys), f.opts.MaxBytes
	if maxKeys == 0 {
		maxKeys = memstore.DefaultMaxKeys
	}
	if maxBytes == 0 {
		maxBytes = memstore.DefaultMaxBytes
	}
	victims := map[sluice.Algorithm]sluice.Request{}
	for _, a := range sluice.Algorithms() {
		victims[a] = usedUp(t, s, a, serverKey(-1, a))
	}
	ctx := context.Background()
	workers := runtime.GOMAXPROCS(0)
	var next, over atomic.Int64
	step := int64(max(f.n/10, 1))
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(f.n) {
					return
				}
				a := sluice.Algorithms()[i%6]
				clk.Advance(time.Microsecond)
				r := sluice.Request{Key: serverKey(int(i), a), Algorithm: a, Limit: sluice.PerMinute(10), Cost: 1, Lease: "l"}
				if _, err := s.Apply(ctx, sluice.OpAllow, r); err != nil {
					t.Error(err)
					return
				}
				if int64(s.Len()) > maxKeys+maxKeys/8+int64(workers) || s.Bytes() > maxBytes+maxBytes/8+int64(workers)<<10 {
					over.Add(1)
				}
				if f.progress != nil && (i+1)%step == 0 {
					f.progress(int(i+1), s)
				}
			}
		}()
	}
	wg.Wait()
	if n := over.Load(); n > 0 {
		t.Errorf("%d times over the bounds (%d keys, %d bytes) by more than an eighth", n, maxKeys, maxBytes)
	}
	for a, r := range victims {
		if d, _ := s.Apply(ctx, sluice.OpAllow, r); d.Allowed {
			t.Errorf("the used-up %s key was admitted again after a flood of %d keys: evicted", a, f.n)
		}
	}
	return s
}

// TestFloodSparesUsedUpKeys is the quick flood of the normal suite:
// 200,000 keys through a store of 20,000 keys or 2 MiB (under the race
// detector, 20,000 through 2,000 or 256 KiB), and every algorithm's
// used-up key survives it.
func TestFloodSparesUsedUpKeys(t *testing.T) {
	n, opts := 200_000, memstore.Options{MaxKeys: 20_000, MaxBytes: 2 << 20}
	if raceOn {
		n, opts = 20_000, memstore.Options{MaxKeys: 2000, MaxBytes: 256 << 10}
	}
	floodRun{n: n, opts: opts}.run(t)
}

// TestFloodRSS is the long flood: SLUICE_FLOOD_KEYS distinct keys (make
// flood: 10,000,000) through a store at its default bounds, or at
// SLUICE_FLOOD_MAX_BYTES. Every tenth of the way it prints the process's
// RSS and heap beside the bound and the baseline measured before the
// store was made, and it fails if the live heap outgrows the store's byte
// bound or a used-up key is evicted.
func TestFloodRSS(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("SLUICE_FLOOD_KEYS"))
	if n <= 0 {
		t.Skip("SLUICE_FLOOD_KEYS unset: make flood runs it")
	}
	maxBytes := int64(memstore.DefaultMaxBytes)
	if v := os.Getenv("SLUICE_FLOOD_MAX_BYTES"); v != "" {
		b, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("SLUICE_FLOOD_MAX_BYTES: %v", err)
		}
		maxBytes = b
	}
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	baseHeap, baseRSS := ms.HeapAlloc, procStatus(t, "VmRSS")
	t.Logf("baseline: RSS %.1f MiB, heap %.1f MiB; bound max_bytes %.1f MiB, GOGC %s, GOMEMLIMIT %s",
		mib(baseRSS), mib(baseHeap), mib(uint64(maxBytes)), os.Getenv("GOGC"), os.Getenv("GOMEMLIMIT"))
	var mu sync.Mutex
	start := time.Now()
	s := floodRun{n: n, opts: memstore.Options{MaxKeys: 1 << 30, MaxBytes: maxBytes}, progress: func(done int, s *memstore.Store) {
		mu.Lock()
		defer mu.Unlock()
		runtime.ReadMemStats(&ms)
		t.Logf("%5.1f M keys in %5.1fs: held %7d keys, %6.1f MiB accounted (%.2f of max_bytes); heap %6.1f MiB, RSS %6.1f MiB (%.2f× max_bytes over the baseline), peak RSS %6.1f MiB",
			float64(done)/1e6, time.Since(start).Seconds(), s.Len(), mib(uint64(s.Bytes())), float64(s.Bytes())/float64(maxBytes),
			mib(ms.HeapAlloc), mib(procStatus(t, "VmRSS")), float64(procStatus(t, "VmRSS")-baseRSS)/float64(maxBytes), mib(procStatus(t, "VmHWM")))
	}}.run(t)
	runtime.GC()
	runtime.ReadMemStats(&ms)
	live := ms.HeapAlloc - baseHeap
	peak := procStatus(t, "VmHWM")
	t.Logf("after the flood: %d keys, %.1f MiB accounted; live heap %.1f MiB over the baseline (%.2f of max_bytes); peak RSS %.1f MiB = baseline + %.2f× max_bytes",
		s.Len(), mib(uint64(s.Bytes())), mib(live), float64(live)/float64(maxBytes), mib(peak), float64(peak-baseRSS)/float64(maxBytes))
	if float64(live) > 1.125*float64(maxBytes) {
		t.Errorf("live heap %.1f MiB over the baseline, above max_bytes %.1f MiB", mib(live), mib(uint64(maxBytes)))
	}
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// procStatus reads a size field (kB) of /proc/self/status, in bytes.
func procStatus(t testing.TB, field string) uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}
