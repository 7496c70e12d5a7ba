package guard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sluice-io/sluice"
)

// The background probe: every ProbeInterval it pings every node, whatever
// the traffic. MaxProbeFailures failures in a row open a node's circuit; a
// success closes an open one once Local's charges for the node are
// settled. Ready reads what it found. Every HeartbeatInterval it renews
// the instance's heartbeat and reads the instance count.

// probeKey is the key of the zero-cost peek that probes a store which has
// no Ping.
const probeKey = "sluice:guard:probe"

// lateRetry is how many probe deadlines the ping after a late one gets.
const lateRetry = 4

// probeTimeout bounds one ping.
func (c *core) probeTimeout() time.Duration {
	if c.timeout <= 0 {
		return time.Second
	}
	return max(2*c.timeout, 100*time.Millisecond)
}

func (c *core) run() {
	defer close(c.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-c.stop
		cancel()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	if c.membership != nil {
		// Heartbeats keep their own rhythm: behind probes of a dead node
		// (each up to the probe timeout), ticks were dropped, an instance
		// renewed later than the TTL and the others counted it gone,
		// handing each a larger Local share during a failover.
		wg.Go(func() {
			beat := time.NewTicker(c.beatEvery)
			defer beat.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-beat.C:
					c.heartbeat(ctx)
				}
			}
		})
	}
	probe := time.NewTicker(c.probeEvery)
	defer probe.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-probe.C:
			c.probeAll(ctx)
		}
	}
}

// probeAll starts a ping of every node that has none in flight, and waits
// for them at most the probe timeout.
func (c *core) probeAll(ctx context.Context) {
	if c.sharded != nil {
		lctx, cancel := context.WithTimeout(ctx, c.probeTimeout())
		names, err := c.sharded.Nodes(lctx)
		cancel()
		if err == nil && len(names) > 0 {
			for _, name := range names {
				c.nodes.LoadOrCompute(name, c.newNode(name))
			}
			c.nodes.DeleteMatching(func(name string, _ *node) (bool, bool) { return !slices.Contains(names, name), false })
		}
	}
	if c.nodes.Size() == 0 {
		c.node("")
	}
	var wg sync.WaitGroup
	c.nodes.Range(func(_ string, n *node) bool {
		if n.probing.CompareAndSwap(false, true) {
			wg.Go(func() {
				defer n.probing.Store(false)
				c.probe(ctx, n)
			})
		}
		return true
	})
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(c.probeTimeout() + 50*time.Millisecond)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-ctx.Done():
	}
	c.lastProbe.Store(c.clk.Now())
}

// probe pings n once and acts on the result.
func (c *core) probe(ctx context.Context, n *node) {
	pctx, cancel := context.WithTimeout(ctx, c.probeTimeout())
	err := c.ping(pctx, n.name)
	cancel()
	if err != nil && lateOnly(err) && ctx.Err() == nil {
		// Late, not refused: on a loaded machine a live node's answer is
		// read late without the Go scheduler showing it (the process is
		// not run at all), and two such probes opened a live master's
		// circuit for 0.05-0.3 s, its keys answered by the policy. Ask
		// once more with lateRetry × the deadline: only a node that does
		// not answer that either counts as failing
		// (TestLateProbeAskedAgain).
		pctx, cancel := context.WithTimeout(ctx, lateRetry*c.probeTimeout())
		err = c.ping(pctx, n.name)
		cancel()
	}
	if ctx.Err() != nil {
		return
	}
	n.probed.Store(true)
	if err != nil && lateOnly(err) && c.starved() {
		// The process was starved of CPU: the ping's answer may have
		// come in time and been read late. Neither failure nor success.
		c.starvedLate.Add(1)
		if ok, suppressed := n.shouldLog(c.clk.Now(), c.logEvery); ok {
			c.log.Warn("guard: store probe late while this process is starved of CPU; not counted", "node", n.name, "err", err, "not_logged_since_last", suppressed)
		}
		return
	}
	if err != nil {
		msg := err.Error()
		n.probeErr.Store(&msg)
		now := c.clk.Now()
		if ok, suppressed := n.shouldLog(now, c.logEvery); ok {
			c.log.Warn("guard: store probe failed", "node", n.name, "err", err, "not_logged_since_last", suppressed)
		}
		if n.probeFails.Add(1) >= c.maxProbe && n.trip() {
			c.opens.Add(1)
			c.log.Warn("guard: store node does not answer probes; circuit open, the failure policy answers", "node", n.name, "err", err)
		}
		return
	}
	n.probeFails.Store(0)
	n.probeErr.Store(nil)
	if n.state.Load() == closed && !c.local.pending() {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, settleTimeout)
	settled := c.settle(sctx, n.name)
	cancel()
	if settled && n.reset() {
		c.log.Info("guard: store node answers again; circuit closed", "node", n.name)
	}
}

