package gateway

import (
	"net/http"
	"strconv"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/tracing"
)

// Nested limits
//
// A key belongs to a client (keys may share one), a client to at most one
// team, a team to at most one org. Each level carries limits (rpm, tpm,
// rpd, concurrency) and dollar budgets, and a request is charged at every
// level in the same store.ApplyAll as its tier's limits: all or nothing,
// so no level is charged for a request another level refused, and
// parallel requests through any number of gateways cannot together pass a
// level's limit.
//
// In Redis Cluster one ApplyAll must stay in one hash slot, so every store
// key of a request carries the same hash tag, chosen by the highest level:
//
//	no team:        {gw:<client>}:<suffix>                (as before levels)
//	team, no org:   {gw:t:<team>}:c:<n>:<client>:<suffix>  client
//	                {gw:t:<team>}:t:<n>:<team>:<suffix>    team
//	team in an org: {gw:o:<org>}:c:<n>:<client>:<suffix>   client
//	                {gw:o:<org>}:t:<n>:<team>:<suffix>     team
//	                {gw:o:<org>}:o:<suffix>                org
//
// (<n> is the length of the name that follows, so that no client's keys
// can spell another's.) The cost of this design is that all of an org's
// traffic lands on one Cluster slot, hence one master: an org's request
// rate is bounded by what one Redis master decides (about 50-100k
// admissions per second for a few keys each), and its keys cannot be
// spread by adding masters. Orgs are spread over masters as clients were.
// The alternative, one slot per level with a two-phase reservation
// (reserve at the key, then the team, then the org, refunding on a later
// denial), costs a round trip per level and is not atomic: a crash between
// two phases leaks a reservation until its lease lapses, and two requests
// can each see the other's uncommitted charge and both be refused.

// levels is what a client is charged beyond its tier's limits: its own
// budgets, and its team's and org's limits and budgets.
type levels struct {
	team, org string
	specs     []spec
	keys      []string // keys[i] is the store key of specs[i]
	// policies is the RateLimit-Policy field of the client's requests by
	// model, its tier's limits followed by these.
	policies map[string]string
}

// lengthPrefixed writes a name so that no two (name, suffix) pairs join
// into the same key.
func lengthPrefixed(name string) string { return strconv.Itoa(len(name)) + ":" + name }

// attachLevels gives cl its budgets and its team's and org's limits, and
// moves its keys under the hash tag of its highest level.
func (g *Gateway) attachLevels(cl *client, k KeyConfig) {
	cfg := g.cfg
	team, hasTeam := cfg.Teams[k.Team]
	tier := cfg.Tiers[k.Tier]
	budgets := k.Budgets
	if len(budgets) == 0 {
		budgets = tier.Budgets
	}
	if !hasTeam && len(budgets) == 0 {
		return
	}
	lv := &levels{}
	add := func(prefix string, specs []spec) {
		for _, s := range specs {
			lv.specs = append(lv.specs, s)
			lv.keys = append(lv.keys, s.mark+prefix+s.suffix)
		}
	}
	if hasTeam {
		tag := "{gw:t:" + k.Team + "}:"
		if team.Org != "" {
			tag = "{gw:o:" + team.Org + "}:"
		}
		cl.prefix = tag + "c:" + lengthPrefixed(cl.id) + ":"
		add(cl.prefix, markSpecs(appendBudgetSpecs(nil, budgets, "", ""), tier.Scope, tier.Home))
		lv.team = k.Team
		teamSpecs := appendSpecs(nil, team.Limits.inZone(cfg.Timezone), "", cfg.LeaseTTL)
		add(tag+"t:"+lengthPrefixed(k.Team)+":", markSpecs(appendBudgetSpecs(setLevel(teamSpecs, "team", k.Team), team.Budgets, "team", k.Team), team.Scope, team.Home))
		if team.Org != "" {
			lv.org = team.Org
			org := cfg.Orgs[team.Org]
			orgSpecs := appendSpecs(nil, org.Limits.inZone(cfg.Timezone), "", cfg.LeaseTTL)
			add(tag+"o:", markSpecs(appendBudgetSpecs(setLevel(orgSpecs, "org", team.Org), org.Budgets, "org", team.Org), org.Scope, org.Home))
		}
	} else {
		add(cl.prefix, markSpecs(appendBudgetSpecs(nil, budgets, "", ""), tier.Scope, tier.Home))
	}
	all := append(append([]spec(nil), cl.tier.specs...), lv.specs...)
	lv.policies = map[string]string{"": rateLimitPolicy(all, "")}
	for _, s := range all {
		if s.model != "" {
			lv.policies[s.model] = rateLimitPolicy(all, s.model)
		}
	}
	cl.levels = lv
}

func setLevel(specs []spec, level, name string) []spec {
	for i := range specs {
		specs[i].level, specs[i].levelName = level, name
	}
	return specs
}

// reason is the spec's label in sluice_gateway_rejections_total: its name,
// after its level's ("team_rpm"); bounded by the kinds of limits.
func (s *spec) reason() string {
	name := s.name
	if s.kind == kindBudget {
		name = "budget"
	}
	if s.level != "" {
		return s.level + "_" + name
	}
	return name
}

// admitLevels adds the client's level limits and budgets to c's batch. It
// answers the client itself and reports false when the request can never
// pass one of them, or its model has no price for a budget.
func (g *Gateway) admitLevels(w http.ResponseWriter, r *http.Request, c *call) bool {
	lv := c.client.levels
	if lv == nil {
		return true
	}
	for i := range lv.specs {
		s := &lv.specs[i]
		if !s.applies(c.rawModel) {
			continue
		}
		// A leased tier's keys take their team's and org's limits from
		// leases too (lease.go), budgets (calendar windows) and
		// concurrency slots excepted: the lease store sends those on.
		req := sluice.Request{Key: lv.keys[i], Algorithm: s.alg, Limit: s.limit, Cost: 1, UseLease: c.client.tier.lease}
		switch s.kind {
		case kindTokens:
			var ok bool
			if req.Cost, ok = g.tokenReservation(w, r, c, s); !ok {
				return false
			}
		case kindConcurrency:
			req.Lease, req.UseLease = c.id, false
		case kindBudget:
			var ok bool
			if req.Cost, ok = g.budgetReservation(w, c, s); !ok {
				return false
			}
		}
		c.specs = append(c.specs, s)
		c.reqs = append(c.reqs, req)
	}
	return true
}

// tokenReservation is what token limit s reserves for c. It answers the
// client itself and reports false when that can never fit s.
func (g *Gateway) tokenReservation(w http.ResponseWriter, r *http.Request, c *call, s *spec) (int64, bool) {
	cost := g.tokenCost(c, s)
	if cost > s.limit.Capacity() {
		if tracing.Recording(r.Context()) {
			traceAdmit(r.Context(), c, "too_large", nil)
		}
		g.tooLarge(w, c, s)
		return 0, false
	}
	return cost, true
}

// budgetReservation is what dollar budget s reserves for c, in
// micro-dollars, c priced once. It answers the client itself and reports
// false when c's model has no price or its cost can never fit s.
func (g *Gateway) budgetReservation(w http.ResponseWriter, c *call, s *spec) (int64, bool) {
	if !c.bud.priced && !g.priceCall(w, c) {
		return 0, false
	}
	cost := int64(max(c.bud.reserved, 1))
	if cost > s.limit.Rate {
		g.budgetTooLarge(w, c, s)
		return 0, false
	}
	return cost, true
}
