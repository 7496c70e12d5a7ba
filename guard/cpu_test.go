package guard

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
)

// Goroutines that spin on every P make the others wait to run: the process
// reads as starved of CPU while they spin.
func TestStarvationSeesSpinners(t *testing.T) {
	s := newStarvation(time.Millisecond)
	s.every = 0
	s.check() // the baseline: what ran before this test
	// The same reading against a bound no wait reaches: never starved (an
	// "always starved" guard would hold no late call against the store).
	calm := newStarvation(time.Hour)
	calm.every = 0
	calm.check()
	var stop atomic.Bool
	var ran atomic.Int64
	var wg sync.WaitGroup
	spinners := 16 * runtime.GOMAXPROCS(0)
	for range spinners {
		wg.Go(func() {
			ran.Add(1)
			for !stop.Load() {
			}
		})
	}
	defer func() {
		stop.Store(true)
		wg.Wait()
	}()
	// Each spinner runs only after waiting for the others' time slices
	// (10 ms each): once all ran, many waits were far above 1 ms.
	eventually(t, "every spinner ran", func() bool { return ran.Load() == int64(spinners) })
	if !s.check() {
		t.Fatalf("%d goroutines spinning on %d Ps: not starved", spinners, runtime.GOMAXPROCS(0))
	}
	if calm.check() {
		t.Fatal("starved against a bound of an hour")
	}
}

// Calls that miss their deadline across many keys open the node's circuit,
// unless this process was starved of CPU meanwhile: then their lateness
// may be the process's own, and a flood that starves it must not open the
// circuit (under fail_open, that admitted everything). Either way the late
// calls are denied while the circuit is closed.
func TestLateCallsWhileStarvedKeepCircuitClosed(t *testing.T) {
	for _, starved := range []bool{false, true} {
		t.Run(map[bool]string{false: "not starved", true: "starved"}[starved], func(t *testing.T) {
			d := &deaf{faulty: newFaulty(t), held: make(chan struct{}), waiting: make(chan struct{}, 1024)}
			defer close(d.held)
			g := newGuard(t, d, Options{Policy: FailOpen, Timeout: 20 * time.Millisecond, ProbeInterval: time.Hour, starved: func() bool { return starved }})
			var wg sync.WaitGroup
			var admitted atomic.Int64
			for i := range 4 * DefaultMinFailures {
				wg.Go(func() {
					if dec, err := g.Apply(context.Background(), sluice.OpAllow, req(fmt.Sprint("k", i), 10)); err != nil || dec.Allowed {
						admitted.Add(1)
					}
				})
				if i%DefaultMinFailingKeys == DefaultMinFailingKeys-1 {
					wg.Wait() // a few at a time: late, not busy
				}
			}
			wg.Wait()
			st := g.Stats()
			if starved && (st.Openings != 0 || admitted.Load() != 0) {
				t.Fatalf("late calls while starved: %d circuit openings, %d admitted or failed; want none", st.Openings, admitted.Load())
			}
			if !starved && st.Openings != 1 {
				t.Fatalf("late calls across keys, not starved: %d circuit openings, want 1", st.Openings)
			}
		})
	}
}

// A starved reading holds for a while: a late call or probe is judged as
// it returns, after waiting up to its deadline, and the reading taken then
// covers only the last few milliseconds, which may be calm, or hold no
// waits at all (a process that barely ran). Past the hold it lapses.
func TestStarvationVerdictHolds(t *testing.T) {
	s := newStarvation(time.Hour) // no reading of this test says starved
	s.every = 0
	s.check()
	s.starvedAt.Store(int64(time.Since(s.origin)) + 1) // a reading said starved just now
	if !s.check() {
		t.Fatal("a starved reading did not hold past the next, calm one")
	}
	s.hold = 0
	if s.check() {
		t.Fatal("a starved reading held past its hold")
	}
}
