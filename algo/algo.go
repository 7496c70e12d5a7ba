// Package algo holds sluice's rate-limit algorithms as pure functions:
// (state, request, now) → (decision, new state). Stores keep the state and
// supply the time; the memory store calls these functions directly, and the
// Redis store's Lua scripts mirror them line for line.
//
// All arithmetic is in integer nanoseconds, with products taken in 128 bits,
// so nothing drifts: a limiter run for a simulated year admits what the
// limit says, to within one event.
package algo

import (
	"fmt"
	"math"
	"math/bits"
	"time"

	"github.com/sluice-io/sluice"
)

// Lease is one Concurrency holder.
type Lease struct {
	// ID names the holder.
	ID string
	// Cost is the number of slots the holder takes.
	Cost int64
	// Expiry is when the lease lapses, in Unix nanoseconds.
	Expiry int64
}

// State is one key's state. The zero State is a key never seen, or reset.
// Which fields are used depends on the algorithm:
//
//	GCRA                  A = theoretical arrival time (TAT)
//	TokenBucket           A = level, in nanoseconds of refill; B = last refill
//	FixedWindow           A = window start (calendar or epoch-aligned); B = count
//	SlidingWindowCounter  A = current window start; B = its count; C = previous window's count
//	SlidingWindowLog      Log = the admitted units, one Run per instant (per slot with a Granularity), ascending
//	Concurrency           Leases
//
// Apply never modifies the slices of the State it is given, so a caller may
// keep the old State to roll back.
type State struct {
	A, B, C int64
	Log     []Run
	Leases  []Lease
}

// Run is N units of a SlidingWindowLog admitted at one instant, as the
// Redis script keeps them ("T*N"): a cost of N takes one Run, not N
// entries, so a key's log takes one Run per distinct instant, at most
// Rate of them, or, with a Limit.Granularity g, one per g-long slot, at
// most Period/g + 1 of them.
type Run struct {
	// At is when the units were admitted, in Unix nanoseconds.
	At int64
	// N is how many units; at least 1.
	N int64
}

// IsZero reports whether s holds nothing, so that a store may drop it.
func (s *State) IsZero() bool {
	return s.A == 0 && s.B == 0 && s.C == 0 && len(s.Log) == 0 && len(s.Leases) == 0
}

// Apply runs op for req on st at time now (Unix nanoseconds). It returns
// the decision and the new state, and an error only for an invalid request
// (see sluice.Request.Validate), in which case the state is unchanged.
//
// For OpAllow and OpPeek the decision's Allowed and RetryAfter are those of
// req.Cost, or of a cost of 1 when req.Cost is zero.
func Apply(op sluice.Op, st State, req sluice.Request, now int64) (sluice.Decision, State, error) {
	if err := req.Validate(op); err != nil {
		return sluice.Decision{}, st, err
	}
	if op == sluice.OpReset {
		return sluice.Decision{Allowed: true, Limit: req.Limit, Remaining: req.Capacity()}, State{}, nil
	}
	if req.MaxWait > 0 && (op == sluice.OpAllow || op == sluice.OpPeek) {
		return reserve(op, st, req, now) // reserve.go
	}
	switch req.Algorithm {
	case sluice.GCRA:
		return gcra(op, st, req, now)
	case sluice.TokenBucket:
		return tokenBucket(op, st, req, now)
	case sluice.FixedWindow:
		return fixedWindow(op, st, req, now)
	case sluice.SlidingWindowCounter:
		return slidingCounter(op, st, req, now)
	case sluice.SlidingWindowLog:
		return slidingLog(op, st, req, now)
	case sluice.Concurrency:
		return concurrency(op, st, req, now)
	}
	return sluice.Decision{}, st, fmt.Errorf("algo: %w: %d", sluice.ErrUnknownAlgorithm, req.Algorithm)
}

