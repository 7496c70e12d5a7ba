package fairqueue

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/memstore"
)

// BenchmarkAdmit compares, per request, on the memory store (so that the
// queue's own CPU is not hidden behind a network round trip):
//
//   - direct: one ApplyAll of the key's limit and the capacity's bucket
//     under the store timeout, what the gateway's admission costs without
//     a queue (the baseline);
//   - unqueued: Admit when nothing waits, the queue's fast path;
//   - queued: every request waits (64 are submitted while others wait) and
//     is admitted by Dispatch: enqueue, fair pick, try, wake-up.
//
// Besides ns/op (wall time, inflated by other processes on a shared
// machine), each reports cpu-ns/op: the process's CPU time per request, GC
// included.
//
// Run: go test -run '^$' -bench Admit -benchmem ./internal/fairqueue/
func BenchmarkAdmit(b *testing.B) {
	ctx := context.Background()
	newStore := func(b *testing.B) sluice.Store {
		st, err := memstore.New(memstore.Options{SweepInterval: -1})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = st.Close() })
		return st
	}
	huge := sluice.Limit{Rate: 1 << 40, Period: time.Minute}
	caps := map[string][]Limit{"m": {{Name: "rpm", Kind: Requests, Algorithm: sluice.GCRA, Limit: huge}}}
	keys := make([]string, 10)
	own := make([][]sluice.Request, 10)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
		own[i] = []sluice.Request{{Key: "{gw:" + keys[i] + "}:rpm", Algorithm: sluice.GCRA, Limit: huge, Cost: 1}}
	}
	newQueue := func(b *testing.B) *Queue {
		q, err := New(Options{Store: newStore(b), Capacities: caps, KeyPrefix: "{q}:", MaxWait: time.Minute, MaxPerKey: 1 << 20, MaxPerGroup: 1 << 20, MaxTotal: 1 << 20})
		if err != nil {
			b.Fatal(err)
		}
		return q
	}
	b.Run("direct", func(b *testing.B) {
		st := newStore(b)
		b.ReportAllocs()
		defer cpuPerOp(b)()
		i := 0
		for b.Loop() {
			reqs := make([]sluice.Request, 0, 2)
			reqs = append(reqs, own[i%10]...)
			reqs = append(reqs, sluice.Request{Key: "{q}:m:pool:rpm", Algorithm: sluice.GCRA, Limit: huge, Cost: 1})
			cctx, cancel := context.WithTimeout(ctx, time.Second) // as the gateway's admit
			ds, err := st.ApplyAll(cctx, sluice.OpAllow, reqs)
			cancel()
			if err != nil || !ds[0].Allowed {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("unqueued", func(b *testing.B) {
		q := newQueue(b)
		b.ReportAllocs()
		defer cpuPerOp(b)()
		i := 0
		for b.Loop() {
			res, err := q.Admit(ctx, &Item{Key: keys[i%10], Capacity: "m", Reqs: own[i%10]})
			if err != nil || res.Outcome != Admitted || res.Queued {
				b.Fatal(err, res.Outcome)
			}
			i++
		}
	})
	b.Run("queued", func(b *testing.B) {
		q := newQueue(b)
		// A blocker waits ahead of everything, on its own concurrency
		// slot held elsewhere, so that every request below is queued.
		slot := sluice.Request{Key: "{gw:blocker}:c", Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: 1, Period: time.Hour}, Cost: 1, Lease: "elsewhere"}
		if _, err := q.o.Store.ApplyAll(ctx, sluice.OpAllow, []sluice.Request{slot}); err != nil {
			b.Fatal(err)
		}
		slot.Lease = "blocker"
		blocker, err := q.Submit(ctx, &Item{Key: "blocker", Capacity: "m", Reqs: []sluice.Request{slot}})
		if err != nil || blocker.res.Outcome != Pending {
			b.Fatal("blocker not queued", err)
		}
		b.Cleanup(func() { q.Cancel(blocker) })
		b.ReportAllocs()
		defer cpuPerOp(b)()
		const batch = 64
		ws := make([]*Waiter, 0, batch)
		i := 0
		for b.Loop() {
			w, err := q.Submit(ctx, &Item{Key: keys[i%10], Capacity: "m", Reqs: own[i%10]})
			if err != nil {
				b.Fatal(err)
			}
			ws = append(ws, w)
			i++
			if len(ws) == batch {
				drain(b, q, ws)
				ws = ws[:0]
			}
		}
		drain(b, q, ws)
	})
}

// drain dispatches until every waiter of ws is done, and checks that each
// waited and was admitted.
func drain(b *testing.B, q *Queue, ws []*Waiter) {
	ctx := context.Background()
	for q.total > 1 {
		q.Dispatch(ctx)
	}
	for j, w := range ws {
		<-w.Done()
		if r := w.Result(); r.Outcome != Admitted || !r.Queued {
			b.Fatalf("item %d: %s queued %v", j, r.Outcome, r.Queued)
		}
	}
}

// cpuPerOp starts measuring the process's CPU time; the returned function
// reports it per iteration as cpu-ns/op.
func cpuPerOp(b *testing.B) func() {
	start := processCPU()
	return func() {
		if used := processCPU() - start; used > 0 && b.N > 0 {
			b.ReportMetric(float64(used.Nanoseconds())/float64(b.N), "cpu-ns/op")
		}
	}
}
