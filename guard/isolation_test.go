package guard_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/guard"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/redisstore"
)

func guarded(t *testing.T, url string, o guard.Options) *guard.Guard {
	t.Helper()
	rs, err := redisstore.New(context.Background(), redisstore.Options{URL: url, Timeout: 5 * time.Second, InstancesKey: redistest.Prefix(t) + "instances", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	o.CloseStore = true
	o.Logger = slog.New(slog.DiscardHandler)
	g, err := guard.New(rs, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// 1,000 concurrent checks on one key, with each algorithm, never degrade
// another key's decisions, nor open the circuit: the key's calls queue in
// its own callers, at most MaxInFlightPerKey of them in Redis.
func TestHotKeyNeverDegradesOthers(t *testing.T) {
	g := guarded(t, redistest.Standalone(t).URL(), guard.Options{Timeout: time.Second})
	prefix := redistest.Prefix(t)
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.SlidingWindowLog, sluice.SlidingWindowCounter, sluice.FixedWindow, sluice.Concurrency} {
		t.Run(a.String(), func(t *testing.T) {
			hot := sluice.Request{Key: prefix + a.String() + ":hot", Algorithm: a, Limit: sluice.Limit{Rate: 500, Period: time.Minute}, Cost: 1}
			start := make(chan struct{})
			var wg sync.WaitGroup
			var hotDegraded atomic.Int64
			for i := range 1000 {
				r := hot
				r.Lease = fmt.Sprint("lease-", i)
				wg.Go(func() {
					<-start
					if d, err := g.Apply(context.Background(), sluice.OpAllow, r); err != nil || d.Degraded {
						hotDegraded.Add(1)
					}
				})
			}
			close(start)
			var coldDegraded []string
			for i := range 50 {
				r := sluice.Request{Key: fmt.Sprint(prefix, a, ":cold:", i), Algorithm: sluice.GCRA, Limit: sluice.PerSecond(10), Cost: 1}
				if d, err := g.Apply(context.Background(), sluice.OpAllow, r); err != nil || d.Degraded || !d.Allowed {
					coldDegraded = append(coldDegraded, fmt.Sprintf("%+v %v", d, err))
				}
			}
			wg.Wait()
			if len(coldDegraded) > 0 {
				t.Errorf("%d of 50 cold decisions degraded during the burst: %v", len(coldDegraded), coldDegraded[0])
			}
			if st := g.Stats(); st.Openings != 0 {
				t.Errorf("the hot key opened the circuit: %+v", st)
			}
			t.Logf("hot key: %d of 1000 answered by the policy (busy or late)", hotDegraded.Load())
		})
	}
}

// On a six-node Cluster, one master sleeping (DEBUG SLEEP) and then one
// master killed: keys owned by the other masters never get a degraded
// decision; the failing master's keys get the policy's, and exact answers
// again after the failover.
func TestClusterOneMasterFails(t *testing.T) {
	cl := redistest.NewClusterWithReplicas(t)
	// A grace (LateGrace) well under the 1.5 s sleep: within it, the
	// sleeping master's keys get its late, exact answers.
	g := guarded(t, cl.URL(), guard.Options{Timeout: 250 * time.Millisecond, LateGrace: 250 * time.Millisecond, ProbeInterval: 100 * time.Millisecond})
	rs := g.Unwrap().(*redisstore.Store)
	ctx := context.Background()
	if _, err := rs.Nodes(ctx); err != nil {
		t.Fatal(err)
	}
	prefix := redistest.Prefix(t)
	keys := map[string][]string{} // by owner
	for i := range 300 {
		k := fmt.Sprint(prefix, i)
		keys[rs.NodeOf(k)] = append(keys[rs.NodeOf(k)], k)
	}
	if len(keys) != 3 {
		t.Fatalf("keys on %d masters", len(keys))
	}
	check := func(k string) sluice.Decision {
		d, err := g.Apply(ctx, sluice.OpAllow, sluice.Request{Key: k, Algorithm: sluice.GCRA, Limit: sluice.PerSecond(1000), Cost: 1})
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		return d
	}
	// others checks every key not on victim, and counts degraded answers.
	others := func(victim string) int {
		bad := 0
		for node, ks := range keys {
			if node == victim {
				continue
			}
			for _, k := range ks {
				if d := check(k); d.Degraded {
					bad++
				}
			}
		}
		return bad
	}

	// The master sleeps for less than the cluster's node timeout (2s here,
	// 15s by default), so it is slow, not failed: the cluster starts no
	// failover, which would leave the kill below in the middle of one.
	victim := cl.Nodes[0]
	slept := make(chan error, 1)
	go func() {
		_, err := victim.Do(ctx, "DEBUG", "SLEEP", "1.5")
		slept <- err
	}()
	var victimDegraded int
	deadline := time.Now().Add(1200 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n := others(victim.Addr); n != 0 {
			t.Fatalf("%d decisions degraded on healthy masters while %s sleeps", n, victim.Addr)
		}
		for _, k := range keys[victim.Addr][:5] {
			if check(k).Degraded {
				victimDegraded++
			}
		}
	}
	if victimDegraded == 0 {
		t.Fatal("the sleeping master's keys were never degraded: the test did not reach it")
	}
	if err := <-slept; err != nil {
		t.Fatal(err)
	}
	back := waitUntil(t, "the slept master's keys answered by Redis", 10*time.Second, func() bool {
		return g.Ready(ctx) == nil && !check(keys[victim.Addr][0]).Degraded
	})
	t.Logf("exact answers %s after DEBUG SLEEP returned", back)

	killed := cl.Nodes[1]
	killed.Kill()
	// Through the failure detection and the replica's promotion (the
	// node timeout is 2s), for 6s.
	recovered := time.Duration(0)
	start := time.Now()
	for time.Since(start) < 6*time.Second {
		if n := others(killed.Addr); n != 0 {
			t.Fatalf("%d decisions degraded on healthy masters after %s died", n, killed.Addr)
		}
		if recovered == 0 && !check(keys[killed.Addr][0]).Degraded {
			recovered = time.Since(start)
		}
	}
	t.Logf("the killed master's first key answered by Redis %s after the kill (0: not within 6s); %+v", recovered, g.Stats())
}
