package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/pricing"
)

// statusBody is GET /v1/status's answer: the calling key's limits and
// budgets, peeked without charging anything. It names the key's tier,
// team and org, never the key or its client id.
type statusBody struct {
	Tier    string         `json:"tier"`
	Team    string         `json:"team,omitempty"`
	Org     string         `json:"org,omitempty"`
	Limits  []statusLimit  `json:"limits"`
	Budgets []statusBudget `json:"budgets"`
}

type statusLimit struct {
	Scope     string `json:"scope"`
	Name      string `json:"name"`
	Model     string `json:"model,omitempty"`
	Limit     string `json:"limit"`
	Remaining int64  `json:"remaining"`
	// ResetSeconds is the time until the limit is full again.
	ResetSeconds int64 `json:"reset_seconds"`
}

type statusBudget struct {
	Scope  string `json:"scope"`
	Window string `json:"window"`
	Zone   string `json:"zone"`
	Model  string `json:"model,omitempty"`
	// The amounts are dollars with six decimals. Spent is at most the
	// budget: a window charged past it (a settled cost above its
	// reservation) shows as fully spent.
	LimitUSD     string `json:"limit_usd"`
	SpentUSD     string `json:"spent_usd"`
	RemainingUSD string `json:"remaining_usd"`
	// ResetSeconds is the time until the window resets.
	ResetSeconds int64 `json:"reset_seconds"`
}

// serveStatus answers GET /v1/status for the authenticated client c.
func (g *Gateway) serveStatus(w http.ResponseWriter, r *http.Request, c *call) {
	cl := c.client
	body := statusBody{Tier: cl.tier.name, Limits: []statusLimit{}, Budgets: []statusBudget{}}
	var specs []*spec
	var reqs []sluice.Request
	for i := range cl.tier.specs {
		s := &cl.tier.specs[i]
		if s.kind != kindReservation {
			specs = append(specs, s)
			reqs = append(reqs, sluice.Request{Key: cl.specKeys[i], Algorithm: s.alg, Limit: s.limit})
		}
	}
	if lv := cl.levels; lv != nil {
		body.Team, body.Org = lv.team, lv.org
		for i := range lv.specs {
			specs = append(specs, &lv.specs[i])
			reqs = append(reqs, sluice.Request{Key: lv.keys[i], Algorithm: lv.specs[i].alg, Limit: lv.specs[i].limit})
		}
	}
	if len(reqs) > 0 {
		ctx, cancel := context.WithTimeout(r.Context(), g.cfg.Store.Timeout)
		ds, err := g.store.ApplyAll(ctx, sluice.OpPeek, reqs)
		cancel()
		if err != nil {
			g.log.Error("gateway: store unavailable", "request_id", c.id, "client", cl.id, "err", err)
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable, "server_error", "rate_limiter_unavailable", "",
				"The gateway's rate limiter is unavailable; please retry shortly.")
			return
		}
		for i, d := range ds {
			s := specs[i]
			if s.kind == kindBudget {
				left := min(max(d.Remaining, 0), s.limit.Rate)
				body.Budgets = append(body.Budgets, statusBudget{
					Scope: s.scope(), Window: s.window, Zone: s.zone, Model: s.model,
					LimitUSD: pricing.Micros(s.limit.Rate).String(), SpentUSD: pricing.Micros(s.limit.Rate - left).String(),
					RemainingUSD: pricing.Micros(left).String(), ResetSeconds: sluice.CeilSeconds(max(d.ResetAfter, d.RetryAfter)),
				})
				continue
			}
			body.Limits = append(body.Limits, statusLimit{Scope: s.scope(), Name: s.name, Model: s.model, Limit: s.limit.String(),
				Remaining: max(d.Remaining, 0), ResetSeconds: sluice.CeilSeconds(d.ResetAfter)})
		}
	}
	b, _ := json.Marshal(body)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	h.Set("Cache-Control", "no-store")
	_, _ = w.Write(append(b, '\n'))
}