// Expiry returns when st is no longer worth keeping for req's algorithm:
// the time at which it would read as a fresh key. Stores use it as a TTL.
func Expiry(st *State, req *sluice.Request) int64 {
	p := int64(req.Limit.Period)
	switch req.Algorithm {
	case sluice.GCRA:
		return st.A
	case sluice.TokenBucket:
		return st.B + max(0, req.Limit.Tau()-st.A)
	case sluice.FixedWindow:
		if !req.Limit.Calendar.IsZero() {
			_, end := windowOf(req.Limit, st.A)
			return end
		}
		return st.A + p
	case sluice.SlidingWindowCounter:
		if st.B > 0 {
			return st.A + 2*p
		}
		return st.A + p
	case sluice.SlidingWindowLog:
		if n := len(st.Log); n > 0 {
			return st.Log[n-1].At + p
		}
	case sluice.Concurrency:
		var last int64
		for _, l := range st.Leases {
			last = max(last, l.Expiry)
		}
		return last
	}
	return 0
}

func effCost(c int64) int64 { return max(c, 1) }

// refundable is how much of back (nanoseconds of refill) a GCRA or
// TokenBucket refund gives back when the key's state reaches ahead
// nanoseconds past now: all of it, unless req refunds a reservation
// (Request.ReservedAhead) behind which later admissions reserved more;
// that much is kept, as golang.org/x/time/rate's Reservation.Cancel does.
// The Redis scripts compute the same.
func refundable(req *sluice.Request, back, ahead int64) int64 {
	if req.ReservedAhead <= 0 {
		return back
	}
	if later := ahead - int64(req.ReservedAhead); later > 0 {
		return max(0, back-later)
	}
	return back
}

// BucketLeft is what a GCRA or token bucket level of ns nanoseconds of
// refill holds: CostsIn, at most the burst. A full bucket's level is
// sluice.Limit.Tau, the burst × the interval rounded up, which for a large
// burst reads a few events over it.
func BucketLeft(l sluice.Limit, ns int64) int64 {
	return min(CostsIn(l, ns), l.Capacity())
}

// CostsIn is how many events fit in ns nanoseconds of refill:
// floor(ns·Rate/Period), exact in 128 bits, rounded towards -∞. Stores that
// compute decisions outside Apply use it to agree with Apply exactly.
func CostsIn(l sluice.Limit, ns int64) int64 {
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
	if q > math.MaxInt64 { // below 2^64, but past an int64
		if neg {
			return math.MinInt64
		}
		return math.MaxInt64
	}
	if neg {
		if r != 0 {
			q++ // at most 2^63, whose negation is MinInt64
		}
		return -int64(q)
	}
	return int64(q)
}

