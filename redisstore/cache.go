package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/sluice-io/sluice"
)

// denyCache remembers keys that Redis denied a request of cost 1, until
// the RetryAfter has passed, so that an abusive client costs Redis nothing
// meanwhile. It answers only requests of cost 1 with the same algorithm and
// limit: for them the decision stays exact (Remaining stays 0, RetryAfter
// and ResetAfter count down), as long as no other instance refunds the key.
//
// Its reads take no lock (xsync.Map with immutable entries), so one hot
// denied key hammered from every core does not serialise on a mutex. It is
// bounded: past max entries, a put drops the expired ones, then any.
type denyCache struct {
	m    *xsync.Map[string, *denyEntry]
	size atomic.Int64 // approximate number of entries
	max  int64
	trim sync.Mutex
}

type denyEntry struct {
	until int64 // local clock ns when the denial lapses
	at    int64 // local clock ns of the denial
	cost  int64
	algo  sluice.Algorithm
	wait  time.Duration // the request's MaxWait: a reservation's denial is its own
	d     sluice.Decision
}

func newDenyCache(size int) *denyCache {
	return &denyCache{m: xsync.NewMap[string, *denyEntry](), max: int64(max(1, size))}
}

// get returns the cached denial of req, with its times brought up to now.
func (c *denyCache) get(req *sluice.Request, now int64) (sluice.Decision, bool) {
	e, ok := c.m.Load(req.Key)
	if !ok {
		return sluice.Decision{}, false
	}
	if now >= e.until {
		c.m.Compute(req.Key, func(old *denyEntry, loaded bool) (*denyEntry, xsync.ComputeOp) {
			if loaded && old == e {
				c.size.Add(-1)
				return nil, xsync.DeleteOp
			}
			return old, xsync.CancelOp
		})
		return sluice.Decision{}, false
	}
	if e.algo != req.Algorithm || e.d.Limit != req.Limit || max(req.Cost, 1) != e.cost || e.wait != req.MaxWait {
		return sluice.Decision{}, false
	}
	d := e.d
	d.Source = sluice.FromCache
	passed := time.Duration(now - e.at)
	d.RetryAfter = time.Duration(e.until - now)
	d.ResetAfter = max(0, d.ResetAfter-passed)
	return d, true
}

// put remembers a denial of req.
func (c *denyCache) put(req *sluice.Request, d sluice.Decision, now int64) {
	e := &denyEntry{until: now + int64(d.RetryAfter), at: now, cost: max(req.Cost, 1), algo: req.Algorithm, wait: req.MaxWait, d: d}
	if _, loaded := c.m.LoadAndStore(req.Key, e); !loaded && c.size.Add(1) > c.max && c.trim.TryLock() {
		defer c.trim.Unlock()
		c.size.Add(-int64(c.m.DeleteMatching(func(_ string, e *denyEntry) (bool, bool) { return now >= e.until, false })))
		if over := c.size.Load() - c.max; over > 0 {
			c.size.Add(-int64(c.m.DeleteMatching(func(k string, _ *denyEntry) (bool, bool) {
				if k == req.Key {
					return false, false // keep the denial just learnt
				}
				over--
				return true, over <= 0
			})))
		}
	}
}

// del forgets key.
func (c *denyCache) del(key string) {
	if _, loaded := c.m.LoadAndDelete(key); loaded {
		c.size.Add(-1)
	}
}

// batch looks up the members of an OpAllow or OpPeek batch. When one of
// them is a cached denial, the batch is denied (it is all or nothing) and
// batch returns the decisions it knows and the indexes of the members it
// does not; otherwise it returns nil, allocating nothing.
func (c *denyCache) batch(reqs []sluice.Request, now int64) (ds []sluice.Decision, unknown []int) {
	for i := range reqs {
		if reqs[i].Algorithm == sluice.Concurrency {
			continue
		}
		if d, ok := c.get(&reqs[i], now); ok {
			if ds == nil {
				ds = make([]sluice.Decision, len(reqs))
			}
			ds[i] = d
		}
	}
	for i := range ds {
		if ds[i].Source != sluice.FromCache {
			unknown = append(unknown, i)
		}
	}
	return ds, unknown
}

// putBatch remembers the denials of a batch that Redis decided at asked:
// members of cost 1 whose own limit denied them. A key that appears twice
// in the batch is left out, since its denial may be due to its own other
// charge in the batch.
func (c *denyCache) putBatch(reqs []sluice.Request, ds []sluice.Decision, asked int64) {
	for i := range ds {
		d := &ds[i]
		if d.Allowed || d.Degraded || d.RetryAfter <= 0 || reqs[i].Cost > 1 || reqs[i].Algorithm == sluice.Concurrency {
			continue
		}
		dup := false
		for j := range reqs {
			if j != i && reqs[j].Key == reqs[i].Key {
				dup = true
				break
			}
		}
		if !dup {
			c.put(&reqs[i], *d, asked)
		}
	}
}

// peekRest completes a batch denied from the cache: the members the cache
// does not know are peeked with their costs, in one call, which is what a
// denied batch reports for them (whether their limit alone would admit,
// and their remainder without the charge). A batch of cached denials alone
// costs Redis nothing.
func (s *Store) peekRest(ctx context.Context, reqs []sluice.Request, ds []sluice.Decision, unknown []int, asked int64) ([]sluice.Decision, error) {
	if len(unknown) == 0 {
		return ds, nil
	}
	rest := make([]sluice.Request, len(unknown))
	for j, i := range unknown {
		rest[j] = reqs[i]
	}
	pds, err := s.applyAll(ctx, sluice.OpPeek, rest)
	if err != nil {
		return nil, err
	}
	s.cache.putBatch(rest, pds, asked)
	for j, i := range unknown {
		ds[i] = pds[j]
	}
	return ds, nil
}
