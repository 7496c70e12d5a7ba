package server

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// counterCache resolves the children of a CounterVec once per label set,
// so that the request path neither hashes and validates the label values
// nor takes the vector's lock: reads load an immutable map, and a miss
// copies it with the new child added. It holds no more entries than the
// vector holds series, and those are bounded (see package metrics).
type counterCache[K comparable] struct {
	m  atomic.Pointer[map[K]prometheus.Counter]
	mu sync.Mutex
}

// get returns the child for k, resolving it with resolve on first use.
func (c *counterCache[K]) get(k K, resolve func() prometheus.Counter) prometheus.Counter {
	if m := c.m.Load(); m != nil {
		if ctr, ok := (*m)[k]; ok {
			return ctr
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.m.Load()
	if old != nil {
		if ctr, ok := (*old)[k]; ok {
			return ctr
		}
	}
	next := make(map[K]prometheus.Counter, 1)
	if old != nil {
		for key, v := range *old {
			next[key] = v
		}
	}
	ctr := resolve()
	next[k] = ctr
	c.m.Store(&next)
	return ctr
}

// decisionLabels are the labels of sluice_decisions_total.
type decisionLabels struct{ policy, tier, result string }
