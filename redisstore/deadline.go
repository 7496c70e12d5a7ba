package redisstore

import (
	"context"
	"sync/atomic"
	"time"
)

// sharedDeadline bounds the calls that come with context.Background (or
// TODO), no deadline and nothing to cancel them, by the store's timeout
// without a timer and a context each: they share one context whose
// deadline is between timeout and timeout + timeout/8 away, replaced when
// it comes nearer than timeout. A caller's context with a deadline, a
// cancellation or values (a trace span) is never replaced: bound gives it
// its own timeout as before, or keeps it when its deadline is the nearer
// (the guard's calls). Such a call thus waits at most 9/8 of the timeout.
type sharedDeadline struct {
	cur atomic.Pointer[sharedCtx]
}

type sharedCtx struct {
	ctx    context.Context
	cancel context.CancelFunc // never called: the deadline releases it
	// until is when ctx stops being handed out: its deadline less the
	// timeout (time.Now's monotonic reading compares).
	until time.Time
}

// get returns a context that expires between timeout and 9/8 of it after
// now. A store calls it with one timeout.
func (d *sharedDeadline) get(now time.Time, timeout time.Duration) context.Context {
	if c := d.cur.Load(); c != nil && now.Before(c.until) {
		return c.ctx
	}
	deadline := now.Add(timeout + timeout/8)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	c := &sharedCtx{ctx: ctx, cancel: cancel, until: deadline.Add(-timeout)}
	d.cur.Store(c) // a racing get's context serves its own callers
	return ctx
}

// isBackground reports whether ctx is context.Background or TODO: no
// deadline, no cancellation, no values.
func isBackground(ctx context.Context) bool {
	return ctx == context.Background() || ctx == context.TODO()
}
