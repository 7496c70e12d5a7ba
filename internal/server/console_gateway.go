package server

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice/internal/console"
	"github.com/sluice-io/sluice/internal/gateway"
)

// This file feeds the console from the AI gateway that runs in the same
// process (a gateway: section): each of its decisions (gateway.Outcome)
// counts in the charts, as the series "gateway:requests" per gateway
// tier, the dollars its settled requests charged their budgets as the
// series "gateway:spend" (micro-dollars) per tier, and each of its 429s
// in the top limited identities, as the key's
// name ("gw_key:NAME", or "gw_client:ID" for a key without one) under the
// policy "gateway:" and the limit ("gateway:rpm", "gateway:budget"); a
// look-up of such an identity peeks the key's limits (and, with the admin
// token, its budgets) as its GET /v1/status does.

// The charts' policy names of the gateway's series; a config's policy
// names cannot hold ':'.
const (
	// GatewaySeries counts the gateway's decisions and 429s.
	GatewaySeries = "gateway:requests"
	// GatewaySpendSeries counts, as its decisions, the micro-dollars the
	// gateway's settled requests charged their budgets (no denials).
	GatewaySpendSeries = "gateway:spend"
)

// gatewayPolicyPrefix starts the top list's policy of a gateway denial.
const gatewayPolicyPrefix = "gateway:"

// maxGatewayTiers bounds the tiers counted apart; others count as "other".
const maxGatewayTiers = 256

// gatewayCounts are the gateway's decisions and 429s per tier since the
// start, read like the decision counters (decisionTotals).
type gatewayCounts struct {
	mu    sync.RWMutex
	tiers map[string]*gatewayCount
}

type gatewayCount struct{ decisions, denials, micros atomic.Int64 }

func (g *gatewayCounts) add(tier string, limited bool) {
	c := g.of(tier)
	c.decisions.Add(1)
	if limited {
		c.denials.Add(1)
	}
}

// of returns tier's counts, made on first use.
func (g *gatewayCounts) of(tier string) *gatewayCount {
	g.mu.RLock()
	c := g.tiers[tier]
	g.mu.RUnlock()
	if c == nil {
		g.mu.Lock()
		if g.tiers == nil {
			g.tiers = map[string]*gatewayCount{}
		}
		if c = g.tiers[tier]; c == nil {
			if len(g.tiers) >= maxGatewayTiers {
				tier = "other"
			}
			if c = g.tiers[tier]; c == nil {
				c = &gatewayCount{}
				g.tiers[tier] = c
			}
		}
		g.mu.Unlock()
	}
	return c
}

// addTo adds the counts to out as the series GatewaySeries per tier.
func (g *gatewayCounts) addTo(out map[console.SeriesKey]console.Totals) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	for tier, c := range g.tiers {
		k := console.SeriesKey{Policy: GatewaySeries, Tier: tier}
		t := out[k]
		t.Decisions += float64(c.decisions.Load())
		t.Denials += float64(c.denials.Load())
		out[k] = t
		if m := c.micros.Load(); m > 0 {
			k := console.SeriesKey{Policy: GatewaySpendSeries, Tier: tier}
			t := out[k]
			t.Decisions += float64(m)
			out[k] = t
		}
	}
}

// gatewaySettled counts what a settled gateway request charged its
// budgets (Deps.GatewaySettled): nothing without a budget.
func (s *Server) gatewaySettled(st gateway.Settlement) {
	if st.Cost > 0 {
		s.gwCounts.of(st.Tier).micros.Add(int64(st.Cost))
	}
}

// gatewayOutcome counts one of the gateway's decisions for the console
// (Deps.GatewayOutcome).
func (s *Server) gatewayOutcome(o gateway.Outcome) {
	s.gwCounts.add(o.Tier, o.Limited)
	if o.Limited {
		s.top.Observe(o.Identity, gatewayPolicyPrefix+o.Limit, o.RetryAfter)
	}
}

// LookupFunc looks up a gateway key by the name the console shows.
type LookupFunc func(ctx context.Context, identity string) (gateway.Status, error)

// SetGatewayLookup gives the console the gateway's look-up of a key;
// `sluice serve` calls it (through Deps) when its config runs the gateway.
func (s *Server) SetGatewayLookup(f LookupFunc) {
	s.gwLookup.Store(&f)
}

// isGatewayIdentity reports whether id names a gateway key.
func isGatewayIdentity(id string) bool {
	return strings.HasPrefix(id, gateway.KeyNamePrefix) || strings.HasPrefix(id, gateway.ClientPrefix)
}

// gatewayPeekJSON is one limit or budget of a gateway key's look-up, in
// the columns of the page's look-up table.
type gatewayPeekJSON struct {
	Policy     string   `json:"policy"`
	Limit      string   `json:"limit"`
	Human      string   `json:"human"`
	Remaining  string   `json:"remaining"`
	Allowed    bool     `json:"allowed"`
	RetryAfter string   `json:"retry_after,omitempty"`
	Overridden bool     `json:"overridden"`
	Why        []string `json:"why"`
}

// handleGatewayIdentity answers the look-up of a gateway key: its limits
// as its GET /v1/status shows them, and its budgets only to the admin
// (they are the spend view's, which needs the token).
func (s *Server) handleGatewayIdentity(w http.ResponseWriter, r *http.Request, id string) {
	f := s.gwLookup.Load()
	if f == nil {
		writeError(w, http.StatusNotFound, "no gateway runs in this process: %.64q names a gateway key", id)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	st, err := (*f)(ctx, id)
	if errors.Is(err, gateway.ErrNoKey) {
		writeError(w, http.StatusNotFound, "no gateway key is named %.64q", id)
		return
	}
	if err != nil {
		s.log.Warn("console: looking up a gateway key", "err", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "the store cannot be read now")
		return
	}
	rows := []gatewayPeekJSON{}
	for _, l := range st.Limits {
		p := gatewayPeekJSON{Policy: gatewayPolicyPrefix + l.Name, Limit: l.Limit, Human: l.Limit, Remaining: strconv.FormatInt(l.Remaining, 10),
			Allowed: l.Remaining > 0, Why: []string{"gateway tier " + st.Tier + ", " + l.Scope}}
		if l.Model != "" {
			p.Policy += " on " + l.Model
		}
		if l.Remaining <= 0 && l.ResetSeconds > 0 {
			p.RetryAfter = console.HumanDuration(time.Duration(l.ResetSeconds) * time.Second)
		}
		rows = append(rows, p)
	}
	budgets := len(st.Budgets)
	if s.consoleAdmin(r) {
		for _, b := range st.Budgets {
			p := gatewayPeekJSON{Policy: gatewayPolicyPrefix + "budget", Limit: "$" + b.LimitUSD + " per " + b.Window, Human: "$" + b.LimitUSD + " per " + b.Window,
				Remaining: "$" + b.RemainingUSD, Allowed: b.RemainingUSD != "0.000000", Why: []string{"gateway " + b.Scope}}
			if b.Model != "" {
				p.Policy += " on " + b.Model
			}
			if !p.Allowed {
				p.RetryAfter = console.HumanDuration(time.Duration(b.ResetSeconds) * time.Second)
			}
			rows = append(rows, p)
		}
		budgets = 0
	}
	out := map[string]any{"identity": id, "gateway": true, "policies": rows, "others": 0, "overrides": []any{},
		"note": "a gateway key: its limits are the gateway tier's; runtime overrides do not apply to it"}
	if budgets > 0 {
		out["note"] = out["note"].(string) + "; enter the admin token to see its budgets"
	}
	writeAny(w, out)
}
