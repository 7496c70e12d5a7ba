package guard_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/guard"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/redisstore"
)

// TestLiveMastersExactWhileBusyAndOneDies: a three-master Cluster, one
// master killed -9 under load, while spinning goroutines keep this
// process's CPUs busy. A call to a live master whose answer was read after
// its deadline (the process was starved, not the master) was answered by
// the policy: the keys on healthy masters got 65-93 % of what they were
// owed during a failover on a loaded machine. A call to a node whose
// circuit is closed and whose last probe answered now waits for its reply
// up to guard.Options.LateGrace: the live masters' keys get every answer
// from Redis (no degraded decision), and the dead master's keys are
// answered by Local within their bound (B + r·T + 1 for one instance).
func TestLiveMastersExactWhileBusyAndOneDies(t *testing.T) {
	cl := redistest.NewClusterPartialCoverage(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	discard := slog.New(slog.DiscardHandler)
	const timeout = 100 * time.Millisecond // the store deadline then 500ms: -race slows every hop
	rs, err := redisstore.New(ctx, redisstore.Options{URL: cl.URL(), Timeout: guard.StoreTimeout(timeout, 0), Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(rs, guard.Options{Timeout: timeout, Instances: 1, CloseStore: true, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	waitUntil(t, "ready", 10*time.Second, func() bool { return g.Ready(ctx) == nil })

	victim := cl.Nodes[0]
	type keyStats struct {
		req                        sluice.Request
		dead                       bool
		offered, allowed, degraded atomic.Int64
	}
	live := sluice.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000} // never reached: owed every call
	deadLim := sluice.Limit{Rate: 20, Period: time.Second, Burst: 10}
	var keys []*keyStats
	perNode := map[string]int{}
	for i := 0; len(keys) < 9; i++ {
		k := fmt.Sprint(prefix, i)
		node := rs.NodeOf(k)
		if perNode[node] == 3 {
			continue
		}
		perNode[node]++
		ks := &keyStats{dead: node == victim.Addr}
		ks.req = sluice.Request{Key: k, Algorithm: sluice.GCRA, Limit: live, Cost: 1}
		if ks.dead {
			ks.req.Limit = deadLim
		}
		keys = append(keys, ks)
	}

	// Busy loops: one per CPU the process has.
	var spinning atomic.Bool
	spinning.Store(true)
	var spin sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		spin.Go(func() {
			x := 0
			for spinning.Load() {
				x++
			}
			_ = x
		})
	}
	defer func() { spinning.Store(false); spin.Wait() }()

	stop := make(chan struct{})
	var slowest atomic.Int64 // ns, of a live master's key's call
	var wg sync.WaitGroup
	start := time.Now()
	for w := range 4 {
		wg.Go(func() {
			for i := w; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ks := keys[i%len(keys)]
				t0 := time.Now()
				d, err := g.Apply(ctx, sluice.OpAllow, ks.req)
				if took := int64(time.Since(t0)); !ks.dead {
					for m := slowest.Load(); took > m && !slowest.CompareAndSwap(m, took); m = slowest.Load() {
					}
				}
				if err != nil {
					t.Error(err)
					return
				}
				ks.offered.Add(1)
				if d.Allowed {
					ks.allowed.Add(1)
				}
				if d.Degraded {
					ks.degraded.Add(1)
				}
			}
		})
	}
	time.Sleep(500 * time.Millisecond) // the fault's schedule, not a synchronisation
	victim.Kill()
	waitUntil(t, "the dead master's circuit open", 5*time.Second, func() bool { return g.Stats().Open == 1 })
	time.Sleep(1500 * time.Millisecond) // load on, with one master dead
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)

	st := g.Stats()
	t.Logf("%s; late answers used %d, starved late %d, openings %d; slowest live call %s", elapsed.Round(time.Millisecond), st.LateAnswers, st.StarvedLate, st.Openings, time.Duration(slowest.Load()).Round(time.Millisecond))
	var deadAllowed int64
	for _, ks := range keys {
		t.Logf("%s dead=%v: offered %d, allowed %d, degraded %d", ks.req.Key, ks.dead, ks.offered.Load(), ks.allowed.Load(), ks.degraded.Load())
		if ks.dead {
			deadAllowed += ks.allowed.Load()
			bound := float64(deadLim.Burst) + float64(deadLim.Rate)*elapsed.Seconds() + 1
			if float64(ks.allowed.Load()) > bound {
				t.Errorf("dead master's key %s admitted %d, its bound is %.0f", ks.req.Key, ks.allowed.Load(), bound)
			}
		}
	}
	// A machine so crowded that the load hardly ran (other processes on
	// its cores besides this test's busy loops and callers, which make a
	// load of about 3 per CPU) says nothing about the live keys. Judged by
	// the machine's load average, not by the guard, so that a guard whose
	// live calls hang still fails here.
	for _, ks := range keys {
		if !ks.dead && ks.offered.Load() < 20 {
			if load := loadAverage(); load > 4*float64(runtime.NumCPU()) {
				t.Skipf("key %s offered only %d calls in %s at load average %.1f: the machine is crowded", ks.req.Key, ks.offered.Load(), elapsed.Round(time.Millisecond), load)
			}
			t.Errorf("key %s offered only %d calls in %s: the load did not run", ks.req.Key, ks.offered.Load(), elapsed.Round(time.Millisecond))
		}
	}
	for _, ks := range keys {
		if ks.dead {
			continue
		}
		if ks.degraded.Load() != 0 {
			t.Errorf("live master's key %s got %d degraded answers of %d", ks.req.Key, ks.degraded.Load(), ks.offered.Load())
		}
		if r := float64(ks.allowed.Load()) / float64(ks.offered.Load()); r < 0.99 {
			t.Errorf("live master's key %s got %.3f of what it was owed", ks.req.Key, r)
		}
	}
	for _, n := range st.Nodes {
		if n.Node != victim.Addr && (n.Degraded != 0 || n.Openings != 0) {
			t.Errorf("live node %s: %d degraded decisions, %d openings", n.Node, n.Degraded, n.Openings)
		}
	}
	if deadAllowed == 0 {
		t.Errorf("the dead master's keys admitted nothing: Local did not answer them")
	}
}

// TestSlowLiveNodeAnsweredLate: a node that works (its probe answers) but
// whose replies come after the call deadline (a proxy delays each 80 ms
// past the 50 ms Timeout, as a loaded machine reads them late) gets its
// keys' answers from the store, not from the policy: the call waits up
// to Options.LateGrace. A black-holed node's keys still get the policy's
// answer within the store deadline, and once its circuit is open at once.
func TestSlowLiveNodeAnsweredLate(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Standalone(t)
	px := redistest.NewProxy(t, srv.Addr)
	const timeout = 50 * time.Millisecond
	const grace = 450 * time.Millisecond // room for -race on a loaded machine
	rs, err := redisstore.New(ctx, redisstore.Options{URL: px.URL(), Timeout: guard.StoreTimeout(timeout, grace), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(rs, guard.Options{Timeout: timeout, LateGrace: grace, Instances: 1, ProbeInterval: 20 * time.Millisecond, CloseStore: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	waitUntil(t, "ready", 10*time.Second, func() bool { return g.Ready(ctx) == nil })
	req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.GCRA, Limit: sluice.PerSecond(1000), Cost: 1}
	px.Delay.Store(int64(80 * time.Millisecond))
	for range 10 {
		d, err := g.Apply(ctx, sluice.OpAllow, req)
		if err != nil {
			t.Fatal(err)
		}
		if d.Degraded || !d.Allowed {
			t.Fatalf("a live node answering in 80 ms, past the 50 ms deadline: %+v; %+v", d, g.Stats())
		}
	}
	if st := g.Stats(); st.LateAnswers == 0 || st.DegradedTotal() != 0 {
		t.Fatalf("late answers %d, degraded %d: want the store's late answers used", st.LateAnswers, st.DegradedTotal())
	}
	px.Delay.Store(0)
	px.Hold.Store(true)
	start := time.Now()
	d, err := g.Apply(ctx, sluice.OpAllow, req)
	if took := time.Since(start); err != nil || !d.Degraded || took > 2*guard.StoreTimeout(timeout, grace) {
		t.Fatalf("a black-holed node: %+v, %v after %s", d, err, took)
	}
	waitUntil(t, "circuit open on a black hole", 10*time.Second, func() bool { return g.Stats().Open == 1 })
	start = time.Now()
	if d, err := g.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Degraded {
		t.Fatalf("circuit open: %+v, %v", d, err)
	}
	if took := time.Since(start); took >= guard.StoreTimeout(timeout, grace) {
		t.Fatalf("circuit open, answered after %s: an open circuit answers at once", took)
	}
	px.Hold.Store(false)
}

// loadAverage is the machine's 1-minute load average, 0 where
// /proc/loadavg cannot be read.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}
