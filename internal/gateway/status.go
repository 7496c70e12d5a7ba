package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/pricing"
	"github.com/sluice-io/sluice/internal/upstream"
)

// Status is GET /v1/status's answer: the calling key's limits and
// budgets, peeked without charging anything (and the console's look-up
// of a key, LookUp). It names the key's tier, team and org, never the key
// or its client id.
type Status struct {
	Tier string `json:"tier"`
	Team string `json:"team,omitempty"`
	Org  string `json:"org,omitempty"`
	// Session is the X-Sluice-Session the status was asked with; its
	// budgets are the rows of scope "session".
	Session string         `json:"session,omitempty"`
	Limits  []StatusLimit  `json:"limits"`
	Budgets []StatusBudget `json:"budgets"`
}

// adminStatusBody is GET /v1/status's answer to an admin token: the
// pool's topology (upstream names, limits, what is left of each), which
// a client key never sees (serveAdminStatus).
type adminStatusBody struct {
	Upstreams []upstream.Status `json:"upstreams"`
}

// StatusLimit is one rate or concurrency limit of a Status.
type StatusLimit struct {
	Scope     string `json:"scope"`
	Name      string `json:"name"`
	Model     string `json:"model,omitempty"`
	Limit     string `json:"limit"`
	Remaining int64  `json:"remaining"`
	// ResetSeconds is the time until the limit is full again.
	ResetSeconds int64 `json:"reset_seconds"`
	// DecidedBy, for a global limit (scope global, regions.go), is the
	// tier that answers it in this region: "home" (the limit's home
	// store, in this region), "share" (this region's share of it, charged
	// at the home in advance) or "policy".
	DecidedBy string `json:"decided_by,omitempty"`
	// RemainingSource, for a global limit, says what Remaining counts:
	// "home" is the limit's remaining as its home store counts it, plus,
	// outside the home, what this region's share holds (statushome.go:
	// what other regions hold in their shares only they can spend);
	// "share" is this region's share alone, the home not having answered
	// in time.
	RemainingSource string `json:"remaining_source,omitempty"`
}

// StatusBudget is one dollar budget of a Status.
type StatusBudget struct {
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
	// DecidedBy is StatusLimit's, for a global budget.
	DecidedBy string `json:"decided_by,omitempty"`
	// RemainingSource is StatusLimit's, for RemainingUSD and SpentUSD.
	RemainingSource string `json:"remaining_source,omitempty"`
}

// statusReuse is how long a client's /v1/status answer is reused while
// the client sends nothing: a key polling status costs the store at most
// one peek per statusReuse on each instance, however fast it polls.
const statusReuse = 100 * time.Millisecond

// statusMemo holds a client's last /v1/status answer. Concurrent calls
// share one peek (mu is held across it); an answer is reused for
// statusReuse unless the client's own requests moved its state since
// (gen, bumped by touch on each metered request and settlement).
type statusMemo struct {
	gen  atomic.Uint64
	mu   sync.Mutex
	at   time.Time
	seen uint64 // gen when body was peeked
	body []byte
	// failed: the last peek failed, at at.
	failed bool
}

// touch marks the client's state as changed by its own traffic.
func (m *statusMemo) touch() { m.gen.Add(1) }

// serveStatus answers GET /v1/status for the authenticated client c.
func (g *Gateway) serveStatus(w http.ResponseWriter, r *http.Request, c *call) {
	m := &c.client.status
	m.mu.Lock()
	defer m.mu.Unlock()
	sid, err := sessionOf(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_session", "", err.Error())
		return
	}
	if sid != "" && len(c.client.tier.session) > 0 {
		// A session's status is peeked each time, one at a time per
		// client on this instance (m.mu): not memoized with the key's.
		b, ok := g.peekStatus(w, r, c, sid)
		if ok {
			writeStatus(w, b)
		}
		return
	}
	now, gen := g.now(), m.gen.Load()
	if m.failed && now.Sub(m.at) < statusReuse && !now.Before(m.at) {
		// The store just failed this client's peek: the calls that queued
		// behind it are answered at once, not one store timeout each.
		statusUnavailable(w)
		return
	}
	if m.body == nil || gen != m.seen || now.Sub(m.at) >= statusReuse || now.Before(m.at) {
		b, ok := g.peekStatus(w, r, c, "")
		if !ok {
			m.body, m.at, m.failed = nil, g.now(), true
			return
		}
		m.body, m.at, m.seen, m.failed = b, now, gen, false
	}
	writeStatus(w, m.body)
}

