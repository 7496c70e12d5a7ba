package redistest

import (
	"sync"
	"testing"
	"time"
)

// pollEvery is how often PollUntil asks its condition.
const pollEvery = 5 * time.Millisecond

// PollUntil asks cond every few milliseconds until it holds or deadline
// passes, and reports whether it held. It is how a test waits for a state
// that another goroutine or process reaches (a circuit opens, a server
// comes up): never a fixed sleep, which is too short on a loaded machine
// and too long on an idle one.
func PollUntil(deadline time.Time, cond func() bool) bool {
	if cond() {
		return true
	}
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	for {
		select {
		case <-tick.C:
			if cond() {
				return true
			}
		case <-timeout.C:
			return cond()
		}
	}
}

// WaitUntil is PollUntil within a duration, failing t when cond does not
// hold by then; it returns how long the wait took.
func WaitUntil(t testing.TB, what string, within time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	if !PollUntil(start.Add(within), cond) {
		t.Fatalf("%s: not within %s", what, within)
	}
	return time.Since(start)
}

// Gate holds whoever waits on it while it is shut. The zero value is
// open. Store and Load read like an atomic.Bool's, true meaning shut.
type Gate struct {
	mu   sync.Mutex
	shut chan struct{} // closed when opened again; nil while open
}

// Store shuts the gate (true) or opens it (false), releasing every waiter.
func (g *Gate) Store(shut bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case shut && g.shut == nil:
		g.shut = make(chan struct{})
	case !shut && g.shut != nil:
		close(g.shut)
		g.shut = nil
	}
}

// Load reports whether the gate is shut.
func (g *Gate) Load() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.shut != nil
}

// Wait returns once the gate is open.
func (g *Gate) Wait() {
	g.mu.Lock()
	ch := g.shut
	g.mu.Unlock()
	if ch != nil {
		<-ch
	}
}
