package sluice

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// MaxReserveWait bounds Request.MaxWait: a reservation further ahead is
// better answered with a denial and its RetryAfter.
const MaxReserveWait = 24 * time.Hour

// ErrNotReserved means Reservation.Wait was called on a reservation that
// the store denied: there is nothing to wait for.
var ErrNotReserved = errors.New("sluice: reservation was denied")

// Reserves reports whether algorithm a takes Request.MaxWait. GCRA and
// TokenBucket do: their state is a time (the TAT, or the time the bucket is
// full again), which a reservation simply moves into the future, so a
// reservation is exact and a refund gives it back. The window algorithms
// would have to keep counts for future windows, and Concurrency frees slots
// when holders release them, at no time known in advance: they refuse it.
func Reserves(a Algorithm) bool { return a == GCRA || a == TokenBucket }

func validMaxWait(a Algorithm, w time.Duration) error {
	switch {
	case w < 0:
		return fmt.Errorf("%w: max wait %s must not be negative", ErrInvalidRequest, w)
	case w > MaxReserveWait:
		return fmt.Errorf("%w: max wait %s exceeds %s", ErrInvalidRequest, w, MaxReserveWait)
	case !Reserves(a):
		return fmt.Errorf("%w: max wait needs gcra or token_bucket, not %s", ErrInvalidRequest, a)
	}
	return nil
}

// fitsReservation reports whether a reservation of r's cost could ever be
// admitted: on a full bucket, after a wait of at most MaxWait. A cost above
// the burst can be, held until the rest of it has refilled.
func (r *Request) fitsReservation() bool {
	return r.MaxWait > 0 && Reserves(r.Algorithm) &&
		r.Limit.CostInterval(r.Cost) <= r.Limit.Tau()+int64(r.MaxWait)
}

// Reservation is an admission charged against the future: the store
// admitted its requests now, and the caller acts after Decision.Delay. A
// caller that gives up meanwhile calls Cancel (Wait does it when its
// context ends), which refunds the charge so that the capacity returns.
// It is safe for concurrent use.
type Reservation struct {
	// Decision is the combined decision of the requests (see Combine).
	Decision Decision
	// Decisions are the decisions per request, in order.
	Decisions []Decision

	store Store
	reqs  []Request
	sleep func(context.Context, time.Duration) error
	at    int64 // when it was made, on storeNow's clock
	once  sync.Once
	err   error
}

// storeNow reads the clock of store, or of the first store below it
// (through Unwrap() Store methods) that has a Now() int64 method, else
// the system clock: the time Cancel measures the reservation's age on.
func storeNow(store Store) int64 {
	for range 8 {
		if c, ok := store.(interface{ Now() int64 }); ok {
			return c.Now()
		}
		u, ok := store.(interface{ Unwrap() Store })
		if !ok {
			break
		}
		store = u.Unwrap()
	}
	return time.Now().UnixNano()
}

// NewReservation describes requests that store has already admitted with
// decision d (combined), for callers that charge them their own way; set
// Decisions too (one per request), so that Cancel refunds each only what
// no later admission reserved behind it (Request.ReservedAhead). sleep
// waits for a duration or until the context is done; nil means a timer.
func NewReservation(store Store, reqs []Request, d Decision, sleep func(context.Context, time.Duration) error) *Reservation {
	if sleep == nil {
		sleep = Sleep
	}
	return &Reservation{Decision: d, store: store, reqs: reqs, sleep: sleep, at: storeNow(store)}
}

// ReserveAll applies OpAllow to reqs as one atomic step, all or nothing,
// each request admitted if it would be within its own MaxWait, and returns
// the reservation. The caller checks r.Decision.Allowed; an admitted
// reservation's Delay is the longest of its members'.
func ReserveAll(ctx context.Context, store Store, reqs []Request) (*Reservation, error) {
	ds, err := store.ApplyAll(ctx, OpAllow, reqs)
	if err != nil {
		return nil, err
	}
	r := NewReservation(store, reqs, Combine(ds), nil)
	r.Decisions = ds
	return r, nil
}

