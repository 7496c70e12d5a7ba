package redisstore

import (
	"hash/maphash"
	"sync"
)

// plainSeen is a store's bounded memory of the window keys it knows
// exist: base name → start of the window whose key it saw. A key seen in
// the current window goes straight to INCRBY; one not seen takes SET NX
// first. It only saves round trips: a forgotten key costs one more, and a
// remembered one that vanished (a reset by another store, a refund to 0,
// eviction) is recreated by INCRBY, which the plain path then gives a TTL.
type plainSeen struct {
	seed   maphash.Seed
	shards [plainSeenShards]seenShard
}

const (
	plainSeenShards = 64
	// plainSeenPerShard bounds each shard: 64 × 1024 = 65 536 keys.
	plainSeenPerShard = 1024
)

type seenShard struct {
	mu sync.Mutex
	m  map[string]int64
	_  [48]byte // keeps shards' locks on separate cache lines
}

func newPlainSeen() *plainSeen {
	return &plainSeen{seed: maphash.MakeSeed()}
}

func (p *plainSeen) shard(base string) *seenShard {
	return &p.shards[maphash.String(p.seed, base)%plainSeenShards]
}

// has reports whether base's key of the window starting at start is
// known to exist.
func (p *plainSeen) has(base string, start int64) bool {
	sh := p.shard(base)
	sh.mu.Lock()
	w, ok := sh.m[base]
	sh.mu.Unlock()
	return ok && w == start
}

// add records that base's key of the window starting at start exists.
// A full shard drops one entry, the first its map's randomised iteration
// yields.
func (p *plainSeen) add(base string, start int64) {
	sh := p.shard(base)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.m == nil {
		sh.m = make(map[string]int64)
	}
	if _, ok := sh.m[base]; !ok && len(sh.m) >= plainSeenPerShard {
		for k := range sh.m {
			delete(sh.m, k)
			break
		}
	}
	sh.m[base] = start
}

// forget drops base (its keys were reset).
func (p *plainSeen) forget(base string) {
	sh := p.shard(base)
	sh.mu.Lock()
	delete(sh.m, base)
	sh.mu.Unlock()
}
