package gateway

import (
	"context"
	"sync"
	"time"
)

// Admission's store deadline
//
// Every admission's store call is bounded by store.timeout. A
// context.WithTimeout per request cost a context, a child entry in the
// request's context and a runtime timer started and stopped per request
// (the timers' lock contended at 64 connections), although a decision
// from the leases never waits on the store and never looks at its
// context's Done. storeCtx is that deadline, made lazily: its Deadline is
// known at once, and the timer context behind it is made only when a
// store asks for Done or Err, which is when a call goes out to Redis (a
// lease fetch waited for, a member decided directly, the guard's bound,
// rueidis' wait for a reply). A store that never asks (the memory store,
// a leased decision) costs no timer; one that does gets exactly what
// context.WithTimeout gave it.

// storeCtx is a context that ends when its parent does, at its deadline,
// or when its stop is called, whichever comes first, as a
// context.WithDeadline does; the context.WithDeadline behind it (its done
// channel and timer) is made on first use of Done or Err. A storeCtx is
// used once: start it, hand it to the store, stop it when the store has
// returned.
type storeCtx struct {
	parent context.Context
	at     time.Time

	mu      sync.Mutex
	inner   context.Context    // nil until made (Done, Err)
	cancel  context.CancelFunc // inner's
	stopped bool
}

// start makes s a context of parent that ends at at, and returns it. s
// must not be in use.
func (s *storeCtx) start(parent context.Context, at time.Time) context.Context {
	s.parent, s.at, s.inner, s.cancel, s.stopped = parent, at, nil, nil, false
	return s
}

// stop ends s, as a context.WithDeadline's cancel does, stopping its
// timer if it has one.
func (s *storeCtx) stop() {
	s.mu.Lock()
	s.stopped = true
	cancel := s.cancel
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// made returns the context behind s, making it on first use: a
// context.WithDeadline of the parent, or after stop one already canceled
// (with the parent's values).
func (s *storeCtx) made() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inner == nil {
		if s.stopped {
			s.inner, s.cancel = context.WithCancel(context.WithoutCancel(s.parent))
			s.cancel()
		} else {
			s.inner, s.cancel = context.WithDeadline(s.parent, s.at)
		}
	}
	return s.inner
}

// Deadline implements context.Context: the earlier of the parent's and
// s's own, as context.WithDeadline's.
func (s *storeCtx) Deadline() (time.Time, bool) {
	if d, ok := s.parent.Deadline(); ok && d.Before(s.at) {
		return d, true
	}
	return s.at, true
}

// Done implements context.Context.
func (s *storeCtx) Done() <-chan struct{} { return s.made().Done() }

// Err implements context.Context.
func (s *storeCtx) Err() error { return s.made().Err() }

// Value implements context.Context. Once the context behind s is made it
// answers, so that a context derived from s finds the cancelation it
// would find under a context.WithDeadline (the context package's
// propagateCancel asks for Done first, then for its cancelCtx by Value).
func (s *storeCtx) Value(key any) any {
	s.mu.Lock()
	inner := s.inner
	s.mu.Unlock()
	if inner != nil {
		return inner.Value(key)
	}
	return s.parent.Value(key)
}

// String names the context, as the context package's do.
func (s *storeCtx) String() string { return "gateway.storeCtx" }
