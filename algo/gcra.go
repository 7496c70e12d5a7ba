package algo

import (
	"fmt"
	"math/bits"

	"github.com/sluice-io/sluice"
)

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

// NewGCRAParams validates l and computes its parameters. A calendar limit
// fails with sluice.ErrInvalidLimit: only FixedWindow enforces one.
func NewGCRAParams(l sluice.Limit) (GCRAParams, error) {
	if err := l.Validate(); err != nil {
		return GCRAParams{}, err
	}
	if !l.Calendar.IsZero() {
		return GCRAParams{}, fmt.Errorf("%w: a calendar limit (%s) needs the fixed_window algorithm, not gcra", sluice.ErrInvalidLimit, l)
	}
	if l.Granularity != 0 {
		return GCRAParams{}, fmt.Errorf("%w: granularity %s is for the sliding_window_log algorithm, not gcra", sluice.ErrInvalidLimit, l.Granularity)
	}
	return GCRAParams{Limit: l, Interval: l.Interval(), Tau: l.Tau()}, nil
}

// GCRAAllow is the GCRA OpAllow on one key's TAT, for stores that keep the
// TAT in an atomic word: it returns the decision and the new TAT (0 for a
// full bucket). The caller must have validated cost: 1 ≤ cost ≤ burst.
// It agrees exactly with Apply.
func GCRAAllow(tat int64, p *GCRAParams, cost, now int64) (sluice.Decision, int64) {
	inc := p.Interval
	if cost != 1 {
		inc = p.Limit.CostInterval(cost)
	}
	tat = max(tat, now)
	if tat+inc-p.Tau > now {
		return GCRADenied(p, tat, inc, now), tat
	}
	tat += inc
	return GCRAAdmitted(p, tat, now), tat
}

// GCRAAdmitted is the decision for an admitted GCRA request whose new TAT is
// tat: Remaining and ResetAfter as Apply computes them. Stores that commit
// the TAT by compare-and-swap compute the decision after the swap, to keep
// the window between read and swap short.
func GCRAAdmitted(p *GCRAParams, tat, now int64) sluice.Decision {
	var d sluice.Decision
	GCRAAdmittedTo(&d, p, tat, now)
	return d
}

// GCRAAdmittedTo sets the fields of *d, a zero Decision, that
// GCRAAdmitted sets: a store's hot path writes the decision straight
// into its result rather than copying one (a Decision is 128 bytes).
func GCRAAdmittedTo(d *sluice.Decision, p *GCRAParams, tat, now int64) {
	d.Allowed = true
	d.Limit = p.Limit
	d.Remaining = p.left(now + p.Tau - tat)
	d.ResetAfter = dur(tat - now)
}

// left is BucketLeft(p.Limit, ns), reading the limit in place rather
// than copying it twice (to CostsIn and Capacity): the hot path's.
func (p *GCRAParams) left(ns int64) int64 {
	if ns <= 0 {
		return BucketLeft(p.Limit, ns)
	}
	c := p.Limit.Burst
	if c <= 0 {
		c = p.Limit.Rate
	}
	hi, lo := bits.Mul64(uint64(ns), uint64(p.Limit.Rate))
	if hi >= uint64(p.Limit.Period) {
		return c // past 2^64 events: CostsIn's MaxInt64, capped
	}
	if q, _ := bits.Div64(hi, lo, uint64(p.Limit.Period)); q < uint64(c) {
		return int64(q)
	}
	return c
}

// GCRADenied is the decision for a denied GCRA request of cost whose
// increment is inc, on a key whose TAT, raised to now, is tat.
func GCRADenied(p *GCRAParams, tat, inc, now int64) sluice.Decision {
	return sluice.Decision{
		Limit:      p.Limit,
		Remaining:  max(0, BucketLeft(p.Limit, now+p.Tau-tat)),
		RetryAfter: dur(tat + inc - p.Tau - now),
		ResetAfter: dur(tat - now),
	}
}
