package redisstore

import (
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
	if e.algo != req.Algorithm || e.d.Limit != req.Limit || max(req.Cost, 1) != e.cost {
		return sluice.Decision{}, false
	}
	d := e.d
	passed := time.Duration(now - e.at)
	d.RetryAfter = time.Duration(e.until - now)
	d.ResetAfter = max(0, d.ResetAfter-passed)
	return d, true
}

// put remembers a denial of req.
func (c *denyCache) put(req *sluice.Request, d sluice.Decision, now int64) {
	e := &denyEntry{until: now + int64(d.RetryAfter), at: now, cost: max(req.Cost, 1), algo: req.Algorithm, d: d}
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
