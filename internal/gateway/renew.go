package gateway

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/sluice-io/sluice"
)

// Long requests
//
// A request's concurrency slot and its reservation are leases that lapse
// LeaseTTL after they were taken, so that a gateway that crashes leaks
// nothing. A request in flight longer than that, a long generation or a
// stream its client reads slowly (the upstream waits for it), would lose
// them while it runs: its client could then hold any number of streams at
// once past its concurrency limit, and the late settlement, finding its
// lease lapsed, would neither refund the unused tokens nor charge usage
// above the reservation. So the gateway renews the leases of a request
// still in flight every LeaseTTL/3 (an OpAllow of a lease already held
// renews it and takes no new slot), until settlement stops the renewal,
// before it releases them.

// leaseRenewal renews one request's leases while it is in flight. It is
// part of the call, and its timer is kept for the call's next request
// when the call is recycled (callpool.go), stopped before it ever fired
// for this one: a timer per request was an allocation and a function
// value, made for the few requests that outlast renewEvery.
type leaseRenewal struct {
	mu      sync.Mutex
	timer   *time.Timer // made on the call's first renewal, then reset
	started bool        // this request's renewal was started
	stopped bool
	fired   bool // the timer fired for this request: a renewal may still read the call (not recycled)
	g       *Gateway
	c       *call
}

// startRenewal starts renewing c's leases (its concurrency slots, its
// reservation and the model capacity's slot) every g.renewEvery. The
// leases are read from c when the timer fires (renewedLeases), not
// copied now: nearly every request ends long before, and settle stops
// the renewal before it writes over c.reqs.
func (g *Gateway) startRenewal(c *call) {
	if g.renewEvery <= 0 || !c.holdsLeases() {
		return
	}
	rn := &c.renewal
	rn.mu.Lock()
	defer rn.mu.Unlock()
	rn.g, rn.c, rn.started = g, c, true
	if rn.timer == nil {
		rn.timer = time.AfterFunc(g.renewEvery, rn.renew)
	} else {
		rn.timer.Reset(g.renewEvery) // stopped unfired when the call was recycled
	}
}

// holdsLeases reports whether c holds a lease to renew.
func (c *call) holdsLeases() bool {
	if slices.ContainsFunc(c.reqs, func(r sluice.Request) bool { return r.Algorithm == sluice.Concurrency }) {
		return true
	}
	return c.capacity != nil && slices.ContainsFunc(c.capacity.reqs, func(r sluice.Request) bool { return r.Algorithm == sluice.Concurrency })
}

// renewedLeases are the requests that renew c's leases: its concurrency
// members, and the model capacity's, which the leases layer must not take
// from a chunk.
func (c *call) renewedLeases() []sluice.Request {
	var leases []sluice.Request
	for _, req := range c.reqs {
		if req.Algorithm == sluice.Concurrency {
			leases = append(leases, req)
		}
	}
	if c.capacity != nil {
		for _, req := range c.capacity.reqs {
			if req.Algorithm == sluice.Concurrency {
				req.UseLease = false
				leases = append(leases, req)
			}
		}
	}
	return leases
}

// renew renews the leases, one call each (they may live in different
// Redis Cluster slots), and schedules the next renewal, unless stopped.
func (rn *leaseRenewal) renew() {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if rn.stopped {
		return
	}
	g, c := rn.g, rn.c
	if c.reserving != nil {
		<-c.reserving // a leased tier's reservation, taken in the background
	}
	for _, req := range c.renewedLeases() {
		ctx, cancel := context.WithTimeout(context.Background(), g.cfg.Store.Timeout)
		d, err := g.store.Apply(ctx, sluice.OpAllow, req)
		cancel()
		if err != nil || !d.Allowed {
			// Lapsed and taken (a store outage longer than LeaseTTL/3
			// each way), or the store is down: the next round tries again.
			g.log.Warn("gateway: lease of a request in flight not renewed", "request_id", c.id, "client", c.client.id, "key", req.Key, "err", err)
		}
	}
	if g.onRenew != nil {
		g.onRenew()
	}
	rn.timer.Reset(g.renewEvery)
}

// stop ends the renewal, waiting for one in progress; one never started
// does nothing. It notes whether the timer fired (or is firing) for this
// request: then a renewal may yet run and find the renewal stopped, and
// the call must not be recycled.
func (rn *leaseRenewal) stop() {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if !rn.started {
		return
	}
	rn.stopped = true
	if !rn.timer.Stop() {
		rn.fired = true
	}
}
