// Package clock supplies the time to the memory store: a fast monotonic
// system clock and a fake one for tests.
package clock

import (
	"sync/atomic"
	"time"
	_ "unsafe" // for go:linkname
)

// Clock returns the current time as nanoseconds since the Unix epoch. It
// must be safe for concurrent use and must never go backwards.
type Clock interface {
	Now() int64
}

//go:linkname nanotime runtime.nanotime
func nanotime() int64

// System is the process's clock: wall time read once at creation, advanced
// by the runtime's monotonic clock. It never jumps with NTP adjustments, and
// one read costs half of time.Now, which reads both clocks.
type System struct {
	base int64
}

// NewSystem returns a System clock anchored to the wall clock now.
func NewSystem() *System {
	return &System{base: time.Now().UnixNano() - nanotime()}
}

// Now implements Clock.
func (s *System) Now() int64 { return s.base + nanotime() }

// Fake is a Clock that moves only when told to. It is safe for concurrent use.
type Fake struct {
	ns atomic.Int64
}

// NewFake returns a Fake clock set to t.
func NewFake(t time.Time) *Fake {
	f := &Fake{}
	f.ns.Store(t.UnixNano())
	return f
}

// Now implements Clock.
func (f *Fake) Now() int64 { return f.ns.Load() }

// Time returns the fake time as a time.Time.
func (f *Fake) Time() time.Time { return time.Unix(0, f.ns.Load()) }

// Advance moves the clock forward by d and returns the new time.
func (f *Fake) Advance(d time.Duration) int64 { return f.ns.Add(int64(d)) }

// Set moves the clock to t.
func (f *Fake) Set(t time.Time) { f.ns.Store(t.UnixNano()) }
