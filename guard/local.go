package guard

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/memstore"
)

// The Local policy, in three parts:
//
//   - share: this instance enforces limit ÷ n in an embedded memstore,
//     n the number of live instances.
//   - seeds: while the store answers, the guard remembers the last
//     Remaining the store reported for each key (bounded). When Local
//     answers for a key, its local state is first reset to that
//     Remaining ÷ n (less what this instance owes), once per answer of
//     the store, not from a full bucket: a key exhausted before the outage
//     stays exhausted, and local state never outlives a newer answer.
//   - debts: what Local admitted is charged to the store (OpCharge) before
//     the node's circuit closes again, and in the background for keys
//     answered locally while busy, so that the store does not admit it a
//     second time.
type local struct {
	store *memstore.Store
	max   int64

	seeds *seedTable // seeds.go

	mu    sync.Mutex
	debts map[string]*debt
	lost  atomic.Uint64 // debts dropped because the map was full
}

// seed is the store's last answer for a key, for Local to start from.
type seed struct {
	remaining int64
	at        int64 // clock time of the decision
	resetAt   int64 // clock time at which the key was full again
	applied   bool  // the local state was seeded from it already
}

type debt struct {
	req  sluice.Request // Cost is the total to charge
	node string
	// end is the clock time after which the debt is dropped, 0 for never:
	// the end of the fixed window it was admitted in (a sliding window
	// counter's: of the next window, which its count still weighs in).
	// Charged later, it lands in a later window, which then starts in
	// debt: the window after a 2 s pause admitted nothing for 0.6-0.8 s.
	end int64
}

// debtEnd is debt.end for an admission of req at now.
func debtEnd(req *sluice.Request, now int64) int64 {
	if !req.Limit.Calendar.IsZero() {
		return 0
	}
	p := int64(req.Limit.Period)
	switch req.Algorithm {
	case sluice.FixedWindow:
		return now - now%p + p
	case sluice.SlidingWindowCounter:
		return now - now%p + 2*p
	}
	return 0
}

func newLocal(o *Options) (*local, error) {
	st, err := memstore.New(memstore.Options{Clock: o.Clock, MaxKeys: o.LocalMaxKeys, MaxBytes: o.LocalMaxBytes})
	if err != nil {
		return nil, err
	}
	return &local{store: st, max: int64(o.LocalMaxKeys), seeds: newSeedTable(o.LocalMaxKeys), debts: map[string]*debt{}}, nil
}

// remember keeps what the store answered for the key, to seed its local
// state later.
func (l *local) remember(req *sluice.Request, d *sluice.Decision, now int64) {
	if req.Algorithm == sluice.Concurrency {
		return
	}
	rem := d.Remaining
	if d.Source == sluice.FromLease {
		// A lease's Remaining is its own chunk (charged already, and
		// spent by the lease when the store is back) plus what the store
		// had left at its last fetch, which the other instances may have
		// taken since in chunks of their own. Seeded from it, the fleet
		// admitted about a chunk per instance beyond the limit in a paused
		// window (+4 to +6 over 300). Local starts such a key empty: it
		// refills at the limit ÷ N, a window from the next window on
		// (TestLeasedWindowPauseWithinBound).
		rem = 0
	}
	l.seeds.put(req.Key, limitPrint(req.Algorithm, req.Limit),
		seed{remaining: rem, at: now, resetAt: now + int64(d.ResetAfter)})
}

// takeSeed returns key's seed if it was not taken since the store's
// answer, and marks it taken.
func (l *local) takeSeed(key string) (seedSlot, bool) {
	return l.seeds.take(key)
}

// forget drops what is known of key, after a reset.
func (l *local) forget(key string) {
	l.seeds.drop(key)
	l.mu.Lock()
	delete(l.debts, key)
	l.mu.Unlock()
	_, _ = l.store.Apply(context.Background(), sluice.OpReset, sluice.Request{Key: key, Algorithm: sluice.GCRA})
}

// share is one instance's part of l when n instances share it.
func share(l sluice.Limit, n int) sluice.Limit {
	if n <= 1 {
		return l
	}
	l.Rate = max(1, l.Rate/int64(n))
	if l.Burst > 0 {
		l.Burst = max(1, l.Burst/int64(n))
	}
	return l
}

// apply answers reqs from the local store at limit ÷ n.
func (l *local) apply(ctx context.Context, op sluice.Op, reqs []sluice.Request, n int, now int64, node string) ([]sluice.Decision, error) {
	scaled := make([]sluice.Request, len(reqs))
	for i, r := range reqs {
		r.Limit = share(r.Limit, n)
		// A reservation is answered as a plain request: admitted at once
		// within the share, denied beyond it, never held.
		r.MaxWait = 0
		scaled[i] = r
		if r.Algorithm != sluice.Concurrency {
			// Seed from the store's newest answer, once: local state older
			// than it has refilled what the store handed out meanwhile.
			if fresh, ok := l.takeSeed(r.Key); ok {
				l.seed(ctx, &reqs[i], &r, &fresh, n, now)
			}
		}
	}
	ds, err := l.store.ApplyAll(ctx, op, scaled)
	if err != nil {
		return nil, err
	}
	if op == sluice.OpAllow && allAllowed(ds) {
		for i := range reqs {
			if reqs[i].Algorithm != sluice.Concurrency {
				l.owe(&reqs[i], node, debtEnd(&reqs[i], now), now)
			}
		}
	}
	return ds, nil
}

