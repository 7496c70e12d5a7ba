package clock

import (
	"sync"
	"testing"
	"time"
)

// stepped is a Coarse on a fake source whose refresher runs one period
// at a time, when the test says so.
type stepped struct {
	*Coarse
	src    *Fake
	asleep chan struct{} // the refresher entered its sleep
	wake   chan struct{}
	exited chan struct{} // the refresher returned
}

func newStepped(t *testing.T) *stepped {
	s := &stepped{
		src:    NewFake(time.Unix(1_800_000_000, 0)),
		asleep: make(chan struct{}),
		wake:   make(chan struct{}),
		exited: make(chan struct{}, 8),
	}
	sleep := func(time.Duration) {
		s.asleep <- struct{}{}
		<-s.wake
	}
	spawn := func(f func()) {
		go func() {
			f()
			s.exited <- struct{}{}
		}()
	}
	s.Coarse = newCoarse(s.src, time.Millisecond, sleep, spawn)
	return s
}

// tick lets the refresher run one period and waits until it either sleeps
// again (it returns true) or exits (false).
func (s *stepped) tick(t *testing.T) bool {
	t.Helper()
	select {
	case s.wake <- struct{}{}:
	case <-time.After(10 * time.Second):
		t.Fatal("refresher not asleep")
	}
	select {
	case <-s.asleep:
		return true
	case <-s.exited:
		return false
	case <-time.After(10 * time.Second):
		t.Fatal("refresher neither slept nor exited")
		return false
	}
}

// The cached time lags the source until the refresher's next period and
// never runs ahead of it; the refresher exits after a period without a
// read, and the next read starts it again from the source's time.
func TestCoarseSteps(t *testing.T) {
	s := newStepped(t)
	t0 := s.src.Now()
	if got := s.Now(); got != t0 {
		t.Fatalf("first read %d, want the source's %d", got, t0)
	}
	<-s.asleep // started by the first read
	s.src.Advance(3 * time.Millisecond)
	if got := s.Now(); got != t0 {
		t.Fatalf("read before a refresh %d, want the cached %d", got, t0)
	}
	if !s.tick(t) { // read during the period: keeps running
		t.Fatal("refresher exited although the clock was read")
	}
	t1 := s.src.Now()
	if got := s.Now(); got != t1 {
		t.Fatalf("read after a refresh %d, want %d", got, t1)
	}
	if !s.tick(t) {
		t.Fatal("refresher exited although the clock was read")
	}
	// No read in this period: the refresher exits, and nothing runs.
	if s.tick(t) {
		t.Fatal("refresher still running after an idle period")
	}
	if s.running.Load() || s.w.Load() != 1 {
		t.Fatalf("after exit: running %v, w %d", s.running.Load(), s.w.Load())
	}
	s.src.Advance(time.Second)
	t2 := s.src.Now()
	if got := s.Now(); got != t2 {
		t.Fatalf("read when idle %d, want the source's %d", got, t2)
	}
	<-s.asleep // restarted
	if !s.tick(t) {
		t.Fatal("restarted refresher exited although the clock was read")
	}
	if s.tick(t) {
		t.Fatal("restarted refresher still running after an idle period")
	}
}

// Read from many goroutines while the refresher runs, stops and restarts,
// the clock never goes back and never runs ahead of the source: a limiter
// on it sees refills late, never early. Run under -race.
func TestCoarseNeverAhead(t *testing.T) {
	src := NewSystem()
	c := newCoarse(src, 50*time.Microsecond, time.Sleep, func(f func()) { go f() })
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			prev := int64(0)
			for i := range 20000 {
				got := c.Now()
				after := src.Now()
				if got < prev {
					t.Errorf("goroutine %d: clock went back: %d after %d", g, got, prev)
					return
				}
				if got > after {
					t.Errorf("goroutine %d: clock %d ahead of the source %d", g, got, after)
					return
				}
				prev = got
				if i%5000 == 0 {
					// idle long enough for the refresher to exit (a few periods)
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
}
