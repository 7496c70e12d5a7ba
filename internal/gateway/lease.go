package gateway

import (
	"context"

	"github.com/sluice-io/sluice"
)

// maxAsyncReservations bounds the reservations in flight in the
// background: past it, a request waits for its reservation in its batch,
// so that a Redis slower than the request rate pushes back on clients
// instead of piling up calls that time out.
const maxAsyncReservations = 64

// applyLeased is admit's one all-or-nothing ApplyAll of c.reqs when no
// queue is configured (applyAdmit). For a leased tier without a
// concurrency limit it leaves the reservation member out of it and takes it
// in the background once the limits admitted: that member has no limit of
// its own (it never denies) and only marks the request so that one
// settlement refunds it. The limits are then decided from leases with no
// Redis round trip on the client's path. settle waits for the reservation
// first; one that failed leaves the refund batch unapplied (the store
// applies it only while the reservation is held), so a failure keeps the
// reservation charged, never refunds it twice. Past maxAsyncReservations
// in flight, the reservation stays in the batch.
func (g *Gateway) applyLeased(ctx context.Context, c *call) ([]sluice.Decision, error) {
	res := -1
	if c.client.tier.lease && g.asyncResv.Load() < maxAsyncReservations {
		for i, s := range c.specs {
			if s.kind == kindReservation {
				res = i
			}
		}
	}
	if res < 0 {
		return g.store.ApplyAll(ctx, sluice.OpAllow, c.reqs)
	}
	sub := make([]sluice.Request, 0, len(c.reqs)-1)
	sub = append(append(sub, c.reqs[:res]...), c.reqs[res+1:]...)
	var ds []sluice.Decision
	if len(sub) > 0 {
		var err error
		if ds, err = g.store.ApplyAll(ctx, sluice.OpAllow, sub); err != nil {
			return nil, err
		}
	}
	req := c.reqs[res]
	out := make([]sluice.Decision, 0, len(c.reqs))
	out = append(append(append(out, ds[:res]...), sluice.Decision{Allowed: true, Limit: req.Limit, Remaining: req.Limit.Rate}), ds[res:]...)
	if !sluice.Combine(out).Allowed {
		return out, nil
	}
	done := make(chan struct{})
	c.reserving = done
	g.pending.Add(1)
	g.asyncResv.Add(1)
	go func() {
		defer g.pending.Done()
		defer close(done)
		defer g.asyncResv.Add(-1)
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.Store.Timeout)
		defer cancel()
		if _, err := g.store.Apply(ctx, sluice.OpAllow, req); err != nil {
			g.log.Warn("gateway: reservation not recorded; the request stays charged as reserved", "request_id", c.id, "err", err)
		}
	}()
	return out, nil
}
