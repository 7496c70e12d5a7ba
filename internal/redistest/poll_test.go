package redistest

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestPollUntil: the condition is asked until it holds, and the poll ends
// at the deadline when it never does.
func TestPollUntil(t *testing.T) {
	var n atomic.Int32
	if !PollUntil(time.Now().Add(10*time.Second), func() bool { return n.Add(1) >= 3 }) || n.Load() != 3 {
		t.Fatalf("held at the 3rd ask: asked %d times", n.Load())
	}
	start := time.Now()
	if PollUntil(start.Add(30*time.Millisecond), func() bool { return false }) {
		t.Fatal("a condition that never holds held")
	}
	if time.Since(start) < 30*time.Millisecond {
		t.Fatalf("returned before the deadline, after %s", time.Since(start))
	}
}

// TestGateHoldsUntilOpened: Wait returns at once on an open gate, and on a
// shut one only once it is opened, every waiter together.
func TestGateHoldsUntilOpened(t *testing.T) {
	var g Gate
	g.Wait() // open: returns
	g.Store(true)
	if !g.Load() {
		t.Fatal("shut gate reads open")
	}
	var released atomic.Int32
	done := make(chan struct{})
	for range 3 {
		go func() {
			g.Wait()
			if released.Add(1) == 3 {
				close(done)
			}
		}()
	}
	select {
	case <-done:
		t.Fatal("waiters passed a shut gate")
	case <-time.After(20 * time.Millisecond): // a window in which a leak would show, not a synchronisation
	}
	g.Store(false)
	<-done
	if g.Load() {
		t.Fatal("open gate reads shut")
	}
}
