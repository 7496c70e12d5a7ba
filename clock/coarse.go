package clock

import (
	"sync/atomic"
	"time"
)

// DefaultCoarsePeriod is how often a Coarse clock refreshes while it is
// read, and so about how far it lags the system clock.
const DefaultCoarsePeriod = time.Millisecond

// Coarse is the system clock read from a cached value: one atomic load
// instead of a read of the system clock (runtime.nanotime through the
// vDSO, about 22 ns on an AMD EPYC VM, most of a memory-store decision).
// A goroutine refreshes the value every period, but only while the clock
// is read: after a whole period with no read it exits, so an idle Coarse
// wakes nothing and costs nothing; the next read reads the system clock
// itself and starts the goroutine again.
//
// The bound: Coarse never runs ahead of the system clock, and it never
// goes back. It lags by up to the period, and by however late the Go
// scheduler runs the refreshing goroutine on a starved CPU. A rate
// limiter reading it keeps its bounds exactly on this clock; on the wall
// clock a window of length t holds at most what it admits in t + the
// largest lag Λ (for a rate r, r·Λ more, as when a goroutine is preempted
// between a System read and its update), and a lag lengthens RetryAfter
// and ResetAfter by as much (TestCoarseNeverAhead). Where every
// nanosecond must hold, use System.
//
// The zero value is not usable; call NewCoarse.
type Coarse struct {
	_ [64]byte // keeps w on a cache line of its own: readers share it
	// w is the cached time shifted left by one, its low bit set by the
	// refresher and cleared by the first read after it ("unread"); 1 (no
	// time, the bit set) while no refresher runs. Now's inlined path
	// thus tests one bit.
	w       word
	running atomic.Bool // a refresher goroutine runs
	_       [64 - 8 - 4]byte
	src     Clock
	period  time.Duration
	sleep   func(time.Duration)
	spawn   func(func())
}

// NewCoarse returns a Coarse clock on the system clock that refreshes
// every period while it is read; a period of zero or less means
// DefaultCoarsePeriod. It starts no goroutine until it is read.
func NewCoarse(period time.Duration) *Coarse {
	return newCoarse(NewSystem(), period, time.Sleep, func(f func()) { go f() })
}

// Source is the clock c caches (its own System for NewCoarse): Now never
// runs ahead of it. A caller that needs some readings exact and others
// fast reads this one for the former, so that the two agree (another
// System is anchored to the wall clock at another moment, and may read
// ahead of this one by the wall clock's adjustments since).
func (c *Coarse) Source() Clock { return c.src }

// newCoarse returns a Coarse on src that waits with sleep and starts its
// refresher with spawn (tests step both).
func newCoarse(src Clock, period time.Duration, sleep func(time.Duration), spawn func(func())) *Coarse {
	if period <= 0 {
		period = DefaultCoarsePeriod
	}
	c := &Coarse{src: src, period: period, sleep: sleep, spawn: spawn}
	c.w.Store(1)
	return c
}

// Now implements Clock: the cached time, or the system clock's when no
// refresher runs.
func (c *Coarse) Now() int64 {
	w := atomic.LoadInt64(&c.w.v)
	if w&1 != 0 {
		return c.slow()
	}
	return w >> 1
}

// slow is Now off its inlined path. The first read after the refresher
// stored the time clears the unread bit, telling the refresher that the
// clock is in use (one write per period). With no refresher running, it
// reads the source, publishes the time so that no later read returns an
// earlier one, and starts the refresher.
func (c *Coarse) slow() int64 {
	if w := c.w.Load(); w > 1 {
		c.w.CompareAndSwap(w, w&^1)
		return w >> 1
	}
	t := c.src.Now()
	for {
		w := c.w.Load()
		if w>>1 >= t {
			return w >> 1 // a refresher published a later time meanwhile
		}
		if c.w.CompareAndSwap(w, t<<1) {
			break
		}
	}
	if c.running.CompareAndSwap(false, true) {
		c.spawn(c.refresh)
	}
	return t
}

// refresh stores the source's time every period until a period passes in
// which nobody read the clock.
func (c *Coarse) refresh() {
	for {
		c.sleep(c.period)
		t := c.src.Now()
		// Unread for a whole period: stop. (A read that clears the bit
		// just now fails the swap, and the time is refreshed below.)
		if w := c.w.Load(); w&1 != 0 && c.w.CompareAndSwap(w, 1) {
			c.running.Store(false)
			// A reader that found w stopped and could not start a
			// refresher (this one was still running) published its
			// time: serve it.
			if c.w.Load() == 1 || !c.running.CompareAndSwap(false, true) {
				return
			}
			continue
		}
		for {
			w := c.w.Load()
			if c.w.CompareAndSwap(w, max(t, w>>1)<<1|1) {
				break
			}
		}
	}
}

// word is an int64 read and written atomically only. Now loads it with
// atomic.LoadInt64, an intrinsic that keeps Now within the inlining
// budget (atomic.Int64.Load's inlined wrapper took it past).
type word struct{ v int64 }

func (w *word) Load() int64                      { return atomic.LoadInt64(&w.v) }
func (w *word) Store(v int64)                    { atomic.StoreInt64(&w.v, v) }
func (w *word) CompareAndSwap(old, v int64) bool { return atomic.CompareAndSwapInt64(&w.v, old, v) }