// mulLE reports whether a·b ≤ c·d for non-negative operands, in 128 bits.
func mulLE(a, b, c, d int64) bool {
	h1, l1 := bits.Mul64(uint64(a), uint64(b))
	h2, l2 := bits.Mul64(uint64(c), uint64(d))
	return h1 < h2 || (h1 == h2 && l1 <= l2)
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

// MulDivCeil returns ceil(a·b/c) for non-negative operands, saturating.
func MulDivCeil(a, b, c int64) int64 {
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

func dur(ns int64) time.Duration { return time.Duration(max(ns, 0)) }

// gcra: the key's TAT is when its bucket would be full again; a request of
// cost c is admitted when TAT+interval(c)-tau ≤ now, tau being the time a
// full burst takes to refill.
func gcra(op sluice.Op, st State, req sluice.Request, now int64) (sluice.Decision, State, error) {
	l := req.Limit
	tau := l.Tau()
	tat := max(st.A, now)
	d := sluice.Decision{Limit: l}
	switch op {
	case sluice.OpAllow, sluice.OpPeek:
		inc := l.CostInterval(effCost(req.Cost))
		allowAt := tat + inc - tau
		if allowAt > now {
			d.RetryAfter = dur(allowAt - now)
			d.Remaining = max(0, BucketLeft(l, now+tau-tat))
			d.ResetAfter = dur(tat - now)
			return d, st, nil
		}
		d.Allowed = true
		if op == sluice.OpAllow {
			tat += l.CostInterval(req.Cost)
			st.A = tat
		}
	case sluice.OpRefund:
		tat = max(tat-refundable(&req, l.CostInterval(req.Cost), tat-now), now)
		st.A = tat
		d.Allowed = true
	case sluice.OpCharge:
		tat = ahead(tat, l.CostInterval(req.Cost), now)
		st.A = tat
		d.Allowed = true
	}
	if st.A <= now {
		st.A = 0
	}
	d.Remaining = BucketLeft(l, now+tau-tat)
	d.ResetAfter = dur(tat - now)
	return d, st, nil
}

// tokenBucket keeps the level in nanoseconds of refill: a full bucket holds
// tau, one event takes interval(1). It gives the same answers as gcra.
func tokenBucket(op sluice.Op, st State, req sluice.Request, now int64) (sluice.Decision, State, error) {
	l := req.Limit
	tau := l.Tau()
	level := tau
	if st.B != 0 {
		level = min(tau, st.A+max(0, now-st.B))
	}
	d := sluice.Decision{Limit: l}
	switch op {
	case sluice.OpAllow, sluice.OpPeek:
		inc := l.CostInterval(effCost(req.Cost))
		if level < inc {
			d.RetryAfter = dur(inc - level)
			d.Remaining = max(0, BucketLeft(l, level))
			d.ResetAfter = dur(tau - level)
			return d, st, nil
		}
		d.Allowed = true
		if op == sluice.OpAllow {
			level -= l.CostInterval(req.Cost)
		}
	case sluice.OpRefund:
		level += min(refundable(&req, l.CostInterval(req.Cost), tau-level), tau-level)
		d.Allowed = true
	case sluice.OpCharge:
		level = tau - (ahead(now+tau-level, l.CostInterval(req.Cost), now) - now)
		d.Allowed = true
	}
	if op != sluice.OpPeek {
		st.A, st.B = level, now
		if level >= tau {
			st = State{}
		}
	}
	d.Remaining = BucketLeft(l, level)
	d.ResetAfter = dur(tau - level)
	return d, st, nil
}

// fixedWindow counts per window of Period aligned to the Unix epoch, or
// per calendar window for a calendar limit.
func fixedWindow(op sluice.Op, st State, req sluice.Request, now int64) (sluice.Decision, State, error) {
	l := req.Limit
	ws, we := windowOf(l, now)
	count := int64(0)
	if st.A == ws {
		count = st.B
	}
	d := sluice.Decision{Limit: l}
	switch op {
	case sluice.OpAllow, sluice.OpPeek:
		if count+effCost(req.Cost) > l.Rate {
			d.RetryAfter = dur(we - now)
			d.Remaining = max(0, l.Rate-count)
			d.ResetAfter = dur(we - now)
			return d, st, nil
		}
		d.Allowed = true
		if op == sluice.OpAllow {
			count += req.Cost
		}
	case sluice.OpRefund:
		d.Allowed = true
		if !SameWindow(&req, ws, we, now) {
			// The charge was taken from a window that has ended: giving
			// it back here would free this window's capacity.
			d.Remaining = l.Rate - count
			if count > 0 {
				d.ResetAfter = dur(we - now)
			}
			return d, st, nil
		}
		count = max(0, count-req.Cost)
	case sluice.OpCharge:
		count = addCount(count, req.Cost)
		d.Allowed = true
	}
	if op != sluice.OpPeek {
		st = State{A: ws, B: count}
		if count == 0 {
			st = State{}
		}
	}
	d.Remaining = l.Rate - count
	if count > 0 {
		d.ResetAfter = dur(we - now)
	}
	return d, st, nil
}

// SameWindow reports whether a fixed window's refund, applied at now in
// the window [ws, we), undoes a charge taken in that window. The refund
// names its charge's window by Request.ReservedAhead: the window ends at
// now + ReservedAhead, as the caller estimates it (the charge's
// Decision.ResetAfter less the time since). Windows are aligned, so the
// estimate need only be nearer to this window's end than to its start:
// the charge was in this window when now + ReservedAhead lies past the
// window's middle. A zero ReservedAhead names no window: the refund goes
// to the current one (the behaviour before refunds named windows).
func SameWindow(req *sluice.Request, ws, we, now int64) bool {
	if req.ReservedAhead <= 0 {
		return true
	}
	return now-ws+int64(req.ReservedAhead) > (we-ws)/2
}

// slidingCounter estimates the events in the last Period as the current
// fixed window's count plus the previous one's, weighted by how much of it
// the sliding window still covers: prev·(P−e)/P + curr, e being the time
// elapsed in the current window. Compared in 128-bit integers.
func slidingCounter(op sluice.Op, st State, req sluice.Request, now int64) (sluice.Decision, State, error) {
	l := req.Limit
	p := int64(l.Period)
	ws := now - now%p
	e := now - ws
	var curr, prev int64
	switch st.A {
	case ws:
		curr, prev = st.B, st.C
	case ws - p:
		prev = st.B
	}
	// remaining is floor(Rate − prev·(P−e)/P) − curr.
	remaining := func(curr int64) int64 { return l.Rate - MulDivCeil(prev, p-e, p) - curr }
	d := sluice.Decision{Limit: l}
	switch op {
	case sluice.OpAllow, sluice.OpPeek:
		need := curr + effCost(req.Cost)
		// allowed iff prev·(P−e) + need·P ≤ Rate·P
		if need > l.Rate || !mulLE(prev, p-e, l.Rate-need, p) {
			d.RetryAfter = dur(SlidingRetry(l.Rate, p, e, prev, curr, effCost(req.Cost)))
			d.Remaining = max(0, remaining(curr))
			d.ResetAfter = dur(SlidingReset(p, e, prev, curr))
			return d, st, nil
		}
		d.Allowed = true
		if op == sluice.OpAllow {
			curr += req.Cost
		}
	case sluice.OpRefund:
		curr = max(0, curr-req.Cost)
		d.Allowed = true
	case sluice.OpCharge:
		curr = addCount(curr, req.Cost)
		d.Allowed = true
	}
	if op != sluice.OpPeek {
		st = State{A: ws, B: curr, C: prev}
		if curr == 0 && prev == 0 {
			st = State{}
		}
	}
	d.Remaining = remaining(curr)
	d.ResetAfter = dur(SlidingReset(p, e, prev, curr))
	return d, st, nil
}

// SlidingRetry is the sliding window counter's exact wait until a request
// of cost fits, e nanoseconds into a window of p with counts prev and curr.
func SlidingRetry(rate, p, e, prev, curr, cost int64) int64 {
	if need := curr + cost; need <= rate && prev > 0 {
		// smallest e' with prev·(P−e') ≤ (rate−need)·P
		x := p - mulDiv(rate-need, p, prev)
		if x < p {
			return x - e
		}
	}
	// In the next window the current count becomes the previous one.
	x := int64(0)
	if curr > 0 {
		x = p - mulDiv(rate-cost, p, curr)
	}
	return p - e + x
}

// SlidingReset is the sliding window counter's time until it is empty, e
// nanoseconds into a window of p with counts prev and curr.
func SlidingReset(p, e, prev, curr int64) int64 {
	switch {
	case curr > 0:
		return 2*p - e
	case prev > 0:
		return p - e
	}
	return 0
}

// slidingLog keeps the admitted units in runs, one per instant; a unit
// counts while its instant+Period > now. At most Rate units are kept. With
// a Granularity the instant is the admission time rounded up to it
// (SlotEnd), so the admissions of one slot share a run. A refund takes
// the newest units, or with req.AdmittedAgo the newest stamped at or
// before RefundBound.
func slidingLog(op sluice.Op, st State, req sluice.Request, now int64) (sluice.Decision, State, error) {
	l := req.Limit
	p := int64(l.Period)
	log := st.Log
	i := 0
	for i < len(log) && log[i].At+p <= now {
		i++
	}
	log = log[i:]
	n := units(log)
	d := sluice.Decision{Limit: l}
	switch op {
	case sluice.OpAllow, sluice.OpPeek:
		c := effCost(req.Cost)
		if n+c > l.Rate {
			d.RetryAfter = dur(unitAt(log, n+c-l.Rate) + p - now)
			d.Remaining = max(0, l.Rate-n)
			d.ResetAfter = dur(log[len(log)-1].At + p - now)
			return d, st, nil
		}
		d.Allowed = true
		if op == sluice.OpAllow {
			log = appendRun(log, SlotEnd(now, l.Granularity), req.Cost, l.Rate)
		}
	case sluice.OpRefund:
		if req.AdmittedAgo > 0 {
			log = dropUpTo(log, RefundBound(now, &req), req.Cost)
		} else {
			log = dropNewest(log, req.Cost)
		}
		d.Allowed = true
	case sluice.OpCharge:
		log = appendRun(log, SlotEnd(now, l.Granularity), req.Cost, l.Rate)
		d.Allowed = true
	}
	if op != sluice.OpPeek {
		st = State{Log: log}
		if len(log) == 0 {
			st = State{}
		}
	}
	d.Remaining = l.Rate - units(log)
	if len(log) > 0 {
		d.ResetAfter = dur(log[len(log)-1].At + p - now)
	}
	return d, st, nil
}

// units is the number of units in log.
func units(log []Run) int64 {
	var n int64
	for _, r := range log {
		n += r.N
	}
	return n
}

// unitAt is the instant of the k-th oldest unit in log (k ≥ 1).
func unitAt(log []Run, k int64) int64 {
	for _, r := range log {
		if k <= r.N {
			return r.At
		}
		k -= r.N
	}
	return math.MaxInt64
}

// SlotEnd is the instant a SlidingWindowLog with granularity g stamps an
// admission at now (Unix ns): now rounded up to a multiple of g since the
// Unix epoch, the end of the g-long slot that holds it; now itself when g
// is zero.
func SlotEnd(now int64, g time.Duration) int64 {
	if g <= 0 {
		return now
	}
	r := now % int64(g)
	switch {
	case r > 0:
		if now > math.MaxInt64-(int64(g)-r) {
			return math.MaxInt64
		}
		return now + int64(g) - r
	case r < 0: // before the epoch, truncation already rounds up
		return now - r
	}
	return now
}

// appendRun returns a new log: log with n units at t, keeping at most
// limit units (the newest). Units stamped no later than the newest run
// join it, so the log stays ascending when the clock steps back or the
// granularity changes, counting them the longer, as the Redis script does.
func appendRun(log []Run, t, n, limit int64) []Run {
	n = min(n, limit)
	out := make([]Run, 0, len(log)+1)
	out = append(out, log...)
	if k := len(out); k > 0 && out[k-1].At >= t {
		out[k-1].N += n
	} else {
		out = append(out, Run{At: t, N: n})
	}
	over := units(out) - limit
	drop := 0
	for over > 0 {
		if out[drop].N <= over {
			over -= out[drop].N
			drop++
			continue
		}
		out[drop].N -= over
		over = 0
	}
	return out[drop:]
}

// dropNewest returns a new log without its n newest units.
func dropNewest(log []Run, n int64) []Run {
	out := append([]Run(nil), log...)
	for n > 0 && len(out) > 0 {
		last := &out[len(out)-1]
		if last.N > n {
			last.N -= n
			break
		}
		n -= last.N
		out = out[:len(out)-1]
	}
	return out
}

// RefundBound is the newest stamp a SlidingWindowLog refund with a
// positive req.AdmittedAgo takes units from, at now (Unix ns): now −
// AdmittedAgo rounded up to its slot's end (SlotEnd). An AdmittedAgo past
// Period + Granularity is taken as that much, which already reaches
// behind every unit the log still counts, so that the bound stays far
// from overflowing.
func RefundBound(now int64, req *sluice.Request) int64 {
	a := min(int64(req.AdmittedAgo), MaxAdmittedAgo(req.Limit))
	return SlotEnd(now-a, req.Limit.Granularity)
}

// MaxAdmittedAgo is the AdmittedAgo from which a refund of a log under
// limit l finds no unit it still counts: Period + Granularity. Stores
// cap it there.
func MaxAdmittedAgo(l sluice.Limit) int64 { return int64(l.Period) + int64(l.Granularity) }

// dropUpTo returns a new log without the n newest of its units stamped
// at or before t (fewer if it holds fewer); the runs after t stay.
func dropUpTo(log []Run, t, n int64) []Run {
	out := append([]Run(nil), log...)
	j := len(out)
	for j > 0 && out[j-1].At > t {
		j--
	}
	k := j // out[k:j] go; out[k-1] may lose some of its units
	for n > 0 && k > 0 {
		r := &out[k-1]
		if r.N > n {
			r.N -= n
			break
		}
		n -= r.N
		k--
	}
	return append(out[:k], out[j:]...)
}

// concurrency holds up to Rate slots in leases that lapse after Period.
func concurrency(op sluice.Op, st State, req sluice.Request, now int64) (sluice.Decision, State, error) {
	l := req.Limit
	leases := make([]Lease, 0, len(st.Leases)+1)
	var used int64
	held := -1
	for _, ls := range st.Leases {
		if ls.Expiry > now {
			if ls.ID == req.Lease {
				held = len(leases)
			}
			leases = append(leases, ls)
			used = addCount(used, ls.Cost)
		}
	}
	d := sluice.Decision{Limit: l}
	switch op {
	case sluice.OpAllow, sluice.OpPeek:
		c := effCost(req.Cost)
		if held >= 0 {
			c = 0 // renewing a lease takes no new slot
		}
		if used+c > l.Rate {
			d.RetryAfter = dur(leaseRetry(leases, used+c-l.Rate) - now)
			d.Remaining = max(0, l.Rate-used)
			d.ResetAfter = dur(Expiry(&State{Leases: leases}, &req) - now)
			return d, st, nil
		}
		d.Allowed = true
		if op == sluice.OpAllow {
			exp := now + int64(l.Period)
			if held >= 0 {
				leases[held].Expiry = exp
			} else {
				leases = append(leases, Lease{ID: req.Lease, Cost: req.Cost, Expiry: exp})
				used = addCount(used, req.Cost)
			}
		}
	case sluice.OpRefund:
		if held < 0 {
			// not held: released already, or lapsed; nothing to give back
			d.Remaining = l.Rate - used
			d.ResetAfter = dur(Expiry(&State{Leases: leases}, &req) - now)
			return d, st, nil
		}
		leases = append(leases[:held], leases[held+1:]...)
		used = 0
		for _, ls := range leases {
			used = addCount(used, ls.Cost)
		}
		d.Allowed = true
	case sluice.OpTake:
		// The lease is set to what is free besides it, up to the cost, as
		// concurrency.lua does; nothing free releases it.
		others := used
		if held >= 0 {
			others = used - leases[held].Cost
			leases = append(leases[:held], leases[held+1:]...)
		}
		n := min(req.Cost, MaxCount, max(0, l.Rate-others))
		used = others
		if n > 0 {
			leases = append(leases, Lease{ID: req.Lease, Cost: n, Expiry: now + int64(l.Period)})
			used = addCount(used, n)
			d.Allowed = true
		} else {
			d.RetryAfter = dur(leaseRetry(leases, others+1-l.Rate) - now)
		}
		d.Taken = n
	case sluice.OpCharge:
		// A held lease takes the charge and is renewed, as concurrency.lua
		// does: one lease per holder, however often it is charged.
		exp := now + int64(l.Period)
		if held >= 0 {
			leases[held].Cost = addCount(leases[held].Cost, req.Cost)
			leases[held].Expiry = exp
		} else {
			leases = append(leases, Lease{ID: req.Lease, Cost: min(req.Cost, MaxCount), Expiry: exp})
		}
		used = addCount(used, req.Cost)
		d.Allowed = true
	}
	if op != sluice.OpPeek {
		st = State{Leases: leases}
		if len(leases) == 0 {
			st = State{}
		}
	}
	d.Remaining = l.Rate - used
	d.ResetAfter = dur(Expiry(&State{Leases: leases}, &req) - now)
	return d, st, nil
}

// leaseRetry returns when enough leases have lapsed to free need slots.
func leaseRetry(leases []Lease, need int64) int64 {
	exps := make([]Lease, len(leases))
	copy(exps, leases)
	// insertion sort by expiry: a key holds at most Rate leases
	for i := 1; i < len(exps); i++ {
		for j := i; j > 0 && exps[j].Expiry < exps[j-1].Expiry; j-- {
			exps[j], exps[j-1] = exps[j-1], exps[j]
		}
	}
	var freed int64
	for _, ls := range exps {
		freed += ls.Cost
		if freed >= need {
			return ls.Expiry
		}
	}
	return math.MaxInt64
}
