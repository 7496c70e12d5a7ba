package memstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/storetest"
)

func TestIdleKeysExpireWhenFull(t *testing.T) {
	clk := clock.NewFake(storetest.T0)
	s, _ := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	ctx := context.Background()
	for i := range 100 {
		for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.FixedWindow} {
			r := sluice.Request{Key: fmt.Sprintf("%s-%d", a, i), Algorithm: a, Limit: sluice.PerSecond(10), Cost: 1}
			if _, err := s.Apply(ctx, sluice.OpAllow, r); err != nil {
				t.Fatal(err)
			}
		}
	}
	if s.Len() != 300 {
		t.Fatalf("Len = %d, want 300", s.Len())
	}
	clk.Advance(99 * time.Millisecond)
	if n := s.Sweep(); n != 0 {
		t.Fatalf("swept %d keys whose state still matters", n)
	}
	clk.Advance(time.Second)
	if n := s.Sweep(); n != 300 || s.Len() != 0 {
		t.Fatalf("swept %d, %d left; want all 300 gone once full again", n, s.Len())
	}
}

func TestMaxKeysBoundsMemory(t *testing.T) {
	clk := clock.NewFake(storetest.T0)
	s, _ := memstore.New(memstore.Options{Clock: clk, MaxKeys: 1000, SweepInterval: -1})
	ctx := context.Background()
	lim := sluice.PerHour(10)
	for i := range 5000 {
		clk.Advance(time.Millisecond)
		if _, err := s.Apply(ctx, sluice.OpAllow, sluice.Request{Key: fmt.Sprint("k", i), Algorithm: sluice.GCRA, Limit: lim, Cost: 1}); err != nil {
			t.Fatal(err)
		}
		if s.Len() > 1000 {
			t.Fatalf("after %d keys the store holds %d, over MaxKeys 1000", i+1, s.Len())
		}
	}
	// The most recently charged key survived eviction.
	d, _ := s.Apply(ctx, sluice.OpPeek, sluice.Request{Key: "k4999", Algorithm: sluice.GCRA, Limit: lim})
	if d.Remaining != 9 {
		t.Fatalf("newest key lost its state: %+v", d)
	}
}

// TestHammer: many goroutines on one key and on a batch never over-admit.
func TestHammer(t *testing.T) {
	clk := clock.NewFake(storetest.T0)
	s, _ := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	ctx := context.Background()
	single := sluice.Request{Key: "{h}:one", Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 100, Period: time.Second, Burst: 50}, Cost: 1}
	other := sluice.Request{Key: "{h}:two", Algorithm: sluice.SlidingWindowLog, Limit: sluice.Limit{Rate: 80, Period: time.Second}, Cost: 1}
	var admittedOne, admittedBatch atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				if g == 0 && i%50 == 0 {
					clk.Advance(10 * time.Millisecond)
				}
				if d, err := s.Apply(ctx, sluice.OpAllow, single); err == nil && d.Allowed {
					admittedOne.Add(1)
				}
				if d, _, err := sluice.AllowAll(ctx, s, []sluice.Request{single, other}); err == nil && d.Allowed {
					admittedBatch.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Duration(clk.Now() - storetest.T0.UnixNano())
	maxOne := 50 + 100*elapsed.Seconds() + 1
	if got := float64(admittedOne.Load() + admittedBatch.Load()); got > maxOne {
		t.Fatalf("key one admitted %v in %s, limit allows %v", got, elapsed, maxOne)
	}
	if got := admittedBatch.Load(); got > 80+int64(80*elapsed.Seconds())+1 {
		t.Fatalf("batch admitted %d, over the log's limit", got)
	}
	// every admission of the batch also charged key two, and no more
	d, _ := s.Apply(ctx, sluice.OpPeek, other)
	if used := 80 - d.Remaining; elapsed < time.Second && used != admittedBatch.Load() {
		t.Fatalf("log holds %d entries, batches admitted %d", used, admittedBatch.Load())
	}
}

// FuzzMatchesAlgo: the memory store's fast paths give exactly the pure
// algorithm's answers for any sequence of operations.
func FuzzMatchesAlgo(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 200, 3, 0, 1})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 9})
	f.Fuzz(func(t *testing.T, prog []byte) {
		if len(prog) < 2 {
			return
		}
		clk := clock.NewFake(storetest.T0)
		s, _ := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
		a := sluice.Algorithms()[int(prog[0])%6]
		lim := sluice.Limit{Rate: int64(prog[1]%7) + 1, Period: time.Duration(prog[1]%3+1) * time.Second, Burst: int64(prog[1] % 5)}
		var st algo.State
		ops := []sluice.Op{sluice.OpAllow, sluice.OpAllow, sluice.OpPeek, sluice.OpRefund, sluice.OpCharge, sluice.OpReset}
		for i := 2; i+1 < len(prog); i += 2 {
			clk.Advance(time.Duration(prog[i]) * 37 * time.Millisecond)
			op := ops[int(prog[i+1])%len(ops)]
			r := sluice.Request{Key: "k", Algorithm: a, Limit: lim, Cost: int64(prog[i+1]>>4) % 4, Lease: fmt.Sprint(prog[i+1] & 3)}
			want, next, wantErr := algo.Apply(op, st, r, clk.Now())
			got, err := s.Apply(context.Background(), op, r)
			if (err != nil) != (wantErr != nil) {
				t.Fatalf("step %d %s %+v: store error %v, algo error %v", i, op, r, err, wantErr)
			}
			if err != nil {
				continue
			}
			st = next
			if got != want {
				t.Fatalf("step %d %s %+v:\nstore %+v\nalgo  %+v", i, op, r, got, want)
			}
		}
	})
}

// TestEvictionSparesExhaustedKeys: a caller who fills the store with fresh
// keys of a policy must not evict the state of a key that used up its
// limit, or the key starts over (a bypass of long windows). Past MaxKeys
// the store drops the keys whose loss admits least: those with the least
// of their limit used.
func TestEvictionSparesExhaustedKeys(t *testing.T) {
	for _, a := range sluice.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			clk := clock.NewFake(storetest.T0)
			s, _ := memstore.New(memstore.Options{Clock: clk, MaxKeys: 100, SweepInterval: -1})
			ctx := context.Background()
			lim := sluice.PerDay(10)
			n := 0
			req := func(key string) sluice.Request {
				n++ // a lease id for concurrency
				return sluice.Request{Key: key, Algorithm: a, Limit: lim, Cost: 1, Lease: fmt.Sprint(n)}
			}
			for range 10 {
				if d, err := s.Apply(ctx, sluice.OpAllow, req("victim")); err != nil || !d.Allowed {
					t.Fatalf("victim's own limit: %+v, %v", d, err)
				}
			}
			for i := range 1000 {
				clk.Advance(time.Second)
				if _, err := s.Apply(ctx, sluice.OpAllow, req(fmt.Sprint("fresh", i))); err != nil {
					t.Fatal(err)
				}
				if s.Len() > 100 {
					t.Fatalf("%d keys held, over MaxKeys", s.Len())
				}
			}
			if d, _ := s.Apply(ctx, sluice.OpAllow, req("victim")); d.Allowed {
				t.Fatalf("victim admitted again after 1,000 fresh keys: its state was evicted (%+v)", d)
			}
		})
	}
}
