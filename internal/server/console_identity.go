package server

import (
	"net/http"
	"slices"
	"strings"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/console"
	"github.com/sluice-io/sluice/internal/metrics"
)

// This file answers the console's look-up of one identity
// (GET /ui/api/identity): the limits that apply to it, not every policy.
// A policy applies when the config ties it to the identity (an API key's
// tier, forward auth's default tier for "user:" and "ip:" callers, a key's
// or the config's overrides), when a runtime override for that policy
// matches it, or when the identity has state under it in the store (it
// was charged and the limit has not refilled): a caller of /v1/check
// names its policy per request, so that state is the one trace of it.

// maxPeekPolicies bounds the policies one look-up peeks.
const maxPeekPolicies = 64

// Why a policy applies to an identity (peekJSON.Why).
const (
	whyTier        = "tier"
	whyDefaultTier = "default tier"
	whyKeyOverride = "key override"
	whyCfgOverride = "config override"
	whyOverride    = "override"
	whyInUse       = "in use"
)

// peekJSON is one policy of a look-up.
type peekJSON struct {
	Policy       string   `json:"policy"`
	Algorithm    string   `json:"algorithm"`
	Rate         int64    `json:"rate"`
	PeriodMS     int64    `json:"period_ms"`
	Limit        string   `json:"limit"`
	Human        string   `json:"human"`
	Remaining    int64    `json:"remaining"`
	Allowed      bool     `json:"allowed"`
	RetryAfterMS int64    `json:"retry_after_ms"`
	RetryAfter   string   `json:"retry_after,omitempty"`
	Overridden   bool     `json:"overridden"`
	Degraded     bool     `json:"degraded"`
	Why          []string `json:"why"`
}

// configuredPolicies are the policies the config ties to identity, each
// with why: its tier's (an API key's, or forward auth's default tier for
// callers it keys as "user:" or "ip:", and for unknown keys when it gives
// them that tier), and those its overrides name.
func configuredPolicies(cfg *config.Config, identity string, key *config.Key) map[string][]string {
	why := map[string][]string{}
	add := func(p, w string) {
		if !slices.Contains(why[p], w) {
			why[p] = append(why[p], w)
		}
	}
	tier, w := (*config.Tier)(nil), whyTier
	switch {
	case key != nil:
		tier = key.Tier
	case strings.HasPrefix(identity, "user:") || strings.HasPrefix(identity, "ip:") ||
		(strings.HasPrefix(identity, "key:") && !cfg.Authz.RejectUnknownKeys):
		tier, w = cfg.Authz.DefaultTier, whyDefaultTier
	}
	if tier != nil {
		for _, p := range tier.Policies {
			add(p.Name, w+" "+tier.Name)
		}
	}
	if key != nil {
		for p := range key.Overrides {
			add(p, whyKeyOverride)
		}
	}
	for p := range cfg.Overrides[identity] {
		add(p, whyCfgOverride)
	}
	return why
}

func (s *Server) handleIdentity(w http.ResponseWriter, r *http.Request) {
	cfg := s.cfg.Load()
	q := r.URL.Query().Get("id")
	if isGatewayIdentity(q) && len(q) <= config.MaxKeyLen {
		s.handleGatewayIdentity(w, r, q)
		return
	}
	identity, key, err := consoleIdentity(cfg, q)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	name := ""
	if key != nil {
		name = key.Name
	}
	why := configuredPolicies(cfg, identity, key)
	matching := s.ovr.Set().Matching(identity, name)
	for _, o := range matching {
		if o.Policy != "" && cfg.Policies[o.Policy] != nil && !slices.Contains(why[o.Policy], whyOverride) {
			why[o.Policy] = append(why[o.Policy], whyOverride)
		}
	}
	// Every policy is peeked, those tied to the identity first, so that
	// state under any other shows too: one store call (their keys share
	// the identity's hash tag, on Cluster too).
	names := cfg.PolicyNames()
	slices.SortStableFunc(names, func(a, b string) int {
		_, ta := why[a]
		_, tb := why[b]
		switch {
		case ta && !tb:
			return -1
		case tb && !ta:
			return 1
		}
		return 0
	})
	if len(names) > maxPeekPolicies {
		names = names[:maxPeekPolicies]
	}
	var targets []target
	for _, n := range names {
		targets = append(targets, newTarget(cfg, cfg.Policies[n], metrics.NoTier, identity, key, 0))
	}
	out := map[string]any{"identity": q, "policies": []peekJSON{}, "others": 0}
	if len(targets) > 0 {
		configured := make([]sluice.Limit, len(targets))
		for i := range targets {
			configured[i] = targets[i].req.Limit
		}
		res, err := s.decide(r, sluice.OpPeek, targets)
		if err != nil {
			s.writeDecideError(w, err)
			return
		}
		ps := []peekJSON{}
		for i, t := range res.targets {
			d := res.decisions[i]
			ws := why[t.policy.Name]
			if len(ws) == 0 && inUse(d) {
				ws = []string{whyInUse}
			}
			if len(ws) == 0 {
				continue
			}
			p := peekJSON{Policy: t.policy.Name, Algorithm: t.policy.Algorithm.String(), Rate: d.Limit.Rate,
				PeriodMS: sluice.CeilMillis(d.Limit.Period), Limit: d.Limit.String(), Human: console.HumanLimit(t.policy.Algorithm, d.Limit),
				Remaining: d.Remaining, Allowed: d.Allowed, RetryAfterMS: sluice.CeilMillis(d.RetryAfter),
				Overridden: t.req.Limit != configured[i], Degraded: d.Degraded, Why: ws}
			if d.RetryAfter > 0 {
				p.RetryAfter = console.HumanDuration(d.RetryAfter)
			}
			ps = append(ps, p)
		}
		out["policies"], out["others"] = ps, len(cfg.Policies)-len(ps)
	}
	now := s.ovr.Now()
	ovs := make([]overrideJSON, len(matching))
	admin := s.consoleAdmin(r)
	for i, o := range matching {
		if !admin {
			// Free text an admin wrote ("refund for ticket 4411, acme's
			// CTO asked") and who: an admin's to read, not a public
			// console's (console.public_read). A copy: o is the set's own.
			c := *o
			c.Reason, c.By = "", ""
			o = &c
		}
		ovs[i] = overrideJSON{o, o.Active(now)}
	}
	out["overrides"] = ovs
	if !s.ovr.Shared() {
		out["note"] = "overrides on the memory store are this instance's only"
	}
	writeAny(w, out)
}

// inUse reports whether a peek of cost 0 found state: capacity taken or
// a concurrency slot held (a limit that refilled is as if never used).
func inUse(d sluice.Decision) bool {
	return !d.Allowed || d.Remaining < d.Limit.Capacity()
}
