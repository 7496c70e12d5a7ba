package gateway

import (
	"net/http"
	"slices"
	"strings"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/yamlconf"
	"github.com/sluice-io/sluice/region"
)

// One limit across regions
//
// A tier, team or org with `scope: global` (and optionally `home:`) has
// its request and token limits and its dollar budgets held to one limit
// across the regions of serve's store (docs/regions.md): a key of the tier
// spending from three regions at once spends one budget. Its store keys
// carry region.GlobalKey's mark, which serve's region store reads: at the
// key's home the home's Redis decides, elsewhere the region's share of
// the limit, charged at the home in advance, so no request waits on a
// call across regions (but a cold key's first, for one fetch). The marks
// keep the hash tag of the request's keys, so one request's keys stay in
// one Redis Cluster slot.
//
// What stays regional: concurrency (a request in flight is held, which a
// share cannot decide: a global tier with concurrency is a config error),
// the reservations that hold a request's place (internal), session
// budgets (session.go) and the batch queue's. Usage learnt after the
// response is charged to the region's share (into a debt its next fetch
// pays at home); what a reservation did not use goes back to a bucket's
// share, or to the share of the window a budget's charge was taken from
// (the refund names it, admit.go's noteWindows; a batch's hold likewise,
// batchwindow.go), and is dropped once that window ended: a refund that
// arrives after the window turned would free the next window's money.
// /v1/status reads a global limit's remaining at its home
// (statushome.go).

// Scopes of a tier, team or org.
const (
	scopeRegional = "regional"
	scopeGlobal   = "global"
)

// checkScope records the problems of the scope and home of the tier,
// team or org at path, whose limits are l and its models'.
func (c *Config) checkScope(doc *yamlconf.Doc, path, scope, home string, l Limits, models map[string]Limits) {
	switch strings.ToLower(scope) {
	case "", scopeRegional:
		if home != "" {
			doc.Addf(path+".home", "only a tier, team or org with scope: global has a home")
		}
		return
	case scopeGlobal:
	default:
		doc.Addf(path+".scope", "unknown scope %q; valid: regional, global", truncateName(scope))
		return
	}
	if len(c.Regions) == 0 {
		doc.Addf(path+".scope", "scope global needs serve's store.region and store.regions (docs/regions.md)")
		return
	}
	if home != "" && !slices.Contains(c.Regions, home) {
		doc.Addf(path+".home", "unknown region %q; %s", truncateName(home), yamlconf.Valid("regions", c.Regions))
	}
	if l.Concurrency > 0 {
		doc.Addf(path+".concurrency", "%s cannot be global: requests in flight are held (algorithm concurrency), which a region's share cannot decide; make it regional or drop concurrency", path)
	}
	for _, m := range sortedKeys(models) {
		if models[m].Concurrency > 0 {
			doc.Addf(path+".models."+m+".concurrency", "%s cannot be global: requests in flight are held (algorithm concurrency), which a region's share cannot decide", path)
		}
	}
}

// checkScopes checks every tier's, team's and org's scope.
func (c *Config) checkScopes(doc *yamlconf.Doc) {
	for _, name := range sortedKeys(c.Tiers) {
		t := c.Tiers[name]
		c.checkScope(doc, "tiers."+name, t.Scope, t.Home, t.Limits(), t.Models)
	}
	for _, name := range sortedKeys(c.Teams) {
		t := c.Teams[name]
		c.checkScope(doc, "teams."+name, t.Scope, t.Home, t.Limits, nil)
	}
	for _, name := range sortedKeys(c.Orgs) {
		o := c.Orgs[name]
		c.checkScope(doc, "orgs."+name, o.Scope, o.Home, o.Limits, nil)
	}
}

// globalMark is what starts the store keys of a tier, team or org of
// this scope and home: region.GlobalPrefix for a global one, "" else.
func globalMark(scope, home string) string {
	if strings.EqualFold(scope, scopeGlobal) {
		return region.GlobalPrefix(home)
	}
	return ""
}

// markSpecs marks specs, but those of concurrency (regional always), as
// of scope and home.
func markSpecs(specs []spec, scope, home string) []spec {
	mark := globalMark(scope, home)
	for i := range specs {
		if specs[i].alg != sluice.Concurrency {
			specs[i].mark = mark
		}
	}
	return specs
}

// DecidedByHeader names, on a response to a request with global limits or
// budgets, the tier that decided them (docs/regions.md): "home" (the
// limit's home store, in this region), "share" (this region's share of
// the limit, charged at the home in advance), or "policy" (the home was
// unreachable and the share spent: the failure policy answered). When
// several global limits apply, the one that refused the request names it,
// else the weakest tier among them (policy, then share, then home).
const DecidedByHeader = "Sluice-Decided-By"

// decidedBy is the tier that decided d, a global limit's decision.
func decidedBy(d sluice.Decision) string {
	switch {
	case d.Degraded:
		return "policy"
	case d.Source == sluice.FromShare:
		return "share"
	}
	return "home"
}

// setDecidedBy sets DecidedByHeader for a request with global limits;
// ds[i] is the decision of c.specs[i].
func setDecidedBy(h http.Header, c *call, ds []sluice.Decision) {
	if !slices.ContainsFunc(c.specs, func(s *spec) bool { return s.mark != "" }) {
		return // no global limit: the usual case, without the map below
	}
	rank := map[string]int{"home": 1, "share": 2, "policy": 3}
	by, denied := "", false
	for i, s := range c.specs {
		if s.mark == "" || i >= len(ds) {
			continue
		}
		tier := decidedBy(ds[i])
		switch {
		case denied:
		case !ds[i].Allowed:
			by, denied = tier, true
		case rank[tier] > rank[by]:
			by = tier
		}
	}
	if by != "" {
		h.Set(DecidedByHeader, by)
	}
}

// decidedBy is the tier that decided d, s's decision, for a global s; ""
// for a regional one.
func (s *spec) decidedBy(d sluice.Decision) string {
	if s.mark == "" {
		return ""
	}
	return decidedBy(d)
}