// Reserve admits an event of the given cost for key if it would be
// admitted within maxWait, charging it now, and returns the reservation:
// act after r.Decision.Delay (r.Wait sleeps it), or Cancel. A request
// beyond maxWait is denied as AllowN denies it, its RetryAfter the time
// until it would fit within maxWait. The Limiter's algorithm must be GCRA
// or TokenBucket.
func (l *Limiter) Reserve(ctx context.Context, key string, cost int64, maxWait time.Duration) (*Reservation, error) {
	req := l.Request(key, cost)
	req.MaxWait = maxWait
	d, err := l.store.Apply(ctx, OpAllow, req)
	if err != nil {
		return nil, err
	}
	r := NewReservation(l.store, []Request{req}, d, l.sleep)
	r.Decisions = []Decision{d}
	return r, nil
}

// Wait sleeps the reservation's Delay. If ctx ends first, it cancels the
// reservation (refunding it) and returns an error wrapping ctx's; the
// caller must then not act. It fails with ErrNotReserved when the store
// denied the reservation.
func (r *Reservation) Wait(ctx context.Context) error {
	if !r.Decision.Allowed {
		return ErrNotReserved
	}
	if r.Decision.Delay <= 0 {
		return nil
	}
	if err := r.sleep(ctx, r.Decision.Delay); err != nil {
		if cerr := r.Cancel(ctx); cerr != nil {
			return fmt.Errorf("sluice: reservation abandoned (%w); refund failed: %w", err, cerr)
		}
		return fmt.Errorf("sluice: reservation abandoned: %w", err)
	}
	return nil
}

// refundTimeout bounds a Cancel whose caller's context has ended.
const refundTimeout = 5 * time.Second

// maxReservedAhead bounds Request.ReservedAhead: a reservation's state
// reaches at most a burst's refill (at most 16 maxPeriods, Limit.Validate)
// plus MaxReserveWait ahead.
const maxReservedAhead = MaxReserveWait + maxPeriod*16

// refundSlack is how much further ahead Cancel takes a reservation's state
// to reach than measured: at most this much refill comes back beyond what
// no later admission reserved.
const refundSlack = time.Millisecond

// Cancel gives the reservation's charge back, once: later calls return the
// first one's result. It runs even when ctx has ended (the caller that
// gave up is the usual reason to cancel), bounded by a few seconds. A
// denied reservation charged nothing and has nothing to give back. With
// Decisions set, a reservation that later ones queue behind gives back
// only what they did not reserve (Request.ReservedAhead): they keep their
// times, and a whole refund would hand its slot to a newcomer at the
// queue's end beside them.
func (r *Reservation) Cancel(ctx context.Context) error {
	if !r.Decision.Allowed {
		return nil
	}
	r.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), refundTimeout)
		defer cancel()
		since := time.Duration(storeNow(r.store) - r.at)
		reqs := make([]Request, len(r.reqs))
		for i, q := range r.reqs {
			q.MaxWait = 0
			if i < len(r.Decisions) && r.Decisions[i].Allowed && Reserves(q.Algorithm) {
				// refundSlack more for a store whose own clock (Redis
				// TIME) differs from the one measured by a round trip's
				// jitter. At least 1ns: a reservation past its time keeps
				// what was reserved behind it all the same.
				q.ReservedAhead = min(max(r.Decisions[i].ResetAfter-since+refundSlack, 1), maxReservedAhead)
			}
			reqs[i] = q
		}
		if len(reqs) == 1 {
			_, r.err = r.store.Apply(ctx, OpRefund, reqs[0])
		} else {
			_, r.err = r.store.ApplyAll(ctx, OpRefund, reqs)
		}
		if r.err != nil {
			r.err = fmt.Errorf("sluice: refund reservation: %w", r.err)
		}
	})
	return r.err
}

// Sleep waits for d or until ctx is done, returning ctx's error then. It
// is the default sleep of Limiter.Wait and Reservation.Wait.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
