package region

// The keys an instance tracks: at most MaxKeys exact global keys, each an
// entry (its demand, fetches, epoch). One client's flood of new keys must
// not hold the table against every other client's: when it is full, a new
// key makes room at once by forgetting the entries no fetch is in flight
// for and that were last used two fetch round trips ago, at least
// EvictAfter (TestGlobalKeyFloodEvicted), rather than waiting for the
// sweep to forget keys idle for IdleAfter. A new key is thus denied for a
// fetch round at most while a flood lasts. What an evicted key's share
// holds stays in the region's Redis, spendable by the key's next entry;
// the sweep refunds it at home (up to maxOrphans keys at a time; past
// them it expires unspent: under-admission of that key, never over).

import (
	"context"
	"time"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/sluice-io/sluice"
)

// EvictAfter is how long after its last use, at least, a tracked exact
// global key with no fetch in flight may be forgotten to make room for a
// new one when MaxKeys are tracked (two of its fetch round trips when
// longer).
const EvictAfter = 100 * time.Millisecond

// evictEvery bounds the eviction passes over the table to one per
// interval, however many new keys arrive while it is full: a pass costs
// a look at every entry (10,000 by default, ~0.5ms).
const evictEvery = 25 * time.Millisecond

// maxOrphans bounds the evicted keys whose shares await a refund.
const maxOrphans = 1024

// entry returns the key's entry, created for a request; nil when MaxKeys
// are tracked already and none can be evicted.
func (s *Store) entry(req *sluice.Request) *entry {
	if e, ok := s.keys.Load(req.Key); ok {
		e.mu.Lock()
		e.req.Algorithm, e.req.Limit, e.req.Cost = req.Algorithm, req.Limit, req.Cost
		e.mu.Unlock()
		return e
	}
	if s.size.Load() >= s.maxKeys && !s.evict() {
		return nil
	}
	now := s.clk.Now()
	e, loaded := s.keys.LoadOrCompute(req.Key, func() (*entry, bool) {
		return &entry{req: sluice.Request{Key: req.Key, Algorithm: req.Algorithm, Limit: req.Limit, Cost: req.Cost}, lastUse: now}, false
	})
	if !loaded {
		s.size.Add(1)
	}
	return e
}

// evict forgets the entries that can go (no fetch in
// flight, not waiting out a failed fetch, last used two fetch round trips
// ago and at least EvictAfter), at most one pass per evictEvery, and
// reports whether the table has room.
func (s *Store) evict() bool {
	now := s.clk.Now()
	last := s.evictAt.Load()
	if (last != 0 && now-last < int64(evictEvery)) || !s.evictAt.CompareAndSwap(last, now) {
		return s.size.Load() < s.maxKeys
	}
	s.keys.Range(func(key string, e *entry) bool {
		e.mu.Lock()
		idle := max(2*int64(e.lat), int64(EvictAfter))
		ok := e.inflight == 0 && now-e.lastUse >= idle && (!e.down || now >= e.retryAt)
		req := e.req
		e.mu.Unlock()
		if ok {
			s.forget(key, e)
			if s.home(key) != s.region && req.Algorithm != sluice.FixedWindow {
				s.orphan(req, now)
			}
		}
		return true
	})
	return s.size.Load() < s.maxKeys
}

// orphan is an evicted bucket key whose share the sweep refunds.
type orphan struct {
	req sluice.Request
	at  int64 // ns when it was evicted
}

// orphan keeps an evicted bucket key for the sweep to refund what its
// share holds, when fewer than maxOrphans are kept.
func (s *Store) orphan(req sluice.Request, now int64) {
	s.orphanMu.Lock()
	defer s.orphanMu.Unlock()
	if len(s.orphans) < maxOrphans {
		s.orphans = append(s.orphans, orphan{req, now})
	}
}

// refundOrphans refunds at home what the shares of keys evicted IdleAfter
// ago hold, when they went unspent since (the region's other instance may
// spend one: its sweep refunds it then), unless a key is tracked again
// (its entry's sweep then does it).
func (s *Store) refundOrphans(ctx context.Context) {
	now := s.clk.Now()
	s.orphanMu.Lock()
	var due []orphan
	kept := s.orphans[:0]
	for _, o := range s.orphans {
		if now-o.at >= int64(s.idle) {
			due = append(due, o)
		} else {
			kept = append(kept, o)
		}
	}
	s.orphans = kept
	s.orphanMu.Unlock()
	for _, o := range due {
		if _, ok := s.keys.Load(o.req.Key); ok {
			continue
		}
		s.takeBack(ctx, o.req, s.idle, false, -1)
	}
}

// takeBack takes back units of req's share (ledger.take's rules) and
// refunds them at the key's home; a refund that fails puts them back in
// the share, unspendable, for a later sweep. It reports whether the
// share is settled: nothing to take, or taken and refunded.
func (s *Store) takeBack(ctx context.Context, req sluice.Request, idle time.Duration, all bool, keep int64) bool {
	n, err := s.led.take(ctx, req.Key, idle, all, keep)
	if err != nil {
		return false
	}
	if n == 0 {
		return true
	}
	if !s.refund(s.regions[s.home(req.Key)], req, n) {
		// Still charged at home: keep them, unspendable, for later.
		if _, err := s.led.credit(ctx, req.Key, n, 0, ""); err != nil {
			s.st.stranded.Add(uint64(n))
		}
		return false
	}
	return true
}

// forget drops key's entry when it is still e.
func (s *Store) forget(key string, e *entry) {
	gone := false
	s.keys.Compute(key, func(old *entry, loaded bool) (*entry, xsync.ComputeOp) {
		if !loaded || old != e {
			return old, xsync.CancelOp
		}
		gone = true
		return nil, xsync.DeleteOp
	})
	if gone {
		s.size.Add(-1)
		s.hot.Delete(key)
	}
}