func writeStatus(w http.ResponseWriter, b []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

// peekStatus peeks the client's limits and budgets and returns the JSON
// answer; on a store error it answers 503 itself and returns false.
// With a session id sid, the session's budgets are peeked too.
func (g *Gateway) peekStatus(w http.ResponseWriter, r *http.Request, c *call, sid string) ([]byte, bool) {
	body, err := g.peekClient(r.Context(), c.client, sid)
	if err != nil {
		g.log.Error("gateway: store unavailable", "request_id", c.id, "client", c.client.id, "err", err)
		statusUnavailable(w)
		return nil, false
	}
	return append(marshalJSON(body), '\n'), true
}

// peekClient peeks cl's limits and budgets (with a session id sid, the
// session's too), changing nothing.
func (g *Gateway) peekClient(ctx context.Context, cl *client, sid string) (Status, error) {
	body := Status{Tier: cl.tier.name, Limits: []StatusLimit{}, Budgets: []StatusBudget{}}
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
	if sid != "" {
		body.Session = sid
		prefix := sessionPrefix(cl, sid)
		for i := range cl.tier.session {
			s := &cl.tier.session[i]
			specs = append(specs, s)
			reqs = append(reqs, sluice.Request{Key: prefix + s.suffix, Algorithm: s.alg, Limit: s.limit})
		}
	}
	if len(reqs) > 0 {
		ds, err := g.peekStore(ctx, reqs)
		if err != nil {
			return Status{}, err
		}
		home := g.fromHome(ctx, specs, reqs, ds) // statushome.go
		for i, d := range ds {
			s := specs[i]
			var hd *sluice.Decision
			if home != nil {
				hd = home[i]
			}
			d, source := withHome(s, d, hd, reqs[i].Capacity())
			if s.kind == kindBudget {
				left := min(max(d.Remaining, 0), s.limit.Rate)
				body.Budgets = append(body.Budgets, StatusBudget{
					Scope: s.scope(), Window: s.window, Zone: s.zone, Model: s.model,
					LimitUSD: pricing.Micros(s.limit.Rate).String(), SpentUSD: pricing.Micros(s.limit.Rate - left).String(),
					RemainingUSD: pricing.Micros(left).String(), ResetSeconds: sluice.CeilSeconds(max(d.ResetAfter, d.RetryAfter)),
					DecidedBy: s.decidedBy(d), RemainingSource: source,
				})
				continue
			}
			body.Limits = append(body.Limits, StatusLimit{Scope: s.scope(), Name: s.name, Model: s.model, Limit: limitText(s.alg, s.limit),
				Remaining: max(d.Remaining, 0), ResetSeconds: sluice.CeilSeconds(d.ResetAfter), DecidedBy: s.decidedBy(d),
				RemainingSource: source})
		}
	}
	return body, nil
}

// serveAdminStatus answers GET /v1/status with an admin token (Options.Admin):
// every upstream model's limits and headroom, empty without a pool. A
// client key's status never shows them: the upstreams' names, limits and
// remaining capacity are the operator's, not every tenant's.
func (g *Gateway) serveAdminStatus(w http.ResponseWriter, r *http.Request) {
	body := adminStatusBody{Upstreams: []upstream.Status{}}
	if g.pool != nil {
		ctx, cancel := context.WithTimeout(r.Context(), g.cfg.Store.Timeout)
		ups, err := g.pool.Status(ctx)
		cancel()
		if err != nil {
			g.log.Error("gateway: store unavailable", "err", err)
			statusUnavailable(w)
			return
		}
		body.Upstreams = ups
	}
	writeStatus(w, append(marshalJSON(body), '\n'))
}

// statusUnavailable answers a status call the store could not serve.
func statusUnavailable(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, "server_error", "rate_limiter_unavailable", "",
		"The gateway's rate limiter is unavailable; please retry shortly.")
}

// limitText writes a limit for people: "2 in flight" for a concurrency
// limit (its period is only the lease TTL of an abandoned slot, not a
// window: "2/10min" would read as a rate), else the limit's own form
// ("20/min", "1000/day burst 50").
func limitText(alg sluice.Algorithm, l sluice.Limit) string {
	if alg == sluice.Concurrency {
		return strconv.FormatInt(l.Rate, 10) + " in flight"
	}
	return l.String()
}

// UpstreamsReport is the console's view of the pool's headroom (GET
// /ui/api/upstreams in `sluice serve`): the same rows as /v1/status's
// upstreams, which name upstreams and model ids from the config, never a
// key.
type UpstreamsReport struct {
	// Pool is false when the gateway has one upstream (`upstream:`), which
	// has no provider limits of its own.
	Pool      bool              `json:"pool"`
	Upstreams []upstream.Status `json:"upstreams"`
}

// Upstreams peeks every upstream model's headroom, changing nothing.
func (g *Gateway) Upstreams(ctx context.Context) (UpstreamsReport, error) {
	rep := UpstreamsReport{Upstreams: []upstream.Status{}}
	if g.pool == nil {
		return rep, nil
	}
	ctx, cancel := context.WithTimeout(ctx, g.cfg.Store.Timeout)
	defer cancel()
	ups, err := g.pool.Status(ctx)
	if err != nil {
		return rep, fmt.Errorf("gateway: upstream headroom: %w", err)
	}
	rep.Pool = true
	if ups != nil {
		rep.Upstreams = ups
	}
	return rep, nil
}
