package gateway

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/pricing"
)

// SpendRow is one dollar budget and what its window has spent: a key's
// (its client's: keys that share a client share its budgets), a team's or
// an org's. It names keys by their configured names, never the key or its
// hash.
type SpendRow struct {
	// Level is "key", "team" or "org".
	Level string `json:"level"`
	// Name is the team's or org's name, or the names of the client's keys
	// joined with ", ".
	Name   string `json:"name"`
	Window string `json:"window"`
	Zone   string `json:"zone"`
	Model  string `json:"model,omitempty"`
	// The amounts are dollars with six decimals, as GET /v1/status says.
	LimitUSD     string `json:"limit_usd"`
	SpentUSD     string `json:"spent_usd"`
	RemainingUSD string `json:"remaining_usd"`
	// Spent is the share of the budget spent, 0 to 1.
	Spent float64 `json:"spent"`
	// ResetSeconds is the time until the window resets.
	ResetSeconds int64 `json:"reset_seconds"`
}

// SpendReport is every budget's spend, most spent first.
type SpendReport struct {
	Rows []SpendRow `json:"rows"`
	// Clients is how many clients have budgets; Peeked how many of them
	// were read (at most the bound Spend was given).
	Clients int `json:"clients"`
	Peeked  int `json:"peeked"`
}

// budgetOf is one budget of a client to peek.
type budgetOf struct {
	s   *spec
	key string
}

// Spend peeks every budget of the first maxClients clients (by id) that
// have budgets, charging nothing: one store call per client (its keys,
// its team's and its org's share one hash tag), a team's or org's budget
// once however many clients share it.
func (g *Gateway) Spend(ctx context.Context, maxClients int) (SpendReport, error) {
	names := map[*client][]string{}
	var clients []*client
	for _, cl := range g.keys {
		if _, ok := names[cl]; !ok {
			clients = append(clients, cl)
		}
		names[cl] = append(names[cl], cl.name)
	}
	// Keys that share a client are one client whatever their names; the
	// map of keys by hash may hold it under each.
	byID := map[string]*client{}
	for _, cl := range clients {
		if o, ok := byID[cl.id]; ok && o != cl {
			names[o] = append(names[o], names[cl]...)
			continue
		}
		byID[cl.id] = cl
	}
	clients = clients[:0]
	for _, cl := range byID {
		if len(budgetsOf(cl)) > 0 {
			clients = append(clients, cl)
		}
	}
	slices.SortFunc(clients, func(a, b *client) int { return strings.Compare(a.id, b.id) })
	rep := SpendReport{Rows: []SpendRow{}, Clients: len(clients)}
	seen := map[string]bool{}
	for _, cl := range clients[:min(len(clients), max(0, maxClients))] {
		var bs []budgetOf
		for _, b := range budgetsOf(cl) {
			if b.s.level != "" && seen[b.key] {
				continue
			}
			seen[b.key] = true
			bs = append(bs, b)
		}
		if len(bs) == 0 {
			continue
		}
		reqs := make([]sluice.Request, len(bs))
		for i, b := range bs {
			reqs[i] = sluice.Request{Key: b.key, Algorithm: b.s.alg, Limit: b.s.limit}
		}
		ds, err := g.store.ApplyAll(ctx, sluice.OpPeek, reqs)
		if err != nil {
			return rep, fmt.Errorf("gateway: peeking budgets: %w", err)
		}
		rep.Peeked++
		kn := slices.Clone(names[cl])
		slices.Sort(kn)
		for i, d := range ds {
			s := bs[i].s
			left := min(max(d.Remaining, 0), s.limit.Rate)
			row := SpendRow{Level: cmp.Or(s.level, "key"), Name: cmp.Or(s.levelName, strings.Join(slices.Compact(kn), ", ")),
				Window: s.window, Zone: s.zone, Model: s.model,
				LimitUSD: pricing.Micros(s.limit.Rate).String(), SpentUSD: pricing.Micros(s.limit.Rate - left).String(),
				RemainingUSD: pricing.Micros(left).String(), ResetSeconds: sluice.CeilSeconds(max(d.ResetAfter, d.RetryAfter))}
			if s.limit.Rate > 0 {
				row.Spent = float64(s.limit.Rate-left) / float64(s.limit.Rate)
			}
			rep.Rows = append(rep.Rows, row)
		}
	}
	slices.SortStableFunc(rep.Rows, func(a, b SpendRow) int {
		return cmp.Or(cmp.Compare(b.Spent, a.Spent), strings.Compare(a.Level, b.Level), strings.Compare(a.Name, b.Name))
	})
	return rep, nil
}

// budgetsOf lists a client's budgets with their store keys: its tier's
// and its own, its team's and its org's.
func budgetsOf(cl *client) []budgetOf {
	var out []budgetOf
	for i := range cl.tier.specs {
		if s := &cl.tier.specs[i]; s.kind == kindBudget {
			out = append(out, budgetOf{s, cl.specKeys[i]})
		}
	}
	if lv := cl.levels; lv != nil {
		for i := range lv.specs {
			if s := &lv.specs[i]; s.kind == kindBudget {
				out = append(out, budgetOf{s, lv.keys[i]})
			}
		}
	}
	return out
}
