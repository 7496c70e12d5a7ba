package server

import (
	"cmp"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/console"
	"github.com/sluice-io/sluice/internal/overrides"
)

// This file answers the console's list of active overrides
// (GET /ui/api/overrides, admin token): who set each (the admin token's
// name), why (its reason), until when, soonest to expire first. An
// override of an API key's own identity shows by the key's name and a
// prefix of its hash, never the key.

// maxListedOverrides bounds the overrides one listing answers; the store
// holds up to overrides.MaxOverrides.
const maxListedOverrides = 500

// activeOverrideJSON is one override of the list.
type activeOverrideJSON struct {
	Identity  string    `json:"identity"`
	Shown     string    `json:"shown"`
	Policy    string    `json:"policy,omitempty"`
	Human     string    `json:"human"`
	By        string    `json:"by,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	At        time.Time `json:"at,omitzero"`
	Until     time.Time `json:"until,omitzero"`
	ExpiresIn string    `json:"expires_in,omitempty"`
}

// shownIdentity names an override's identity for the page: "key:HASH" of
// a configured key as "key_name:NAME (key:PREFIX…)", of another as
// "key:PREFIX…"; anything else as it is.
func shownIdentity(cfg *config.Config, id string) string {
	h, ok := strings.CutPrefix(id, "key:")
	if !ok || len(h) <= 12 {
		return id
	}
	short := "key:" + h[:12] + "…"
	if k := cfg.Keys[h]; k != nil {
		return overrides.KeyNamePrefix + k.Name + " (" + short + ")"
	}
	return short
}

// humanOverride says what an override does: its limit in human units, or
// its scale of the configured limit.
func humanOverride(cfg *config.Config, o *overrides.Override) string {
	if o.Limit == "" {
		return strconv.FormatFloat(o.Scale, 'g', -1, 64) + "× the configured limit"
	}
	l, err := sluice.ParseLimit(o.Limit)
	if err != nil {
		return o.Limit
	}
	a := sluice.GCRA
	if p := cfg.Policies[o.Policy]; p != nil {
		a = p.Algorithm
	}
	return console.HumanLimit(a, l)
}

func (s *Server) handleConsoleOverrides(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.authorizeConsole(w, r, "overrides"); !ok {
		return
	}
	cfg := s.cfg.Load()
	now := s.ovr.Now()
	all := s.ovr.Set().All()
	active := make([]*overrides.Override, 0, len(all))
	for _, o := range all {
		if o.Active(now) {
			active = append(active, o)
		}
	}
	// Soonest to expire first, those without an end last.
	slices.SortStableFunc(active, func(a, b *overrides.Override) int {
		switch {
		case a.Until.IsZero() != b.Until.IsZero():
			if a.Until.IsZero() {
				return 1
			}
			return -1
		}
		return cmp.Compare(a.Until.UnixNano(), b.Until.UnixNano())
	})
	list := active[:min(len(active), maxListedOverrides)]
	out := make([]activeOverrideJSON, len(list))
	for i, o := range list {
		out[i] = activeOverrideJSON{Identity: o.Identity, Shown: shownIdentity(cfg, o.Identity), Policy: o.Policy,
			Human: humanOverride(cfg, o), By: o.By, Reason: o.Reason, At: o.At, Until: o.Until}
		if !o.Until.IsZero() {
			out[i].ExpiresIn = console.HumanDuration(time.Duration(o.Until.UnixNano() - now))
		}
	}
	writeAny(w, map[string]any{"overrides": out, "active": len(active), "expired": len(all) - len(active), "shared": s.ovr.Shared()})
}
