package sluice

import (
	"fmt"
	"time"
)

// Op is an operation a Store applies to a key.
type Op uint8

// The operations of a Store.
const (
	// OpAllow admits and charges Cost if the limit allows it. For
	// Concurrency it acquires the request's lease.
	OpAllow Op = iota + 1
	// OpPeek reports what OpAllow would decide for Cost, changing nothing.
	// A Cost of zero reports the state alone, Allowed if any capacity is left.
	OpPeek
	// OpRefund gives back Cost that was charged but not used, never beyond
	// a full bucket. A SlidingWindowLog gives back its newest units, or
	// with Request.AdmittedAgo units of that admission or older ones. For
	// Concurrency it releases the request's lease, and
	// reports Allowed false when the lease was not held (released already,
	// or lapsed). A refund batch in ApplyAll is all or nothing too: when one
	// of its leases is not held, nothing in the batch is refunded. Keyed by
	// a request id, a lease thus makes settling a request idempotent.
	OpRefund
	// OpCharge charges Cost unconditionally, even past the limit, so that
	// later requests wait it off. It settles usage learnt after the fact,
	// such as LLM tokens counted in a response. A charge of any size is
	// taken, but a key's debt stops at a bound (package algo's MaxAhead,
	// about 36 years, for GCRA and TokenBucket; MaxCount, 2^52, for the
	// counts of the others): far past every limit, and never wrapping.
	OpCharge
	// OpReset forgets the key's state: the next request sees a full limit.
	OpReset
	// OpTake takes up to Cost, as much as is free, instead of all or
	// nothing: Decision.Taken says how much, and Allowed is true when it
	// is more than zero. Only Concurrency takes it, where it sets the
	// request's lease to the slots taken (replacing what the lease held,
	// so a holder that asks again changes its share rather than adding to
	// it) and renews it for Limit.Period; a take of nothing releases the
	// lease. In ApplyAll each request takes on its own, not all or
	// nothing, in order (a key repeated sees the earlier takes), in one
	// atomic step. Cost may exceed Limit.Rate.
	OpTake
)

var opNames = [...]string{OpAllow: "allow", OpPeek: "peek", OpRefund: "refund", OpCharge: "charge", OpReset: "reset", OpTake: "take"}

