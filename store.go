package sluice

import (
	"context"
	"errors"
)

// ErrUnavailable means a store could not be asked, or did not answer in
// time: a network error, a deadline missed, a failover in progress, an
// open circuit. Stores wrap it in such errors, so that callers (and package
// guard) tell an outage from a bad request with errors.Is.
var ErrUnavailable = errors.New("sluice: store unavailable")

// Store keeps rate-limit state and applies operations to it atomically. The
// store, not the caller, supplies the current time.
//
// Implementations must be safe for concurrent use by many goroutines. They
// validate each request with Request.Validate and return its error before
// changing anything. An error that means the store could not answer wraps
// ErrUnavailable.
type Store interface {
	// Apply runs op on one key as one atomic step.
	Apply(ctx context.Context, op Op, req Request) (Decision, error)
	// ApplyAll runs op on every request as one atomic step and returns a
	// decision per request, in order. With OpAllow the batch is all or
	// nothing: it is charged only if every request is allowed. With
	// OpRefund it is refunded only if every Concurrency lease in it is held.
	ApplyAll(ctx context.Context, op Op, reqs []Request) ([]Decision, error)
}
