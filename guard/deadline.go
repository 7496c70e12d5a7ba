package guard

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Every store call gets Options.Timeout as its deadline. A
// context.WithTimeout per call cost a context, a timer, a child map in the
// parent (gRPC's per-call context) and a done channel, and a timer to add
// and to remove: at 64 calls in flight on Redis, one allocation in ten
// of the Envoy service and a few percent of its CPU. Calls that start
// within the same tick (Timeout/64) share one deadline instead, whose done
// channel one timer closes. The deadline is rounded down to its tick, so a
// call gets at least Timeout less one tick, never more than Timeout (and a
// store whose own timeout is the guard's, as redisstore in `sluice serve`,
// never adds a timer of its own).
//
// The context a call gets (callCtx) carries its caller's values but not
// its cancellation: the caller is released at once when its own context
// ends (bounded and gates.acquire watch both), while the store call runs
// on until it answers or the shared deadline passes, as it already did
// whenever the client ignored its context.

// ticksPerTimeout is how many ticks a timeout is cut into.
const ticksPerTimeout = 64

// deadlines hands out the shared deadlines of one timeout.
type deadlines struct {
	timeout time.Duration
	tick    time.Duration
	base    time.Time // ticks count from here, on the monotonic clock
	cur     atomic.Pointer[deadline]
	mu      sync.Mutex // creates deadlines
}

// deadline is the end of the calls that started within one tick.
type deadline struct {
	n    int64     // the tick it ends on
	at   time.Time // base + n ticks
	done chan struct{}
}

func newDeadlines(timeout time.Duration) *deadlines {
	return &deadlines{timeout: timeout, tick: max(timeout/ticksPerTimeout, 1), base: time.Now()}
}

// get returns the deadline of a call that starts now.
func (ds *deadlines) get() *deadline {
	n := int64((time.Since(ds.base) + ds.timeout) / ds.tick)
	if d := ds.cur.Load(); d != nil && d.n >= n {
		// d.n > n only if time moved on since n was read: d is still no
		// later than now + timeout.
		return d
	}
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if d := ds.cur.Load(); d != nil && d.n >= n {
		return d
	}
	d := &deadline{n: n, at: ds.base.Add(time.Duration(n) * ds.tick), done: make(chan struct{})}
	time.AfterFunc(time.Until(d.at), func() { close(d.done) })
	ds.cur.Store(d)
	return d
}

// bound returns the context of a store call for a caller's ctx: ctx itself
// when it ends no later than the shared deadline, else a callCtx.
func (ds *deadlines) bound(ctx context.Context) context.Context {
	d := ds.get()
	if at, ok := ctx.Deadline(); ok && !at.After(d.at) {
		return ctx
	}
	return &callCtx{Context: ctx, d: d}
}

// callCtx is a store call's context: its caller's values, and a shared
// deadline. It does not end when the caller's context is cancelled.
type callCtx struct {
	context.Context // the caller's, for its values
	d               *deadline
}

// Deadline implements context.Context: the shared deadline, which comes
// before the caller's.
func (c *callCtx) Deadline() (time.Time, bool) { return c.d.at, true }

// Done implements context.Context.
func (c *callCtx) Done() <-chan struct{} { return c.d.done }

// Err implements context.Context.
func (c *callCtx) Err() error {
	select {
	case <-c.d.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// AfterFunc runs f in its own goroutine once c is done; stop keeps it from
// running. The context package uses it for a context derived from c (a
// store whose own timeout is shorter than the guard's derives one per
// call), instead of starting a goroutine to wait for c.
func (c *callCtx) AfterFunc(f func()) (stop func() bool) {
	t := time.AfterFunc(time.Until(c.d.at), func() {
		<-c.d.done // closed by its own timer, due at the same time
		f()
	})
	return t.Stop
}

// String names the context, as the context package's do.
func (c *callCtx) String() string { return "guard.callCtx" }