// String returns the operation's name, such as "allow".
func (o Op) String() string {
	if o >= OpAllow && o <= OpTake {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", o)
}

// Request is one key's part in a Store operation.
type Request struct {
	// Key identifies whose limit this is. Keys that must be charged together
	// in Redis Cluster share a hash tag, such as "{tenant:42}:rpm".
	Key string
	// Algorithm decides how Limit is enforced.
	Algorithm Algorithm
	// Limit is the limit to enforce.
	Limit Limit
	// Cost is how much the request takes: 1 for one event, or a number of
	// tokens. Zero is allowed for OpPeek.
	Cost int64
	// Lease identifies a Concurrency holder, for acquire and release. It is
	// ignored by the other algorithms.
	Lease string
	// UseLease lets a leasing store (package lease) answer the request from
	// capacity it took from its shared store in advance. Other stores
	// ignore it.
	UseLease bool
	// MaxWait makes OpAllow (and OpPeek) a reservation: a request that
	// would be admitted within MaxWait is admitted now and charged against
	// the future, and its Decision.Delay says how long the caller must hold
	// it before acting. Zero means no reservation. Only GCRA and
	// TokenBucket take it (see Reserve); it is at most MaxReserveWait.
	MaxWait time.Duration
	// ReservedAhead makes OpRefund the refund of a reservation (GCRA and
	// TokenBucket): how far ahead of now the key's state reached right
	// after the reservation was admitted (its Decision.ResetAfter, less
	// the time since). Only the part of the cost that no later admission
	// has reserved behind it is given back, so that a cancelled
	// reservation never hands its slot to a newcomer at the end of the
	// queue while the ones between keep theirs. Zero refunds the whole
	// cost. Reservation.Cancel sets it.
	//
	// On FixedWindow it names the window of the charge a refund undoes:
	// the time from now until that window ends, computed the same way
	// (the charge's Decision.ResetAfter, less the time since). The store
	// gives the refund back only when that window is the current one
	// (now + ReservedAhead lies past the current window's middle: windows
	// are aligned, so the estimate may be off by up to half a window) and
	// drops it otherwise, Allowed and changing nothing: a refund that
	// lands after the window turned would free the next window's
	// capacity. Zero gives the refund to the current window.
	ReservedAhead time.Duration
	// AdmittedAgo makes OpRefund on a SlidingWindowLog give units back
	// from the admission they were taken by, or from older ones, never
	// from later ones: it is how long ago the refunded admission was
	// made, at least (the time since the caller sent it, measured on its
	// own clock, so no skew between clocks matters). The store subtracts
	// it from its own time when it applies the refund, so a refund that
	// takes longer on its way to a remote store than the admission took
	// reaches that much later: add a margin for it (such as the store's
	// call timeout) where being exact matters. With it positive,
	// the refund removes up to Cost units from the newest runs stamped at
	// or before T = now − AdmittedAgo, T rounded up to its slot's end when
	// the limit has a Granularity (as admissions are stamped, so T is no
	// later than the refunded admission's stamp); runs stamped after T
	// are never touched. Removing an older unit while a newer one stays
	// makes the log count more than it holds for a while, never less:
	// the zero value's newest-first refund, when later admissions came
	// between, frees their units instead and hands capacity back up to
	// the time between the two stamps too early. When fewer than Cost
	// units are stamped at or before T (some slid out of the window), the
	// refund removes those there are and no more; an AdmittedAgo of
	// Period + Granularity or more thus removes nothing. Zero refunds the
	// newest units. Only OpRefund on SlidingWindowLog takes it; it must
	// not be negative.
	AdmittedAgo time.Duration
}

// Validate checks the request for op. Errors wrap ErrInvalidRequest,
// ErrInvalidLimit, ErrInvalidCost or ErrCostExceedsBurst.
func (r *Request) Validate(op Op) error {
	if r.Key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidRequest)
	}
	if !r.Algorithm.Valid() {
		return fmt.Errorf("%w: key %q: %w", ErrInvalidRequest, r.Key, ErrUnknownAlgorithm)
	}
	if op == OpReset {
		return nil
	}
	if op == OpTake && (r.Algorithm != Concurrency || r.MaxWait != 0) {
		return fmt.Errorf("%w: key %q: take is for the concurrency algorithm without MaxWait, not %s", ErrInvalidRequest, r.Key, r.Algorithm)
	}
	if r.ReservedAhead != 0 && (op != OpRefund || r.ReservedAhead < 0 || r.ReservedAhead > maxReservedAhead) {
		return fmt.Errorf("%w: key %q: reserved ahead %s: only a refund takes it, within [0, %s]", ErrInvalidRequest, r.Key, r.ReservedAhead, maxReservedAhead)
	}
	if r.AdmittedAgo != 0 {
		if err := r.validAdmittedAgo(op); err != nil {
			return err
		}
	}
	if r.MaxWait != 0 {
		if err := validMaxWait(r.Algorithm, r.MaxWait); err != nil {
			return fmt.Errorf("key %q: %w", r.Key, err)
		}
	}
	if err := r.Limit.Validate(); err != nil {
		return fmt.Errorf("key %q: %w", r.Key, err)
	}
	if !r.Limit.Calendar.IsZero() && r.Algorithm != FixedWindow {
		return fmt.Errorf("%w: key %q: a calendar limit (%s) needs the fixed_window algorithm, not %s", ErrInvalidLimit, r.Key, r.Limit, r.Algorithm)
	}
	if r.Limit.Granularity != 0 && r.Algorithm != SlidingWindowLog {
		return fmt.Errorf("%w: key %q: granularity %s is for the sliding_window_log algorithm, not %s", ErrInvalidLimit, r.Key, r.Limit.Granularity, r.Algorithm)
	}
	if r.Cost < 0 || (r.Cost == 0 && op != OpPeek) {
		return fmt.Errorf("%w: %d for key %q", ErrInvalidCost, r.Cost, r.Key)
	}
	if r.Algorithm == Concurrency && r.Lease == "" && (op == OpAllow || op == OpRefund || op == OpTake) {
		return fmt.Errorf("%w: key %q: concurrency needs a lease id", ErrInvalidRequest, r.Key)
	}
	if (op == OpAllow || op == OpPeek) && r.Cost > r.capacity() && !r.fitsReservation() {
		return fmt.Errorf("%w: cost %d, burst %d for key %q", ErrCostExceedsBurst, r.Cost, r.capacity(), r.Key)
	}
	return nil
}

// validAdmittedAgo checks a non-zero AdmittedAgo against the rules its doc
// states. The error wraps ErrInvalidRequest.
func (r *Request) validAdmittedAgo(op Op) error {
	switch {
	case r.AdmittedAgo < 0:
		return fmt.Errorf("%w: key %q: admitted ago %s must not be negative", ErrInvalidRequest, r.Key, r.AdmittedAgo)
	case r.Algorithm != SlidingWindowLog:
		return fmt.Errorf("%w: key %q: admitted ago %s: only a sliding_window_log keeps admission times to refund by, not %s", ErrInvalidRequest, r.Key, r.AdmittedAgo, r.Algorithm)
	case op != OpRefund:
		return fmt.Errorf("%w: key %q: admitted ago %s: only a refund takes it, not %s", ErrInvalidRequest, r.Key, r.AdmittedAgo, op)
	}
	return nil
}

// capacity is what the algorithm can admit at once.
func (r *Request) capacity() int64 {
	switch r.Algorithm {
	case GCRA, TokenBucket:
		return r.Limit.Capacity()
	}
	return r.Limit.Rate
}

// Capacity is how much the request's algorithm can admit at once: the burst
// for GCRA and TokenBucket, Rate for the others.
func (r *Request) Capacity() int64 { return r.capacity() }

