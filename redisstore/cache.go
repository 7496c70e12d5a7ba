package redisstore

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/sluice-io/sluice"
)

// denyCache remembers keys that Redis denied a request of cost 1, until
// the RetryAfter has passed, so that an abusive client costs Redis nothing
// meanwhile. It answers only requests of cost 1 with the same algorithm and
// limit: for them the decision stays exact (Remaining stays 0, RetryAfter
// and ResetAfter count down), as long as no other instance refunds the key.
// It is sharded and bounded; when a shard is full it drops expired
// entries, then any.
type denyCache struct {
	seed   maphash.Seed
	shards [16]denyShard
	max    int // per shard
}

type denyShard struct {
	mu sync.Mutex
	m  map[string]denyEntry
}

type denyEntry struct {
	until int64 // local clock ns when the denial lapses
	at    int64 // local clock ns of the denial
	cost  int64
	algo  sluice.Algorithm
	d     sluice.Decision
}

func newDenyCache(size int) *denyCache {
	c := &denyCache{seed: maphash.MakeSeed(), max: max(1, size/16)}
	for i := range c.shards {
		c.shards[i].m = make(map[string]denyEntry)
	}
	return c
}

func (c *denyCache) shard(key string) *denyShard {
	return &c.shards[maphash.String(c.seed, key)%uint64(len(c.shards))]
}

// get returns the cached denial of req, with its times brought up to now.
func (c *denyCache) get(req *sluice.Request, now int64) (sluice.Decision, bool) {
	sh := c.shard(req.Key)
	sh.mu.Lock()
	e, ok := sh.m[req.Key]
	if ok && now >= e.until {
		delete(sh.m, req.Key)
		ok = false
	}
	sh.mu.Unlock()
	if !ok || e.algo != req.Algorithm || e.d.Limit != req.Limit || max(req.Cost, 1) != e.cost {
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
	sh := c.shard(req.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.m[req.Key]; !ok && len(sh.m) >= c.max {
		for k, e := range sh.m {
			if now >= e.until {
				delete(sh.m, k)
			}
		}
		for k := range sh.m {
			if len(sh.m) < c.max {
				break
			}
			delete(sh.m, k)
		}
	}
	sh.m[req.Key] = denyEntry{until: now + int64(d.RetryAfter), at: now, cost: max(req.Cost, 1), algo: req.Algorithm, d: d}
}

// del forgets key.
func (c *denyCache) del(key string) {
	sh := c.shard(key)
	sh.mu.Lock()
	delete(sh.m, key)
	sh.mu.Unlock()
}
