package guard

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/memstore"
)

// deaf is a memstore whose calls, while held, wait for release and ignore
// their context, as a client redialing a stalled server does.
type deaf struct {
	*faulty
	held    chan struct{} // closed: calls pass
	waiting chan struct{} // one send per call that waits
}

func (d *deaf) Apply(ctx context.Context, op sluice.Op, r sluice.Request) (sluice.Decision, error) {
	select {
	case <-d.held:
	default:
		d.waiting <- struct{}{}
		<-d.held
	}
	return d.faulty.Store.Apply(ctx, op, r)
}

// A call that ignores its context is answered at the guard's deadline by
// the policy; the calls stuck behind a stall do not keep their worker
// goroutines once they end, and Close ends the idle ones.
func TestBoundedCallsAndTheirWorkers(t *testing.T) {
	d := &deaf{faulty: newFaulty(t), held: make(chan struct{}), waiting: make(chan struct{}, 1024)}
	g := newGuard(t, d, Options{Policy: FailClosed, Timeout: 500 * time.Millisecond, MinFailures: 1 << 20})
	limit := g.workers.max
	n := int(3 * limit)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r, err := g.Apply(context.Background(), sluice.OpAllow, req("k"+string(rune('a'+i%26))+string(rune('a'+i/26)), 10))
			if err != nil || !r.Degraded || r.Allowed {
				t.Errorf("call %d while the store is deaf: %+v %v", i, r, err)
			}
		})
	}
	wg.Wait() // every call returned at its deadline, the store still deaf
	for range n {
		<-d.waiting
	}
	if got := g.workers.running.Load(); got != int64(n) {
		t.Fatalf("%d workers run the %d stuck calls", got, n)
	}
	close(d.held)
	eventually(t, "workers above the bound end", func() bool { return g.workers.running.Load() <= limit })
	for i := range 100 { // sequential calls reuse the workers left
		r, err := g.Apply(context.Background(), sluice.OpAllow, req("after", 1000))
		if err != nil || r.Degraded || !r.Allowed || r.Limit.Rate != 1000 {
			// (a stuck call's late answer is for a rate of 10)
			t.Fatalf("call %d after the stall: %+v %v", i, r, err)
		}
		if got := g.workers.running.Load(); got > limit {
			t.Fatalf("%d workers, bound %d", got, limit)
		}
	}
	g.Close()
	eventually(t, "workers end at Close", func() bool { return g.workers.running.Load() == 0 })
}

// BenchmarkBounded is the cost of running store calls on workers, so that
// a caller returns at its deadline, against calling the store directly
// (Timeout -1), on memstore with 64 callers: b.N calls in each; and
// without the late grace's second deadline (LateGrace -1).
func BenchmarkBounded(b *testing.B) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		grace   time.Duration
	}{{"direct", -1, 0}, {"bounded", time.Second, 0}, {"bounded-nograce", time.Second, -1}} {
		b.Run(tc.name, func(b *testing.B) {
			m, err := memstore.New(memstore.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			g, err := New(m, Options{Policy: FailClosed, Timeout: tc.timeout, LateGrace: tc.grace, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			defer g.Close()
			var next atomic.Int64
			b.SetParallelism(32)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				reqs := make([]sluice.Request, 1)
				for pb.Next() {
					reqs[0] = req("k"+strconv.FormatInt(next.Add(1)%100000, 10), 1e9)
					if _, err := g.ApplyAll(context.Background(), sluice.OpAllow, reqs); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