// Decision is a store's answer for one key.
//
// For example, with Limit 10/s burst 10 and 10 events just admitted, a
// further request gets Allowed false, Remaining 0, RetryAfter 100ms and
// ResetAfter 1s.
type Decision struct {
	// Allowed reports whether the request was admitted. In a batch that was
	// denied as a whole, it reports whether this limit alone would have
	// admitted it; nothing in the batch was charged.
	Allowed bool
	// Limit is the limit that was applied.
	Limit Limit
	// Remaining is how much more could be admitted right now, after this
	// request. It can be negative after OpCharge, and for a reservation
	// (Request.MaxWait) it is negative by what is reserved ahead. In a
	// batch denied as a whole it is the remainder without this request's
	// charge.
	Remaining int64
	// RetryAfter is zero when Allowed. Otherwise it is the exact wait after
	// which the same request would be admitted, if nothing else happens:
	// a retry at RetryAfter succeeds, one a nanosecond earlier does not.
	RetryAfter time.Duration
	// ResetAfter is the time until the limit is fully available again.
	ResetAfter time.Duration
	// Delay is how long an admitted reservation (Request.MaxWait) must be
	// held before the caller acts on it: zero for a request admitted at
	// once, and for every request without MaxWait.
	Delay time.Duration
	// Taken is what an OpTake took: for Concurrency, the slots the lease
	// now holds, from 0 to the request's Cost. It is zero for the other
	// operations.
	Taken int64
	// Degraded reports that the store could not be asked and a failure
	// policy answered instead.
	Degraded bool
	// Fallback names what answered a Degraded decision: "local",
	// "fail_open" or "fail_closed" (package guard's policies). It is empty
	// when the store answered.
	Fallback string
	// Source says how the decision was made: by the store (the zero
	// value), from a local cache of a denial, or from capacity leased in
	// advance. Degraded decisions have Source FromStore.
	Source Source
}

// Source says how a Decision was made.
type Source uint8

// The sources of a decision.
const (
	// FromStore: the store decided, in one atomic step on the shared state.
	FromStore Source = iota
	// FromLease: decided locally from capacity this instance had already
	// taken (and charged) from the store in a chunk; see package lease.
	// The limit is kept fleet-wide, but Remaining and ResetAfter describe
	// the shared state as of the last chunk fetch, not this instant.
	FromLease
	// FromCache: a denial the store gave recently, answered again without
	// asking the store while its RetryAfter runs. The times count down; a
	// refund or reset by another instance is not seen until it lapses.
	FromCache
	// FromShare: decided in this region from a share of a global key's
	// capacity that the key's home region charged in advance and that this
	// region's store holds; see package region. Every admission is backed
	// by a charge the home store made; Remaining is the share left in this
	// region, ResetAfter the time until the share expires.
	FromShare
)

var sourceNames = [...]string{FromStore: "store", FromLease: "lease", FromCache: "cache", FromShare: "share"}

// String returns the source's name, such as "lease".
func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return fmt.Sprintf("source(%d)", s)
}

// RetryAfterSeconds is RetryAfter in whole seconds, rounded up, as HTTP's
// Retry-After header carries it.
func (d Decision) RetryAfterSeconds() int64 { return CeilSeconds(d.RetryAfter) }

// ResetAfterSeconds is ResetAfter in whole seconds, rounded up.
func (d Decision) ResetAfterSeconds() int64 { return CeilSeconds(d.ResetAfter) }

// CeilSeconds converts d to whole seconds, rounding up: a client told to
// wait that long never comes back too early.
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// CeilMillis converts d to whole milliseconds, rounding up.
func CeilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// Combine folds the decisions of one batch into one: allowed only if all
// are, the longest RetryAfter, ResetAfter and Delay, and the Limit and
// Remaining of the most constrained member; Degraded if any is, with the
// first Fallback named. Its Source is that of the first denied member, or, when all are
// allowed, FromStore if any member is. Combine of no decisions is an
// allowed zero Decision.
func Combine(ds []Decision) Decision {
	if len(ds) == 0 {
		return Decision{Allowed: true}
	}
	out := ds[0]
	for _, d := range ds[1:] {
		switch {
		case out.Allowed && !d.Allowed:
			out.Source = d.Source
		case out.Allowed && d.Source < out.Source:
			out.Source = d.Source
		}
		out.Allowed = out.Allowed && d.Allowed
		out.Degraded = out.Degraded || d.Degraded
		if out.Fallback == "" {
			out.Fallback = d.Fallback
		}
		if d.RetryAfter > out.RetryAfter {
			out.RetryAfter = d.RetryAfter
		}
		if d.ResetAfter > out.ResetAfter {
			out.ResetAfter = d.ResetAfter
		}
		out.Delay = max(out.Delay, d.Delay)
		if d.Remaining < out.Remaining {
			out.Remaining, out.Limit = d.Remaining, d.Limit
		}
	}
	return out
}
