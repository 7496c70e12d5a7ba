package guard

import (
	"context"
	"hash/maphash"
	"sync"
)

// gates bound the calls one key may have in flight to the store: a burst
// on one key queues here, in its callers' goroutines, and not in the
// store, where it would delay every other key. A caller waits for a slot
// until its deadline; then the policy answers it (counted as Busy), and
// the store is not blamed.
type gates struct {
	max    int
	shards [64]gateShard
	pool   sync.Pool
}

type gateShard struct {
	mu sync.Mutex
	m  map[string]*gate
}

type gate struct {
	refs int // callers holding or waiting for a slot, under the shard lock
	sem  chan struct{}
}

func newGates(maxInFlight int) *gates {
	g := &gates{max: maxInFlight}
	for i := range g.shards {
		g.shards[i].m = map[string]*gate{}
	}
	g.pool.New = func() any { return &gate{sem: make(chan struct{}, maxInFlight)} }
	return g
}

// acquire takes one of key's slots, waiting until ctx or cctx (the call's
// deadline) is done. It returns the gate to release, or false when ctx or
// cctx ended first.
func (g *gates) acquire(ctx, cctx context.Context, key string) (*gate, bool) {
	sh := &g.shards[maphash.String(keySeed, key)%uint64(len(g.shards))]
	sh.mu.Lock()
	gt := sh.m[key]
	if gt == nil {
		gt = g.pool.Get().(*gate)
		sh.m[key] = gt
	}
	gt.refs++
	sh.mu.Unlock()
	select {
	case gt.sem <- struct{}{}:
		return gt, true
	default:
	}
	select {
	case gt.sem <- struct{}{}:
		return gt, true
	case <-cctx.Done():
	case <-ctx.Done():
	}
	g.drop(sh, key, gt)
	return nil, false
}

// release gives back a slot that acquire returned.
func (g *gates) release(key string, gt *gate) {
	<-gt.sem
	g.drop(&g.shards[maphash.String(keySeed, key)%uint64(len(g.shards))], key, gt)
}

func (g *gates) drop(sh *gateShard, key string, gt *gate) {
	sh.mu.Lock()
	gt.refs--
	if gt.refs == 0 {
		delete(sh.m, key)
		g.pool.Put(gt) // its semaphore is empty: every slot was given back
	}
	sh.mu.Unlock()
}
