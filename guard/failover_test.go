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

// TestClusterFailoverWithinBound: three instances under local on a
// six-node Cluster (3 masters + replicas), one master killed -9 while a
// key it owns, which no instance had asked before, is flooded until its
// replica is promoted and answers. Local starts such a key from a full
// share (the fleet: the whole limit, what Redis would have admitted), but
// what it admitted was owed to the dead master, which no probe ever
// reached again, and the promoted replica admitted the whole limit once
// more (1.9x). Now the promoted replica starts with its circuit open
// until it is charged what local admitted for its keys: the key stays
// within its burst + rate × the run + one per instance.
func TestClusterFailoverWithinBound(t *testing.T) {
	cl := redistest.NewClusterWithReplicas(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	discard := slog.New(slog.DiscardHandler)
	var gs []*guard.Guard
	for range 3 {
		rs, err := redisstore.New(ctx, redisstore.Options{URL: cl.URL(), InstancesKey: prefix + "instances", Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		g, err := guard.New(rs, guard.Options{Timeout: 100 * time.Millisecond, ProbeInterval: 100 * time.Millisecond,
			HeartbeatInterval: 200 * time.Millisecond, CloseStore: true, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Close() })
		gs = append(gs, g)
	}
	for _, g := range gs {
		waitUntil(t, "three instances counted", 10*time.Second, func() bool { return g.Instances() == 3 && g.Ready(ctx) == nil })
	}
	rs := gs[0].Unwrap().(*redisstore.Store)
	victim := cl.Nodes[0]
	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprint(prefix, i); rs.NodeOf(k) == victim.Addr {
			key = k
		}
	}
	// 5 a second, burst 300.
	lim := sluice.Limit{Rate: 300, Period: time.Minute, Burst: 300}
	req := sluice.Request{Key: key, Algorithm: sluice.GCRA, Limit: lim, Cost: 1}

	victim.Kill()
	killed := time.Now()
	var admitted, fromRedis, local atomic.Int64
	var recovered atomic.Int64 // ns after the kill of Redis's first answer
	var minN atomic.Int64      // the fewest instances a guard counted
	minN.Store(3)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, g := range gs {
		for range 3 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					d, err := g.Apply(ctx, sluice.OpAllow, req)
					if n := int64(g.Instances()); n < minN.Load() {
						minN.Store(n)
					}
					if err != nil {
						t.Error(err)
						return
					}
					if !d.Degraded {
						recovered.CompareAndSwap(0, int64(time.Since(killed)))
					}
					if d.Allowed {
						admitted.Add(1)
						if d.Degraded {
							local.Add(1)
						} else {
							fromRedis.Add(1)
						}
					}
				}
			})
		}
	}
	// Through the detection and the promotion (node timeout 2 s), and one
	// second of the promoted replica's answers.
	waitUntil(t, "the promoted replica answers", 20*time.Second, func() bool {
		r := recovered.Load()
		return r != 0 && time.Since(killed) > time.Duration(r)+time.Second
	})
	close(stop)
	wg.Wait()
	elapsed := time.Since(killed)
	bound := float64(lim.Burst) + float64(lim.Rate)*elapsed.Minutes() + 3
	t.Logf("admitted %d in %s (%d by local, %d by Redis; Redis first answered %s after the kill); bound %.0f",
		admitted.Load(), elapsed.Round(time.Millisecond), local.Load(), fromRedis.Load(), time.Duration(recovered.Load()).Round(time.Millisecond), bound)
	for _, g := range gs {
		t.Logf("%+v", g.Stats())
	}
	if minN.Load() != 3 {
		t.Errorf("an instance counted %d instances: heartbeats read after the promotion counted only those that renewed so far", minN.Load())
	}
	if float64(admitted.Load()) > bound {
		t.Fatalf("admitted %d, the limit allows %.0f over the run", admitted.Load(), bound)
	}
}
