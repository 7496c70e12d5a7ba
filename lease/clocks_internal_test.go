package lease

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
)

// clocksFixture is a Store over the memory store whose exact clock and
// fast clock (Store.fast, a clock.Coarse in production) are two fakes, so
// that a test can let the fast one lag as a starved Coarse refresher does.
type clocksFixture struct {
	s           *Store
	exact, fast *clock.Fake
}

func newClocksFixture(t *testing.T) *clocksFixture {
	t.Helper()
	t0 := time.Unix(1_700_000_000, 0) // a whole second: windows start here
	f := &clocksFixture{exact: clock.NewFake(t0), fast: clock.NewFake(t0)}
	mem, err := memstore.New(memstore.Options{Clock: f.exact, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close() })
	f.s, err = New(Options{All: true, Store: mem, Clock: f.exact, SweepEvery: -1, MinChunk: 1, MaxFraction: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.s.Close() })
	f.s.fast = f.fast
	return f
}

// lease drives req for 200ms of both clocks, 5 requests a millisecond, and
// returns its entry, which then holds a chunk.
func (f *clocksFixture) lease(t *testing.T, req sluice.Request) *entry {
	t.Helper()
	for range 200 {
		f.exact.Advance(time.Millisecond)
		f.fast.Set(f.exact.Time())
		for range 5 {
			if _, err := f.s.Apply(context.Background(), sluice.OpAllow, req); err != nil {
				t.Fatal(err)
			}
		}
		f.s.WaitAsync()
	}
	e, ok := f.s.keys.Load(req.Key)
	if !ok {
		t.Fatal("no lease entry")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.tokens == 0 {
		t.Fatalf("no chunk held after 200ms: %+v", f.s.Stats())
	}
	return e
}

// A window chunk is not spent past its window's end however far the fast
// clock lags (it reads the exact one), while a GCRA or token-bucket
// decision reads the fast clock: its chunk, past its TTL on the exact
// clock, is spent until the fast clock gets there too (the package doc,
// Clocks: the TTL holds on the fast clock, TTL + the lag on the wall).
func TestWindowChunkReadsExactClock(t *testing.T) {
	ctx := context.Background()
	lim := sluice.Limit{Rate: 100_000, Period: time.Second}
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindowCounter} {
		f := newClocksFixture(t)
		req := sluice.Request{Key: a.String(), Algorithm: a, Limit: lim, Cost: 1}
		e := f.lease(t, req)
		e.mu.Lock()
		held, end := e.tokens, e.expiry
		e.mu.Unlock()
		// The window has ended; the fast clock lags 200ms behind it.
		f.exact.Set(time.Unix(0, end+int64(time.Millisecond)))
		f.fast.Set(time.Unix(0, end-int64(200*time.Millisecond)))
		if _, err := f.s.Apply(ctx, sluice.OpAllow, req); err != nil {
			t.Fatal(err)
		}
		f.s.WaitAsync()
		if st := f.s.Stats(); st.Stranded < uint64(held) {
			t.Fatalf("%s: %d units held at the window's end, %d stranded: the old window's chunk was spent in the next (%+v)", a, held, st.Stranded, st)
		}
	}
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket} {
		f := newClocksFixture(t)
		req := sluice.Request{Key: a.String(), Algorithm: a, Limit: sluice.Limit{Rate: 100_000, Period: time.Second, Burst: 100_000}, Cost: 1}
		e := f.lease(t, req)
		e.mu.Lock()
		expiry := e.expiry
		e.mu.Unlock()
		returns := f.s.Stats().Returns
		f.exact.Set(time.Unix(0, expiry+int64(time.Millisecond)))
		f.fast.Set(time.Unix(0, expiry-int64(time.Millisecond)))
		if d, err := f.s.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed || d.Source != sluice.FromLease {
			t.Fatalf("%s: fast clock 1ms before the chunk's TTL: %+v %v, want allowed from the lease", a, d, err)
		}
		f.s.WaitAsync()
		if st := f.s.Stats(); st.Returns != returns {
			t.Fatalf("%s: the chunk went back while the fast clock was before its TTL: %+v", a, st)
		}
		f.fast.Set(f.exact.Time())
		if _, err := f.s.Apply(ctx, sluice.OpAllow, req); err != nil {
			t.Fatal(err)
		}
		f.s.WaitAsync()
		if st := f.s.Stats(); st.Returns == returns {
			t.Fatalf("%s: the chunk was kept past its TTL on the fast clock: %+v", a, st)
		}
	}
}
