package algo

import "github.com/sluice-io/sluice"

// GCRAParams are the per-limit constants of GCRA and TokenBucket, worth
// computing once per limit rather than once per decision.
type GCRAParams struct {
	// Limit is the limit the parameters belong to.
	Limit sluice.Limit
	// Interval is the refill time of one event, in nanoseconds.
	Interval int64
	// Tau is the refill time of a full burst, in nanoseconds.
	Tau int64
}

// NewGCRAParams validates l and computes its parameters.
func NewGCRAParams(l sluice.Limit) (GCRAParams, error) {
	if err := l.Validate(); err != nil {
		return GCRAParams{}, err
	}
	return GCRAParams{Limit: l, Interval: l.Interval(), Tau: l.CostInterval(l.Capacity())}, nil
}

// GCRAAllow is the GCRA OpAllow on one key's TAT, for stores that keep the
// TAT in an atomic word: it returns the decision and the new TAT (0 for a
// full bucket). The caller must have validated cost: 1 ≤ cost ≤ burst.
// It agrees exactly with Apply.
func GCRAAllow(tat int64, p *GCRAParams, cost, now int64) (sluice.Decision, int64) {
	l := p.Limit
	inc := p.Interval
	if cost != 1 {
		inc = l.CostInterval(cost)
	}
	tat = max(tat, now)
	d := sluice.Decision{Limit: l}
	if allowAt := tat + inc - p.Tau; allowAt > now {
		d.RetryAfter = dur(allowAt - now)
		d.Remaining = max(0, CostsIn(l, now+p.Tau-tat))
		d.ResetAfter = dur(tat - now)
		return d, tat
	}
	tat += inc
	d.Allowed = true
	d.Remaining = CostsIn(l, now+p.Tau-tat)
	d.ResetAfter = dur(tat - now)
	return d, tat
}