// seed starts key's local state from the store's last Remaining, this
// instance's share of it, less what this instance still owes the store.
func (l *local) seed(ctx context.Context, orig, scaled *sluice.Request, s *seedSlot, n int, now int64) {
	if s.print != limitPrint(orig.Algorithm, orig.Limit) || now >= s.resetAt {
		return // another limit, or full again by now
	}
	_, _ = l.store.Apply(ctx, sluice.OpReset, *scaled)
	rem := s.remaining / int64(max(n, 1))
	l.mu.Lock()
	if d := l.debts[orig.Key]; d != nil && (d.end == 0 || now < d.end) {
		rem -= d.req.Cost
	}
	l.mu.Unlock()
	if charge := scaled.Capacity() - rem; charge > 0 {
		c := *scaled
		// After reservations the store's Remaining is negative by what it
		// reserved ahead, up to sluice.MaxReserveWait's worth: that is not
		// handed out again, whoever asks first now (the caller's own
		// MaxWait says nothing of the key's debt; the others' reserved it).
		c.Cost = min(charge, 2*scaled.Capacity()+int64(sluice.MaxReserveWait)/scaled.Limit.Interval()+1)
		_, _ = l.store.Apply(ctx, sluice.OpCharge, c)
	}
}

// owe records that the store must be charged req.Cost for req.Key, until
// end (0: until charged).
func (l *local) owe(req *sluice.Request, node string, end, now int64) {
	if end != 0 && now >= end {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if d := l.debts[req.Key]; d != nil && d.req.Algorithm == req.Algorithm && d.req.Limit == req.Limit {
		if d.end != 0 && now >= d.end {
			d.req.Cost, d.end = 0, end // an earlier window's: dropped
		}
		d.req.Cost = min(d.req.Cost+req.Cost, 1<<40)
		return
	}
	if int64(len(l.debts)) >= l.max {
		l.lost.Add(1)
		return
	}
	r := *req
	r.Lease = ""
	l.debts[req.Key] = &debt{req: r, node: node, end: end}
}

// take removes and returns the debts for which owed reports true, and
// drops those whose window ended by now.
func (l *local) take(owed func(*debt) bool, now int64) []debt {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []debt
	for k, d := range l.debts {
		if owed(d) {
			if d.end == 0 || now < d.end {
				out = append(out, *d)
			}
			delete(l.debts, k)
		}
	}
	return out
}

// pending reports whether debts are owed.
func (l *local) pending() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.debts) > 0
}

func allAllowed(ds []sluice.Decision) bool {
	for i := range ds {
		if !ds[i].Allowed {
			return false
		}
	}
	return true
}

// settle charges the store with the debts owed on node, with up to 16
// calls at once, under ctx (the pass's deadline, settleTimeout). Debts
// that could not be charged are owed again (a charge whose reply was lost
// may then be charged twice: stricter, never looser); it reports whether
// all were charged.
func (c *core) settle(ctx context.Context, node string) bool {
	debts := c.local.take(func(d *debt) bool {
		if d.node == node {
			return true
		}
		// A node no longer listed (a master that failed over): its keys'
		// debts go to the node that owns them now.
		if _, listed := c.nodes.Load(d.node); !listed && c.sharded != nil {
			return c.sharded.NodeOf(d.req.Key) == node
		}
		return false
	}, c.clk.Now())
	if len(debts) == 0 {
		return true
	}
	// A failed-over master's debts: this instance charges the promoted
	// replica for the whole fleet, its own debt × the instances (at most
	// the limit's capacity), because the others settle each at its own
	// probe and, until then, the replica answers this instance from a count
	// that misses their debts (TestClusterFailoverWithinBound went 20-40
	// over its bound so). When they settle, they charge again: stricter,
	// never looser, for the failed master's keys only.
	n := max(c.instances.Load(), 1)
	for i := range debts {
		d := &debts[i]
		if _, listed := c.nodes.Load(d.node); listed || n == 1 {
			continue
		}
		d.req.Cost = max(d.req.Cost, min(d.req.Cost*n, d.req.Capacity()))
	}
	var (
		wg     sync.WaitGroup
		failed atomic.Bool
		next   atomic.Int64
	)
	for range min(16, len(debts)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(debts) {
					return
				}
				d := &debts[i]
				if failed.Load() {
					c.local.owe(&d.req, d.node, d.end, c.clk.Now())
					continue
				}
				// The pass's deadline, not a call's: the probe found the
				// node answering, and a charge that misses a short deadline
				// has reached Redis all the same, so owing it again charged
				// it again at every probe while Redis stayed slower than a
				// call's deadline (TestLocalDebtChargedOnceWhenRedisIsSlow).
				dec, err := c.inner.Apply(ctx, sluice.OpCharge, d.req)
				if err != nil {
					failed.Store(true)
					c.local.owe(&d.req, d.node, d.end, c.clk.Now())
					continue
				}
				c.local.remember(&d.req, &dec, c.clk.Now())
			}
		})
	}
	wg.Wait()
	return !failed.Load()
}

// settleTimeout bounds one settle pass.
const settleTimeout = 2 * time.Second
