package upstream

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-io/sluice"
)

// Status is one upstream model's headroom, as GET /v1/status shows it.
type Status struct {
	Upstream string `json:"upstream"`
	Region   string `json:"region,omitempty"`
	Kind     Kind   `json:"kind"`
	Model    string `json:"model"`
	// Declared are the configured limits; Limits those in force, tightened
	// by what the provider reported.
	Declared Limits `json:"declared"`
	Limits   Limits `json:"limits"`
	// Remaining is what the shared store has left of each limit in force
	// (-1 for a limit not set), and Headroom the smallest fraction left.
	Remaining map[string]int64 `json:"remaining"`
	Headroom  float64          `json:"headroom"`
	// ProviderRemainingRequests and ProviderRemainingTokens are what the
	// provider last reported left, -1 when it never did.
	ProviderRemainingRequests int64 `json:"provider_remaining_requests"`
	ProviderRemainingTokens   int64 `json:"provider_remaining_tokens"`
	// Up is false while the upstream model is cooling after a provider
	// 429 or repeated failures any replica saw (until CooldownUntil, read
	// from the store's cooldown key: fleet-wide) or marked down after a
	// failure (this replica's circuit, until DownUntil). The times are
	// absent when past.
	Up            bool       `json:"up"`
	CooldownUntil *time.Time `json:"cooldown_until,omitempty"`
	DownUntil     *time.Time `json:"down_until,omitempty"`
	// Unreachable is set while this replica cannot reach the upstream and
	// probes it (probe.go): since when, the probes sent, and when the
	// next goes; Up is false meanwhile.
	Unreachable *Unreachable `json:"unreachable,omitempty"`
}

// Unreachable is an unreachable upstream's probing, in Status.
type Unreachable struct {
	Since     time.Time `json:"since"`
	Probes    int64     `json:"probes"`
	NextProbe time.Time `json:"next_probe"`
}

// Status peeks every upstream model's limits in the store, changing
// nothing.
func (p *Pool) Status(ctx context.Context) ([]Status, error) {
	var out []Status
	now := p.now()
	for _, t := range p.Targets() {
		s := Status{Upstream: t.Up.Name, Region: t.Up.Region, Kind: t.Up.Kind, Model: t.Model, Declared: t.limits, Limits: t.Limits(),
			Remaining: map[string]int64{}, Headroom: 1}
		s.ProviderRemainingRequests, s.ProviderRemainingTokens = t.LastRemaining()
		s.CooldownUntil, s.DownUntil = future(t.coolUntil.Load(), now), future(t.downUntil.Load(), now)
		if since, probes, next := t.Up.ProbeState(); !since.IsZero() {
			s.Unreachable = &Unreachable{Since: since.UTC(), Probes: probes, NextProbe: next.UTC()}
		}
		s.Up = s.CooldownUntil == nil && s.DownUntil == nil && s.Unreachable == nil
		var reqs []sluice.Request
		var names []string
		for i := range 4 {
			if rate := t.limit(i); rate > 0 {
				reqs = append(reqs, p.logReq(t, i, rate, 0))
				names = append(names, limNames[i])
			}
		}
		// The cooldown key last: while it is in debt the upstream model
		// has no room on any replica, whatever its limits hold.
		reqs = append(reqs, p.coolReq(t, 1))
		ds, err := p.store.ApplyAll(ctx, sluice.OpPeek, reqs)
		if err != nil {
			return nil, fmt.Errorf("upstream %s model %s: status: %w", t.Up.Name, t.Model, err)
		}
		cool := ds[len(ds)-1]
		for i, d := range ds[:len(ds)-1] {
			left := max(d.Remaining, 0)
			if !cool.Allowed {
				left = 0
			}
			s.Remaining[names[i]] = left
			s.Headroom = min(s.Headroom, float64(left)/float64(reqs[i].Limit.Capacity()))
		}
		if !cool.Allowed {
			s.Headroom = 0
			if until := now.Add(cool.RetryAfter).UTC(); s.CooldownUntil == nil || until.After(*s.CooldownUntil) {
				s.CooldownUntil = &until
			}
			s.Up = false
		}
		out = append(out, s)
	}
	return out, nil
}

// future returns the time at unix nanos, nil when it is not after now.
func future(at int64, now time.Time) *time.Time {
	if at <= now.UnixNano() {
		return nil
	}
	t := time.Unix(0, at).UTC()
	return &t
}
