package guard

import (
	"context"
	"errors"
	"hash/maphash"
	"runtime"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
)

type ctxKey struct{}

// A call's deadline is its timeout rounded down to a tick: never later
// than its start plus the timeout, less than a tick earlier; calls within
// one tick share it; it carries the caller's values, ends when the shared
// timer fires, and not when the caller's context is cancelled.
func TestSharedDeadlines(t *testing.T) {
	const timeout = 640 * time.Millisecond
	ds := newDeadlines(timeout)
	if ds.tick != 10*time.Millisecond {
		t.Fatalf("tick %s, want timeout/64", ds.tick)
	}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	seen := map[time.Time]bool{}
	start := time.Now()
	var last context.Context
	for range 1000 {
		before := time.Now()
		c := ds.bound(parent)
		after := time.Now()
		dl, ok := c.Deadline()
		if !ok || dl.After(after.Add(timeout)) || !dl.After(before.Add(timeout-ds.tick)) {
			t.Fatalf("deadline %s after a call began (%s to bound it); want in (%s, %s]",
				dl.Sub(before), after.Sub(before), timeout-ds.tick, timeout)
		}
		seen[dl] = true
		last = c
	}
	if most := int(time.Since(start)/ds.tick) + 1; len(seen) > most {
		t.Errorf("%d distinct deadlines within %s: want at most %d", len(seen), time.Since(start), most)
	}
	if v := last.Value(ctxKey{}); v != "v" {
		t.Errorf("value %v, want the caller's", v)
	}
	cancel()
	if err := last.Err(); err != nil {
		t.Errorf("the call ended with its caller: %v", err)
	}
	select {
	case <-last.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("not done 30s after its deadline")
	}
	dl, _ := last.Deadline()
	if time.Now().Before(dl) {
		t.Errorf("done %s before its deadline", time.Until(dl))
	}
	if err := last.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Err after the deadline: %v", err)
	}
}

// A context derived from a call's (as a store with a shorter timeout of its
// own derives one) ends with it, and needs no goroutine to wait for it.
func TestDerivedCallContext(t *testing.T) {
	ds := newDeadlines(50 * time.Millisecond)
	c := ds.bound(context.Background())
	before := runtime.NumGoroutine()
	var cancels []context.CancelFunc
	for range 1000 {
		_, cancel := context.WithTimeout(c, time.Hour)
		cancels = append(cancels, cancel)
	}
	// Counted only while the call's deadline has not passed: once it has,
	// the derived contexts' cancellations run, each on a goroutine of its
	// own for a moment (a starved CPU can take 50 ms for the loop).
	if n := runtime.NumGoroutine() - before; n >= 500 && c.Err() == nil {
		t.Errorf("%d goroutines for 1000 derived contexts", n)
	}
	for _, cancel := range cancels {
		cancel()
	}
	derived, cancel := context.WithTimeout(c, time.Hour)
	defer cancel()
	select {
	case <-derived.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("a derived context not done 30s after the call's deadline")
	}
	if err := derived.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("derived context: %v, want DeadlineExceeded", err)
	}
	if err := context.Cause(derived); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("derived context's cause: %v, want DeadlineExceeded", err)
	}
}

// A caller's context that ends first is the call's context as it is.
func TestEarlierCallerDeadlineKept(t *testing.T) {
	ds := newDeadlines(time.Hour)
	parent, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if c := ds.bound(parent); c != parent {
		t.Errorf("got %v, want the caller's own context", c)
	}
	if c := ds.bound(context.Background()); c == context.Background() {
		t.Error("no deadline for a caller without one")
	}
}

// A caller whose context is cancelled returns at once, whether its call
// is stuck in the store or waiting for a slot of its key; the guard's
// deadline (an hour here) is not waited for.
func TestCallerCancelledWhileStoreStuck(t *testing.T) {
	d := &deaf{faulty: newFaulty(t), held: make(chan struct{}), waiting: make(chan struct{}, 16)}
	defer close(d.held)
	g := newGuard(t, d, Options{Policy: FailClosed, Timeout: time.Hour, MaxInFlightPerKey: 1, MinFailures: 1 << 20})
	call := func(ctx context.Context) <-chan error {
		errc := make(chan error, 1)
		go func() {
			_, err := g.Apply(ctx, sluice.OpAllow, req("k", 10))
			errc <- err
		}()
		return errc
	}
	inStore, cancelStore := context.WithCancel(context.Background())
	stuck := call(inStore)
	<-d.waiting // the call is in the store, its key's one slot taken
	atGate, cancelGate := context.WithCancel(context.Background())
	queued := call(atGate)
	eventually(t, "the second call waits for the key's slot", func() bool { return g.gates.refs("k") == 2 })
	for _, c := range []struct {
		name   string
		cancel context.CancelFunc
		errc   <-chan error
	}{{"waiting for the key's slot", cancelGate, queued}, {"in the store", cancelStore, stuck}} {
		c.cancel()
		select {
		case err := <-c.errc:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("%s: %v, want the caller's context.Canceled", c.name, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: not returned 30s after its caller cancelled", c.name)
		}
	}
}

// refs is the number of callers holding or waiting for a slot of key.
func (g *gates) refs(key string) int {
	sh := &g.shards[maphash.String(keySeed, key)%uint64(len(g.shards))]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if gt := sh.m[key]; gt != nil {
		return gt.refs
	}
	return 0
}
