package redisstore

import (
	"context"
	"testing"
	"time"
	_ "time/tzdata"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
)

// calendarDay returns 10 per local day in Pacific/Kiritimati (UTC+14), and
// the end of the window that holds now; it skips the test when a boundary
// is too near for the test's timing to be unambiguous.
func calendarDay(t *testing.T, now time.Time) (sluice.Limit, time.Time) {
	t.Helper()
	loc, err := sluice.LoadLocation("Pacific/Kiritimati")
	if err != nil {
		t.Fatal(err)
	}
	l := sluice.PerCalendar(10, sluice.Calendar{Unit: sluice.Day, Location: loc})
	start, end := l.Calendar.Window(now)
	if now.Sub(start) < time.Minute || end.Sub(now) < time.Minute {
		t.Skip("too near a local midnight in Kiritimati")
	}
	return l, end
}

// checkCalendarCalls sends 30 calls through stores in turn: exactly 10 are
// admitted, and each denial waits for the local midnight by Redis's clock,
// whatever the callers' own clocks say.
func checkCalendarCalls(t *testing.T, req sluice.Request, end time.Time, stores ...*Store) {
	t.Helper()
	ctx := context.Background()
	admitted := 0
	for i := range 30 {
		s := stores[i%len(stores)]
		d, err := s.Apply(ctx, sluice.OpAllow, req)
		if err != nil || d.Degraded {
			t.Fatalf("call %d: %+v %v", i, d, err)
		}
		if d.Allowed {
			admitted++
			if i >= 10 {
				t.Fatalf("call %d admitted after the limit of 10", i)
			}
			continue
		}
		// Redis's clock is this machine's: the wait ends at the local
		// midnight give or take the time the calls take.
		if want := time.Until(end); d.RetryAfter > want+time.Second || d.RetryAfter < want-5*time.Second {
			t.Fatalf("call %d: RetryAfter %s, want about %s (to midnight in Kiritimati)", i, d.RetryAfter, want)
		}
	}
	if admitted != 10 {
		t.Fatalf("admitted %d, want exactly 10", admitted)
	}
}

// Two instances whose own clocks are 10s apart share one calendar window
// exactly, in one round trip per call: the boundaries they send cover both.
func TestSkewedClientsAgreeCalendar(t *testing.T) {
	srv := redistest.Standalone(t)
	now := time.Now()
	lim, end := calendarDay(t, now)
	ahead := newStore(t, Options{URL: srv.URL(), DisableDenyCache: true, LocalClock: clock.NewFake(now.Add(5 * time.Second))})
	behind := newStore(t, Options{URL: srv.URL(), DisableDenyCache: true, LocalClock: clock.NewFake(now.Add(-5 * time.Second))})
	req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.FixedWindow, Limit: lim, Cost: 1}
	checkCalendarCalls(t, req, end, ahead, behind)
	if c := ahead.Stats().Calls + behind.Stats().Calls; c != 30 {
		t.Fatalf("%d script calls for 30 decisions, want 30", c)
	}
}

// Clients whose clocks are hours off, on another local day, still count in
// the window that holds Redis's time: the script refuses their boundaries
// and they call again with boundaries around Redis's time.
func TestFarSkewedClientsUseRedisCalendarWindow(t *testing.T) {
	srv := redistest.Standalone(t)
	now := time.Now()
	lim, end := calendarDay(t, now)
	var stores []*Store
	for _, off := range []time.Duration{3 * time.Hour, -30 * time.Hour, 400 * 24 * time.Hour} {
		stores = append(stores, newStore(t, Options{URL: srv.URL(), DisableDenyCache: true, LocalClock: clock.NewFake(now.Add(off))}))
	}
	req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.FixedWindow, Limit: lim, Cost: 1}
	checkCalendarCalls(t, req, end, stores...)
	// The clock 3h ahead may still be in the same local day (its
	// boundaries then hold Redis's time too); the others are a day and a
	// year away.
	for i, s := range stores[1:] {
		if c := s.Stats().Calls; c != 20 {
			t.Fatalf("store %d: %d script calls for 10 decisions, want 20 (each refused once)", i+1, c)
		}
	}
	// A batch mixing a calendar window and a per-minute limit retries as one.
	rpm := sluice.Request{Key: redistest.Prefix(t) + "rpm", Algorithm: sluice.GCRA, Limit: sluice.PerMinute(100), Cost: 1}
	day := req
	day.Key = redistest.Prefix(t) + "day"
	ds, err := stores[1].ApplyAll(context.Background(), sluice.OpAllow, []sluice.Request{rpm, day})
	if err != nil || !ds[0].Allowed || !ds[1].Allowed || ds[1].Remaining != 9 || ds[0].Remaining != 99 {
		t.Fatalf("batch: %+v %v", ds, err)
	}
}
