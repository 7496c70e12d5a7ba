package sluice

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// ErrWaitTooLong means Wait gave up at once because admission would come
// after the context's deadline.
var ErrWaitTooLong = errors.New("sluice: wait would exceed the context deadline")

// Options configure a Limiter. Store and Limit are required.
type Options struct {
	// Store keeps the state, for example memstore.New or redisstore.New.
	Store Store
	// Limit is the limit to enforce per key.
	Limit Limit
	// Algorithm defaults to GCRA, or to FixedWindow for a calendar Limit
	// (the only algorithm that enforces one).
	Algorithm Algorithm
	// Prefix is put before every key, to keep limiters that share a store
	// apart, for example "api:".
	Prefix string
	// Sleep waits for d or until ctx is done. Wait uses it; it defaults to a
	// timer. Tests pass one that advances a fake clock.
	Sleep func(ctx context.Context, d time.Duration) error
}

// Limiter enforces one Limit per key on a Store. It is safe for concurrent use.
type Limiter struct {
	store  Store
	limit  Limit
	algo   Algorithm
	prefix string
	sleep  func(context.Context, time.Duration) error
}

// NewLimiter validates opts and returns a Limiter.
func NewLimiter(opts Options) (*Limiter, error) {
	if opts.Store == nil {
		return nil, errors.New("sluice: Options.Store is required")
	}
	if opts.Algorithm == 0 {
		opts.Algorithm = GCRA
		if !opts.Limit.Calendar.IsZero() {
			opts.Algorithm = FixedWindow
		}
	}
	if !opts.Algorithm.Valid() {
		return nil, fmt.Errorf("sluice: %w: %d", ErrUnknownAlgorithm, opts.Algorithm)
	}
	if err := opts.Limit.Validate(); err != nil {
		return nil, err
	}
	if !opts.Limit.Calendar.IsZero() && opts.Algorithm != FixedWindow {
		return nil, fmt.Errorf("sluice: %w: a calendar limit needs the fixed_window algorithm, not %s", ErrInvalidLimit, opts.Algorithm)
	}
	if opts.Sleep == nil {
		opts.Sleep = Sleep
	}
	return &Limiter{store: opts.Store, limit: opts.Limit, algo: opts.Algorithm, prefix: opts.Prefix, sleep: opts.Sleep}, nil
}

// Limit returns the limit the Limiter enforces.
func (l *Limiter) Limit() Limit { return l.limit }

// Algorithm returns the algorithm the Limiter applies.
func (l *Limiter) Algorithm() Algorithm { return l.algo }

// Request returns the store request the Limiter makes for key and cost,
// for use with AllowAll.
func (l *Limiter) Request(key string, cost int64) Request {
	return Request{Key: l.prefix + key, Algorithm: l.algo, Limit: l.limit, Cost: cost}
}

// Allow admits one event for key if the limit allows it.
func (l *Limiter) Allow(ctx context.Context, key string) (Decision, error) {
	return l.store.Apply(ctx, OpAllow, l.Request(key, 1))
}

// AllowN admits an event of the given cost for key if the limit allows it.
// A cost above the burst fails with ErrCostExceedsBurst.
func (l *Limiter) AllowN(ctx context.Context, key string, cost int64) (Decision, error) {
	return l.store.Apply(ctx, OpAllow, l.Request(key, cost))
}

// Peek reports the state of key without consuming anything: whether an
// event of the given cost would be admitted now, and how much remains.
func (l *Limiter) Peek(ctx context.Context, key string, cost int64) (Decision, error) {
	return l.store.Apply(ctx, OpPeek, l.Request(key, cost))
}

// Refund gives back cost that was charged for key but not used.
func (l *Limiter) Refund(ctx context.Context, key string, cost int64) (Decision, error) {
	return l.store.Apply(ctx, OpRefund, l.Request(key, cost))
}

// Charge charges cost for key unconditionally, also beyond the limit. It
// settles usage known only afterwards.
func (l *Limiter) Charge(ctx context.Context, key string, cost int64) (Decision, error) {
	return l.store.Apply(ctx, OpCharge, l.Request(key, cost))
}

// Reset forgets key's state.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	_, err := l.store.Apply(ctx, OpReset, l.Request(key, 0))
	return err
}

// Wait blocks until an event of the given cost is admitted for key, then
// returns its decision. It sleeps for exactly the RetryAfter the store
// reports rather than polling. It fails at once with ErrCostExceedsBurst when
// cost can never be admitted, and with ErrWaitTooLong when admission would
// come after ctx's deadline.
func (l *Limiter) Wait(ctx context.Context, key string, cost int64) (Decision, error) {
	for {
		d, err := l.AllowN(ctx, key, cost)
		if err != nil || d.Allowed {
			return d, err
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < d.RetryAfter {
			return d, fmt.Errorf("%w: key %q needs %s", ErrWaitTooLong, key, d.RetryAfter)
		}
		if err := l.sleep(ctx, d.RetryAfter); err != nil {
			return d, fmt.Errorf("sluice: wait for key %q: %w", key, err)
		}
	}
}

// Lease is a held Concurrency slot.
type Lease struct {
	// ID identifies the lease in the store.
	ID string
	// Key is the key the lease was taken on.
	Key string
}

// Acquire takes a Concurrency slot for key. The lease must be released with
// Release; if the holder crashes, the store drops it after Limit.Period.
// The Limiter must use the Concurrency algorithm.
func (l *Limiter) Acquire(ctx context.Context, key string) (Lease, Decision, error) {
	if l.algo != Concurrency {
		return Lease{}, Decision{}, fmt.Errorf("%w: Acquire needs the concurrency algorithm, not %s", ErrInvalidRequest, l.algo)
	}
	req := l.Request(key, 1)
	req.Lease = NewLeaseID()
	d, err := l.store.Apply(ctx, OpAllow, req)
	if err != nil || !d.Allowed {
		return Lease{}, d, err
	}
	return Lease{ID: req.Lease, Key: key}, d, nil
}

// Release gives a Concurrency slot back. Releasing twice is harmless.
func (l *Limiter) Release(ctx context.Context, lease Lease) (Decision, error) {
	req := l.Request(lease.Key, 1)
	req.Lease = lease.ID
	return l.store.Apply(ctx, OpRefund, req)
}

// NewLeaseID returns a random 128-bit lease or request id in hex.
func NewLeaseID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// AllowAll checks every request and charges them all or none: a batch that
// one limit denies charges none of the others. It returns the combined
// decision (see Combine) and the decision per request.
func AllowAll(ctx context.Context, store Store, reqs []Request) (Decision, []Decision, error) {
	ds, err := store.ApplyAll(ctx, OpAllow, reqs)
	if err != nil {
		return Decision{}, nil, err
	}
	return Combine(ds), ds, nil
}