func (c *core) ping(ctx context.Context, name string) error {
	switch {
	case c.sharded != nil:
		return c.sharded.PingNode(ctx, name)
	case c.pinger != nil:
		return c.pinger.Ping(ctx)
	}
	_, err := c.inner.Apply(ctx, sluice.OpPeek, sluice.Request{Key: probeKey, Algorithm: sluice.GCRA, Limit: sluice.PerSecond(1)})
	return err
}

// lowerAfter is how many heartbeats in a row must read fewer instances
// than counted before the count is lowered: 10 intervals (10 s by default),
// about three TTLs, all while every circuit is closed and Local owes the
// store nothing.
const lowerAfter = 10

// heartbeat renews this instance's heartbeat and learns the count.
func (c *core) heartbeat(ctx context.Context) {
	if c.membership == nil {
		return
	}
	hctx, cancel := context.WithTimeout(ctx, c.probeTimeout())
	defer cancel()
	n, err := c.membership.Heartbeat(hctx, c.id, 3*c.beatEvery)
	c.beatMu.Lock()
	defer c.beatMu.Unlock()
	if err != nil {
		c.lowReads = 0
		return // the last count stands while the store is away
	}
	if n <= 0 {
		return
	}
	// A higher count is taken at once; a lower one only after lowerAfter
	// heartbeats in a row have read fewer, and then the most they read.
	// Fewer may mean instances that cannot reach the store yet, not
	// instances gone: after the store was away longer than the heartbeat
	// TTL every instance lapsed, and the first heartbeats back count only
	// those that renewed so far (1, 2, ...); after a Cluster failover each
	// instance's client learns the promoted replica at its own time. Taken,
	// such a count handed each instance a larger Local share while the
	// others still answered by Local (3 instances counted as 2: 428
	// admitted against a bound of 334 in TestClusterFailoverWithinBound).
	// Counting an instance that is gone only makes the shares smaller.
	read := int64(min(n, 1<<16))
	switch {
	case read >= c.instances.Load():
		c.instances.Store(read)
		c.lowReads = 0
	case c.partitioned():
		// A circuit open or Local still owing the store: the fleet may be
		// split, the others unable to renew or answering by Local, and a
		// lower count would raise every instance's share while they spend
		// it. Not lowered; the run of readings starts over once whole
		// (TestInstancesNotLoweredWhilePartitioned).
		c.lowReads = 0
	case c.lowReads == 0:
		c.lowReads, c.lowMax = 1, read
	default:
		c.lowReads++
		c.lowMax = max(c.lowMax, read)
	}
	if c.lowReads >= lowerAfter {
		c.instances.Store(c.lowMax)
		c.lowReads = 0
	}
	c.beats.Add(1)
}

// partitioned reports whether a node's circuit is open or Local owes the
// store charges: the fleet may be split, and the instance count read
// meanwhile is not lowered.
func (c *core) partitioned() bool {
	open := false
	c.nodes.Range(func(_ string, n *node) bool {
		open = n.state.Load() != closed
		return !open
	})
	return open || c.local.pending()
}

