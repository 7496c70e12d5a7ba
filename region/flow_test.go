package region_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/redisstore"
	"github.com/sluice-io/sluice/region"
)

// fakeRegions is one region (us) and a key's home (eu) on a shared
// redis-server, every clock the fake one: the stores' scripts, the
// ledger's and the region's.
func fakeRegions(t *testing.T) (*region.Store, sluice.Store, *clock.Fake, string) {
	t.Helper()
	return fakeRegionsWith(t, nil)
}

// fakeRegionsWith is fakeRegions with the region's options changed by mod
// (nil: none).
func fakeRegionsWith(t *testing.T, mod func(*region.Options)) (*region.Store, sluice.Store, *clock.Fake, string) {
	t.Helper()
	srv := redistest.Standalone(t)
	clk := clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	open := func() *redisstore.Store {
		s, err := redisstore.New(context.Background(), redisstore.Options{URL: srv.URL(), Clock: clk, Timeout: time.Second, DisableDenyCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	home, local := open(), open()
	opts := region.Options{
		Region:      "us",
		Regions:     map[string]sluice.Store{"us": local, "eu": home},
		Ledger:      local.Client(),
		Global:      func(*sluice.Request) bool { return true },
		Home:        func(string) string { return "eu" },
		Clock:       clk,
		LedgerClock: clk,
		SweepEvery:  -1,
		FetchWait:   time.Minute, // the fake clock does not move while a fetch runs
		CallTimeout: time.Second,
	}
	if mod != nil {
		mod(&opts)
	}
	s, err := region.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, home, clk, redistest.Prefix(t)
}

// A bucket share that goes unspent for IdleAfter flows back to the home:
// the sweep takes it from the region's store and refunds it, and the home
// has it again.
func TestShareRefundedWhenIdle(t *testing.T) {
	s, home, clk, prefix := fakeRegions(t)
	ctx := context.Background()
	// 100 at once, refilled at 10 a minute: refill is negligible here.
	req := sluice.Request{Key: prefix + "idle", Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 10, Period: time.Minute, Burst: 100}, Cost: 1}
	d, err := s.Apply(ctx, sluice.OpAllow, req)
	if err != nil || !d.Allowed || d.Source != sluice.FromShare {
		t.Fatalf("first call: %+v %v", d, err)
	}
	held := d.Remaining // the share left after this call
	peek := func() int64 {
		t.Helper()
		p := req
		p.Cost = 0
		d, err := home.Apply(ctx, sluice.OpPeek, p)
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}
	before := peek()
	if before != 100-held-1 {
		t.Fatalf("home has %d left, want 100 - %d held - 1 spent", before, held)
	}
	s.Sweep(ctx) // not idle yet: nothing goes back
	if got := peek(); got != before {
		t.Fatalf("home has %d after an early sweep, want %d", got, before)
	}
	clk.Advance(region.DefaultIdleAfter + time.Millisecond)
	s.Sweep(ctx)
	after := peek()
	t.Logf("held %d; home left %d before the sweep, %d after", held, before, after)
	if after < before+held {
		t.Fatalf("home has %d after the idle sweep, want ≥ %d (+%d refunded)", after, before+held, held)
	}
	if st := s.Stats(); st.Refunded != uint64(held) {
		t.Fatalf("refunded %d units, want %d", st.Refunded, held)
	}
	// The share is empty now: the next call fetches again.
	if d, err := s.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed {
		t.Fatalf("after the refund: %+v %v", d, err)
	}
}

// A fixed window's share ends with its window: units fetched in one
// window are never spent in the next, where the home starts afresh.
func TestWindowShareEndsWithWindow(t *testing.T) {
	s, home, clk, prefix := fakeRegions(t)
	ctx := context.Background()
	// Start a second into an hour-long window.
	clk.Set(time.Date(2030, 1, 1, 1, 0, 1, 0, time.UTC))
	req := sluice.Request{Key: prefix + "win", Algorithm: sluice.FixedWindow, Limit: sluice.Limit{Rate: 10, Period: time.Hour}, Cost: 1}
	d, err := s.Apply(ctx, sluice.OpAllow, req)
	if err != nil || !d.Allowed || d.Source != sluice.FromShare {
		t.Fatalf("first call: %+v %v", d, err)
	}
	if d.ResetAfter > time.Hour-time.Second || d.ResetAfter < time.Hour-2*time.Second {
		t.Fatalf("share ends in %s, want the window's end, 59m59s away", d.ResetAfter)
	}
	held := d.Remaining
	if held == 0 {
		t.Fatal("the fetch took one unit only")
	}
	// Next window: the share held is void; what is spent now is a share
	// of the new window, charged in it at home.
	clk.Set(time.Date(2030, 1, 1, 2, 0, 0, 0, time.UTC))
	d, err = s.Apply(ctx, sluice.OpAllow, req)
	if err != nil || !d.Allowed {
		t.Fatalf("first call of the next window: %+v %v", d, err)
	}
	p := req
	p.Cost = 0
	hd, err := home.Apply(ctx, sluice.OpPeek, p)
	if err != nil {
		t.Fatal(err)
	}
	// The home's new window holds only the new fetch: 10 less it.
	if taken := 10 - hd.Remaining; taken != d.Remaining+1 {
		t.Fatalf("the home's new window gave %d, the region holds %d and spent 1: the old window's %d units were carried over", taken, d.Remaining, held)
	}
}
