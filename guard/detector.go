package guard

import (
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// The circuit of a node.
const (
	closed int32 = iota
	open
)

// buckets is how many slices the failure window is cut into.
const buckets = 4

// node is one store node's failure detector and counters. Its circuit
// opens when, within the window, at least MinFailures calls failed, on at
// least MinFailingKeys distinct keys, and they were at least FailureRatio
// of the calls: a store failing across many keys, not one slow call or one
// hot key's queue. Or when MaxProbeFailures probes in a row failed, which
// detects a dead store without traffic. Only a probe closes it.
type node struct {
	name  string
	state atomic.Int32
	// lastFail is the clock time of the last failure, 0 if none.
	lastFail atomic.Int64
	win      [buckets]bucket
	mu       sync.Mutex // resets buckets, opens and closes

	calls, errs, opens atomic.Uint64
	degraded           atomic.Uint64 // decisions the policy made for its keys
	probeFails         atomic.Int32
	probeErr           atomic.Pointer[string] // last probe error; nil after a success
	probed             atomic.Bool            // a probe has finished
	probing            atomic.Bool            // a probe is in flight

	logAt      atomic.Int64 // clock time of the last error logged
	suppressed atomic.Int64 // errors not logged since
}

type bucket struct {
	epoch atomic.Int64 // the window slice this bucket counts
	calls atomic.Int64
	fails atomic.Int64
	keys  atomic.Uint64 // one bit per failing key, by hash
}

var keySeed = maphash.MakeSeed()

// record counts a call at now and reports whether the node's circuit
// should open because of it.
func (n *node) record(c *core, now int64, key string, failed bool) bool {
	slice := int64(c.window) / buckets
	idx := now / slice
	b := &n.win[idx%buckets]
	if b.epoch.Load() != idx {
		n.mu.Lock()
		if b.epoch.Load() != idx {
			b.calls.Store(0)
			b.fails.Store(0)
			b.keys.Store(0)
			b.epoch.Store(idx)
		}
		n.mu.Unlock()
	}
	b.calls.Add(1)
	if !failed {
		return false
	}
	b.fails.Add(1)
	b.keys.Or(1 << (maphash.String(keySeed, key) & 63))
	n.lastFail.Store(now)
	if n.state.Load() != closed {
		return false
	}
	var calls, fails int64
	var keys uint64
	for i := range n.win {
		w := &n.win[i]
		if e := w.epoch.Load(); e > idx-buckets && e <= idx {
			calls += w.calls.Load()
			fails += w.fails.Load()
			keys |= w.keys.Load()
		}
	}
	return fails >= int64(c.minFailures) && bits.OnesCount64(keys) >= c.minKeys && float64(fails) >= c.ratio*float64(calls)
}

// resetWindow forgets the failures counted so far.
func (n *node) resetWindow() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i := range n.win {
		n.win[i].epoch.Store(0)
		n.win[i].calls.Store(0)
		n.win[i].fails.Store(0)
		n.win[i].keys.Store(0)
	}
	n.lastFail.Store(0)
}

// trip opens the circuit; it reports whether this call opened it.
func (n *node) trip() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.state.Load() != closed {
		return false
	}
	n.state.Store(open)
	n.opens.Add(1)
	return true
}

// reset closes the circuit; it reports whether it was open.
func (n *node) reset() bool {
	n.mu.Lock()
	was := n.state.Swap(closed) != closed
	n.mu.Unlock()
	if was {
		n.resetWindow()
	}
	return was
}

// shouldLog reports whether an error may be logged now, at most one per
// every, and how many were not logged since the last one.
func (n *node) shouldLog(now int64, every time.Duration) (bool, int64) {
	last := n.logAt.Load()
	if last != 0 && now-last < int64(every) {
		n.suppressed.Add(1)
		return false, 0
	}
	if !n.logAt.CompareAndSwap(last, now) {
		n.suppressed.Add(1)
		return false, 0
	}
	return true, n.suppressed.Swap(0)
}

// works reports a node whose circuit is closed and whose last probe
// answered.
func (n *node) works() bool {
	return n.state.Load() == closed && n.probed.Load() && n.probeErr.Load() == nil
}
