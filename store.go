package sluice

import "context"

// Store keeps rate-limit state and applies operations to it atomically. The
// store, not the caller, supplies the current time.
//
// Implementations must be safe for concurrent use by many goroutines. They
// validate each request with Request.Validate and return its error before
// changing anything.
type Store interface {
	// Apply runs op on one key as one atomic step.
	Apply(ctx context.Context, op Op, req Request) (Decision, error)
	// ApplyAll runs op on every request as one atomic step and returns a
	// decision per request, in order. With OpAllow the batch is all or
	// nothing: it is charged only if every request is allowed. With
	// OpRefund it is refunded only if every Concurrency lease in it is held.
	ApplyAll(ctx context.Context, op Op, reqs []Request) ([]Decision, error)
}
