package gateway

// The limits stage: every limit of the request (its key's, its model's,
// its team's and org's, its budgets) reserved in one ApplyAll.

import (
	"errors"
	"net/http"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/pricing"
	"github.com/sluice-io/sluice/internal/tracing"
)

// applies reports whether s limits requests on model: a limit on a model
// covers its dated snapshots too ("gpt-4o" covers "gpt-4o-2024-08-06"),
// as the model's price does (pricing.Table.Lookup), or a client could
// escape a model's limits and budgets by naming a snapshot the upstream
// serves as the same model.
func (s *spec) applies(model string) bool {
	return s.model == "" || s.model == model || s.model == modelBase(model)
}

// modelBase is model without a trailing dated snapshot suffix, by the rule
// of pricing.Table.Lookup.
func modelBase(model string) string { return pricing.SnapshotBase(model) }

// admit reserves every limit of the request in one ApplyAll. It answers
// the client itself and reports false when the request may not proceed.
func (g *Gateway) admit(w http.ResponseWriter, r *http.Request, c *call) bool {
	t := c.client.tier
	model := c.rawModel
	if len(t.specs) <= callLimits {
		c.specs, c.reqs = c.specsBuf[:0], c.reqsBuf[:0] // the call's own room (callpool.go)
	} else {
		c.specs = make([]*spec, 0, len(t.specs))
		c.reqs = make([]sluice.Request, 0, len(t.specs))
	}
	for i := range t.specs {
		s := &t.specs[i]
		if !s.applies(model) {
			continue
		}
		req := sluice.Request{Key: c.client.specKeys[i], Algorithm: s.alg, Limit: s.limit, Cost: 1, UseLease: t.lease}
		switch s.kind {
		case kindTokens:
			if c.ep == epCountTokens {
				continue // reserves no tokens
			}
			var ok bool
			if req.Cost, ok = g.tokenReservation(w, r, c, s); !ok {
				return false
			}
		case kindConcurrency, kindReservation:
			req.Lease, req.UseLease = c.id, false
		}
		c.specs = append(c.specs, s)
		c.reqs = append(c.reqs, req)
	}
	if !g.admitLevels(w, r, c) || !g.admitSession(w, c, r) {
		return false
	}
	if len(c.reqs) == 0 {
		return true
	}
	ds, err := g.applyAdmit(r.Context(), w, c)
	if errors.Is(err, errAnswered) {
		return false
	}
	if err != nil {
		if tracing.Recording(r.Context()) {
			traceAdmit(r.Context(), c, "store_error", nil)
		}
		g.metrics.rejections.WithLabelValues(t.name, c.model, "store_error").Inc()
		g.log.Error("gateway: store unavailable", "request_id", c.id, "client", c.client.id, "err", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "server_error", "rate_limiter_unavailable", "",
			"The gateway's rate limiter is unavailable; please retry shortly.")
		return false
	}
	for i := range ds {
		// The store's failure policy answered (the guard, after its own
		// deadline): its call may still run in the guard's worker with
		// the admission's context, whose values are c's (callpool.go).
		c.degraded = c.degraded || ds[i].Degraded
	}
	g.setLimitHeaders(w.Header(), c, ds)
	g.setBudgetHeaders(w.Header(), c, ds)
	setDecidedBy(w.Header(), c, ds) // regions.go
	if c.ep.anthropic() {
		setAnthropicHeaders(w.Header(), c, ds, time.Now())
	}
	allowed := sluice.Combine(ds).Allowed
	if tracing.Recording(r.Context()) {
		outcome := "admitted"
		if !allowed {
			outcome = "limited"
		}
		traceAdmit(r.Context(), c, outcome, ds)
	}
	if !allowed {
		g.reject(w, c, ds)
		return false
	}
	noteWindows(c, ds, time.Now())
	return true
}

// noteWindows records, for each fixed window c reserved on (a calendar
// budget, a per-day limit), when the window its charge was taken from
// ends: its decision's ResetAfter from now, read when the decision came
// back. The settlement's refund names that window by it
// (Request.ReservedAhead), so that a refund landing after the window
// turned is dropped instead of freeing the next window's money, and one
// outside a global budget's home region goes back to the region's share
// (region.Store).
func noteWindows(c *call, ds []sluice.Decision, now time.Time) {
	for i := range c.reqs {
		if c.reqs[i].Algorithm != sluice.FixedWindow || i >= len(ds) || ds[i].ResetAfter <= 0 {
			continue
		}
		if c.windowEnds == nil {
			c.windowEnds = make([]time.Time, len(c.reqs))
		}
		c.windowEnds[i] = now.Add(ds[i].ResetAfter)
	}
}

// windowAhead is the ReservedAhead of a refund of c.reqs[i] at now: the
// time left until its charge's window ends (at least 1ns once it has:
// the store drops the refund then, unless its own clock says otherwise),
// or zero when it is not a window's charge.
func (c *call) windowAhead(i int, now time.Time) time.Duration {
	if i >= len(c.windowEnds) || c.windowEnds[i].IsZero() {
		return 0
	}
	return max(c.windowEnds[i].Sub(now), 1)
}
