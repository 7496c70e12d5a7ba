package redisstore

import (
	"sync"
	"sync/atomic"
)

// nodeMap holds one value per Redis node, by the name NodeOf gives it.
// Reads take no lock: the map is copied on each addition, which happens
// once per node.
type nodeMap[V any] struct {
	m  atomic.Pointer[map[string]*V]
	mu sync.Mutex // adding
}

// get returns name's value, nil when it has none.
func (n *nodeMap[V]) get(name string) *V {
	if m := n.m.Load(); m != nil {
		return (*m)[name]
	}
	return nil
}

// getOrAdd returns name's value, adding mk(count of values) when it has
// none, unless mk returns nil. mk runs under the lock that each takes.
func (n *nodeMap[V]) getOrAdd(name string, mk func(count int) *V) *V {
	if v := n.get(name); v != nil {
		return v
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var old map[string]*V
	if m := n.m.Load(); m != nil {
		old = *m
	}
	if v := old[name]; v != nil {
		return v
	}
	v := mk(len(old))
	if v == nil {
		return nil
	}
	m := make(map[string]*V, len(old)+1)
	for k, x := range old {
		m[k] = x
	}
	m[name] = v
	n.m.Store(&m)
	return v
}

// each calls f on every value, under the lock that getOrAdd's mk runs in.
func (n *nodeMap[V]) each(f func(*V)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if m := n.m.Load(); m != nil {
		for _, v := range *m {
			f(v)
		}
	}
}
