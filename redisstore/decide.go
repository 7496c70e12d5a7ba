package redisstore

import (
	"math"
	"math/bits"
	"time"

	"github.com/sluice-io/sluice"
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
	l := req.Limit
	p := int64(l.Period)
	eff := max(req.Cost, 1)
	d := sluice.Decision{Limit: l, Allowed: r.ok}
	switch req.Algorithm {
	case sluice.GCRA:
		tau := l.CostInterval(l.Capacity())
		tat := r.x
		d.Remaining = costsIn(l, tau-tat)
		d.ResetAfter = dur(tat)
		if !r.ok {
			d.RetryAfter = dur(tat + l.CostInterval(eff) - tau)
			d.Remaining = max(0, d.Remaining)
		}
	case sluice.TokenBucket:
		tau := l.CostInterval(l.Capacity())
		level := r.x
		d.Remaining = costsIn(l, level)
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
		d.Remaining = l.Rate - mulDivCeil(prev, p-e, p) - curr
		d.ResetAfter = dur(slidingReset(p, e, prev, curr))
		if !r.ok {
			d.RetryAfter = dur(slidingRetry(l.Rate, p, e, prev, curr, eff))
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

// The helpers below are package algo's, which keeps them unexported.

func dur(ns int64) time.Duration { return time.Duration(max(ns, 0)) }

// costsIn is floor(ns·Rate/Period), exact in 128 bits, rounded towards -∞.
func costsIn(l sluice.Limit, ns int64) int64 {
	if ns == 0 {
		return 0
	}
	neg := ns < 0
	u := uint64(ns)
	if neg {
		u = uint64(-ns)
	}
	hi, lo := bits.Mul64(u, uint64(l.Rate))
	if hi >= uint64(l.Period) {
		if neg {
			return math.MinInt64
		}
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, uint64(l.Period))
	if neg {
		if r != 0 {
			q++
		}
		return -int64(q)
	}
	return int64(q)
}

// mulDiv returns floor(a·b/c) for non-negative operands, saturating.
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(min(q, math.MaxInt64))
}

// mulDivCeil returns ceil(a·b/c) for non-negative operands, saturating.
func mulDivCeil(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, uint64(c))
	if r != 0 {
		q++
	}
	return int64(min(q, math.MaxInt64))
}

// slidingRetry is the exact wait until a request of cost fits.
func slidingRetry(rate, p, e, prev, curr, cost int64) int64 {
	if need := curr + cost; need <= rate && prev > 0 {
		x := p - mulDiv(rate-need, p, prev)
		if x < p {
			return x - e
		}
	}
	x := int64(0)
	if curr > 0 {
		x = p - mulDiv(rate-cost, p, curr)
	}
	return p - e + x
}

func slidingReset(p, e, prev, curr int64) int64 {
	switch {
	case curr > 0:
		return 2*p - e
	case prev > 0:
		return p - e
	}
	return 0
}
