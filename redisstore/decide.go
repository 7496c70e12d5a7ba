package redisstore

import (
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
)

// reply is one key's part of a script's reply: allowed and three numbers
// whose meaning depends on the algorithm (see the .lua files).
type reply struct {
	ok      bool
	x, y, z int64
}

// decide builds the Decision for req from the script's reply, with the
// same integer arithmetic as package algo, so Redis and memory agree to the
// nanosecond.
func decide(req *sluice.Request, r reply) sluice.Decision {
	if !req.Limit.Calendar.IsZero() {
		return decideCalendar(req, r)
	}
	l := req.Limit
	p := int64(l.Period)
	eff := max(req.Cost, 1)
	d := sluice.Decision{Limit: l, Allowed: r.ok}
	switch req.Algorithm {
	case sluice.GCRA:
		tau := l.Tau()
		tat := r.x
		d.Remaining = algo.BucketLeft(l, tau-tat)
		d.ResetAfter = dur(tat)
		if !r.ok {
			d.RetryAfter = dur(tat + l.CostInterval(eff) - tau)
			d.Remaining = max(0, d.Remaining)
		}
	case sluice.TokenBucket:
		tau := l.Tau()
		level := r.x
		d.Remaining = algo.BucketLeft(l, level)
		d.ResetAfter = dur(tau - level)
		if !r.ok {
			d.RetryAfter = dur(l.CostInterval(eff) - level)
			d.Remaining = max(0, d.Remaining)
		}
	case sluice.FixedWindow:
		count, e := r.x, r.y
		d.Remaining = l.Rate - count
		if !r.ok {
			d.RetryAfter = dur(p - e)
			d.Remaining = max(0, d.Remaining)
			d.ResetAfter = dur(p - e)
		} else if count > 0 {
			d.ResetAfter = dur(p - e)
		}
	case sluice.SlidingWindowCounter:
		curr, prev, e := r.x, r.y, r.z
		d.Remaining = l.Rate - algo.MulDivCeil(prev, p-e, p) - curr
		d.ResetAfter = dur(algo.SlidingReset(p, e, prev, curr))
		if !r.ok {
			d.RetryAfter = dur(algo.SlidingRetry(l.Rate, p, e, prev, curr, eff))
			d.Remaining = max(0, d.Remaining)
		}
	case sluice.SlidingWindowLog, sluice.Concurrency:
		used, retry, reset := r.x, r.y, r.z
		d.Remaining = l.Rate - used
		d.ResetAfter = dur(reset)
		if !r.ok {
			d.RetryAfter = dur(retry)
			d.Remaining = max(0, d.Remaining)
		}
	}
	return d
}

func dur(ns int64) time.Duration { return time.Duration(max(ns, 0)) }