// Ready reports whether the store answers, from what the background probe
// found, without traffic: nil when every node's circuit is closed, its
// last probe succeeded and, with a Membership store and no
// Options.Instances, under the Local policy (the view's), the instance
// count is known as Local needs it (two heartbeats have read it:
// countKnown); else an
// error wrapping ErrUnavailable that names what fails.
func (g *Guard) Ready(ctx context.Context) error {
	var errs []error
	g.nodes.Range(func(name string, n *node) bool {
		switch e := n.probeErr.Load(); {
		case n.state.Load() != closed:
			errs = append(errs, fmt.Errorf("node %q: circuit open", name))
		case e != nil:
			errs = append(errs, fmt.Errorf("node %q: %s", name, *e))
		case !n.probed.Load():
			errs = append(errs, fmt.Errorf("node %q: not probed yet", name))
		}
		return true
	})
	if g.policy == Local && !g.countKnown() { // the rule Local denies by: not ready while it does
		errs = append(errs, ErrInstancesUnknown)
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("guard: %w: %w", ErrUnavailable, errors.Join(errs...))
}

// Stats are a guard's counters since New, for metrics.
type Stats struct {
	// Calls is the number of calls sent to the store.
	Calls uint64
	// Errors is the number of calls that failed or missed the deadline.
	Errors uint64
	// Busy is the number of calls answered by the policy because their key
	// had MaxInFlightPerKey calls in flight until the deadline.
	Busy uint64
	// Degraded counts the decisions each policy made (and, for
	// ReturnError, the errors it returned), indexed by Policy.
	Degraded [numPolicies]uint64
	// Openings is how many times a circuit opened (probes not counted).
	Openings uint64
	// StarvedLate is the number of late calls and probes not held against
	// the store because this process was starved of CPU meanwhile.
	StarvedLate uint64
	// LateAnswers is the number of calls answered by the store after
	// Options.Timeout, within Options.LateGrace, instead of by the policy.
	LateAnswers uint64
	// Open is the number of nodes whose circuit is open now.
	Open int
	// Instances is the number of instances Local divides limits by.
	Instances int
	// LocalBytes is the heap Local's memory store accounts for its keys,
	// held to Options.LocalMaxBytes.
	LocalBytes int64
	// LostCharges counts Local admissions that could not be remembered
	// for charging the store, because LocalMaxKeys keys were owed already.
	LostCharges uint64
	// Nodes are the counters of each node, by name.
	Nodes []NodeStats
}

// NodeStats are one node's counters.
type NodeStats struct {
	// Node is the name the store gave it, such as a Redis address.
	Node string
	// Calls, Errors and Openings count as in Stats.
	Calls, Errors, Openings uint64
	// Degraded is the number of decisions the policy made for its keys.
	Degraded uint64
	// Open reports an open circuit.
	Open bool
}

// DegradedTotal is the sum of Degraded.
func (s Stats) DegradedTotal() uint64 {
	var t uint64
	for _, n := range s.Degraded {
		t += n
	}
	return t
}

// Stats returns the guard's counters.
func (g *Guard) Stats() Stats {
	st := Stats{Calls: g.calls.Load(), Errors: g.errs.Load(), Busy: g.busy.Load(), Instances: g.Instances(), LostCharges: g.local.lost.Load(), LocalBytes: g.local.store.Bytes(), Openings: g.opens.Load(), StarvedLate: g.starvedLate.Load(), LateAnswers: g.lateAnswers.Load()}
	for p := range st.Degraded {
		st.Degraded[p] = g.degraded[p].Load()
	}
	g.nodes.Range(func(name string, n *node) bool {
		ns := NodeStats{Node: name, Calls: n.calls.Load(), Errors: n.errs.Load(), Openings: n.opens.Load(), Degraded: n.degraded.Load(), Open: n.state.Load() != closed}
		if ns.Open {
			st.Open++
		}
		st.Nodes = append(st.Nodes, ns)
		return true
	})
	slices.SortFunc(st.Nodes, func(a, b NodeStats) int {
		if a.Node < b.Node {
			return -1
		}
		if a.Node > b.Node {
			return 1
		}
		return 0
	})
	return st
}
