package redisstore

import (
	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
)

// Reservations (sluice.Request.MaxWait) need no script of their own. A
// GCRA request admitted within a wait w is one admitted by GCRA with the
// tolerance tau + w, charged the same; so the scripts, fast and batch
// alike, are sent tau + w as tau, and decide in the same atomic step, on
// Redis TIME, what they decide for any request. The token bucket scripts
// then report the level plus w (its level is tau − (full − now)), and a
// key written by a reservation holds the same time as any other. Only the
// Decision differs: its Delay, and a Remaining that is negative by what is
// reserved ahead (see algo's reserve, which these numbers agree with).

// reserveTau is the tau sent to the scripts for a GCRA or TokenBucket
// request: the burst's refill time, plus the request's MaxWait.
func reserveTau(req *sluice.Request) int64 {
	return req.Limit.Tau() + int64(req.MaxWait)
}

// decideOp builds op's Decision for req from the script's reply.
func decideOp(op sluice.Op, req *sluice.Request, r reply) sluice.Decision {
	if op == sluice.OpTake {
		return decideTake(req, r)
	}
	if req.MaxWait <= 0 || (op != sluice.OpAllow && op != sluice.OpPeek) {
		return decide(req, r)
	}
	l := req.Limit
	tau := l.Tau()
	w := int64(req.MaxWait)
	// level is the bucket's content after the step, in nanoseconds of
	// refill: tau − (TAT − now), with the scripts' time at 0.
	level := tau - r.x
	if req.Algorithm == sluice.TokenBucket {
		level = r.x - w
	}
	d := sluice.Decision{Limit: l, Allowed: r.ok, Remaining: algo.BucketLeft(l, level), ResetAfter: dur(tau - level)}
	inc := l.CostInterval(max(req.Cost, 1))
	before := level
	if r.ok && op == sluice.OpAllow {
		before += l.CostInterval(req.Cost)
	}
	if r.ok {
		d.Delay = dur(inc - before)
	} else {
		d.RetryAfter = dur(inc - before - w)
	}
	return d
}

// deniedOp is the op whose numbers a batch script's reply holds: OpPeek
// for an OpAllow batch that was denied, whose members that would have
// been admitted report their state without the charge.
func deniedOp(op sluice.Op, vals []int64) sluice.Op {
	if op != sluice.OpAllow {
		return op
	}
	for i := 0; i < len(vals); i += 4 {
		if vals[i] != 1 {
			return sluice.OpPeek
		}
	}
	return op
}

// decideTake is a take's Decision from concurrency.lua's reply: allowed,
// slots used, the slots taken (or, when none, the retry-after), and the
// reset-after, as package algo computes it.
func decideTake(req *sluice.Request, r reply) sluice.Decision {
	d := sluice.Decision{Limit: req.Limit, Allowed: r.ok, Remaining: req.Limit.Rate - r.x, ResetAfter: dur(r.z)}
	if r.ok {
		d.Taken = r.y
	} else {
		d.RetryAfter = dur(r.y)
	}
	return d
}
