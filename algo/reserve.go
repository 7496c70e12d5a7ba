package algo

import (
	"time"

	"github.com/sluice-io/sluice"
)

// reserve is OpAllow or OpPeek of a GCRA or TokenBucket request with a
// MaxWait w (validated): the request is admitted when it would be admitted
// within w, that is when its wait TAT + interval(cost) − tau − now is at
// most w, and charged now, moving the TAT (or the bucket's level) into the
// future. Its Delay is the wait. A denied request's RetryAfter is the time
// until its wait shrinks to w.
//
// It is GCRA with tolerance tau + w whose admitted requests are told to
// wait until the TAT minus tau: the Redis scripts run exactly that (they
// are sent tau + w as tau). Remaining is exact and negative by what is
// reserved ahead, for allowed and denied requests alike, so that package
// guard seeds its local state with the debt.
func reserve(op sluice.Op, st State, req sluice.Request, now int64) (sluice.Decision, State, error) {
	l := req.Limit
	tau := l.Tau()
	w := int64(req.MaxWait)
	inc := l.CostInterval(effCost(req.Cost))
	// level is the bucket's content in nanoseconds of refill: tau − (TAT − now).
	level := tau
	if req.Algorithm == sluice.TokenBucket {
		if st.B != 0 {
			level = min(tau, st.A+max(0, now-st.B))
		}
	} else if st.A > now {
		level = tau - (st.A - now)
	}
	d := sluice.Decision{Limit: l}
	wait := inc - level
	if wait > w {
		d.RetryAfter = dur(wait - w)
		d.Remaining = BucketLeft(l, level)
		d.ResetAfter = dur(tau - level)
		return d, st, nil
	}
	d.Allowed = true
	d.Delay = dur(wait)
	if op == sluice.OpAllow {
		level -= l.CostInterval(req.Cost)
		if req.Algorithm == sluice.TokenBucket {
			st = State{A: level, B: now}
		} else {
			st = State{A: now + tau - level}
		}
	}
	d.Remaining = BucketLeft(l, level)
	d.ResetAfter = dur(tau - level)
	return d, st, nil
}

// GCRAReserve is reserve for GCRA's OpAllow on one key's TAT, for stores
// that keep the TAT in an atomic word (as GCRAAllow): it returns the
// decision and the TAT to store if it is admitted. The caller must have
// validated the request. It agrees exactly with Apply.
func GCRAReserve(tat int64, p *GCRAParams, cost int64, maxWait time.Duration, now int64) (sluice.Decision, int64) {
	inc := p.Interval
	if cost != 1 {
		inc = p.Limit.CostInterval(cost)
	}
	tat = max(tat, now)
	wait := tat + inc - p.Tau - now
	d := sluice.Decision{Limit: p.Limit}
	if wait > int64(maxWait) {
		d.RetryAfter = dur(wait - int64(maxWait))
	} else {
		d.Allowed, d.Delay = true, dur(wait)
		tat += inc
	}
	d.Remaining = BucketLeft(p.Limit, now+p.Tau-tat)
	d.ResetAfter = dur(tat - now)
	return d, tat
}
