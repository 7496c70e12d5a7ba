package lease

import (
	"context"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
)

// lockedClock is a fake clock that checks that take and peek read it
// while they hold the key's lock.
type lockedClock struct {
	*clock.Fake
	s        atomic.Pointer[Store]
	key      string
	reads    atomic.Int64
	unlocked atomic.Int64
}

func (c *lockedClock) Now() int64 {
	pc := make([]uintptr, 1)
	if s := c.s.Load(); s != nil && runtime.Callers(2, pc) == 1 {
		name := runtime.FuncForPC(pc[0]).Name()
		if strings.HasSuffix(name, ".(*Store).take") || strings.HasSuffix(name, ".(*Store).peek") || strings.HasSuffix(name, ".(*Store).decisionNow") {
			c.reads.Add(1)
			if e, ok := s.keys.Load(c.key); ok && e.mu.TryLock() {
				e.mu.Unlock()
				c.unlocked.Add(1)
			}
		}
	}
	return c.Fake.Now()
}

// A lease decision reads the clock under the key's lock. Read before it,
// a goroutine stopped in between (SIGSTOP, a frozen VM, starvation)
// decides on a time long past once it has the lock: every caller queued on
// a hot key's lock during a pause spent the old chunk, charged before the
// pause, on top of a limit that refilled meanwhile, after the first of
// them had found the chunk expired.
func TestLeaseReadsClockUnderLock(t *testing.T) {
	clk := &lockedClock{Fake: clock.NewFake(time.Unix(1_700_000_000, 0)), key: "k"}
	mem, err := memstore.New(memstore.Options{Clock: clk.Fake})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	s, err := New(Options{All: true, Store: mem, Clock: clk, SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	clk.s.Store(s)
	req := sluice.Request{Key: "k", Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 10_000, Period: time.Second, Burst: 2000}, Cost: 1}
	for range 200 {
		for range 5 {
			if _, err := s.Apply(context.Background(), sluice.OpAllow, req); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Apply(context.Background(), sluice.OpPeek, req); err != nil {
				t.Fatal(err)
			}
		}
		s.WaitAsync()
		clk.Advance(time.Millisecond)
	}
	if s.Stats().Hits == 0 || clk.reads.Load() == 0 {
		t.Fatalf("no lease decisions: %+v, %d clock reads", s.Stats(), clk.reads.Load())
	}
	if n := clk.unlocked.Load(); n > 0 {
		t.Fatalf("%d of %d clock reads of take and peek were made without the key's lock", n, clk.reads.Load())
	}
}
