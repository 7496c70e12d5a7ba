package region_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
)

// A calendar window (a gateway's budget per day in a time zone) is
// global as a periodic window is: its share ends with the local day, by
// the home's calendar, and units fetched in one day are never spent in
// the next.
func TestCalendarShareEndsWithItsDay(t *testing.T) {
	s, home, clk, prefix := fakeRegions(t)
	ctx := context.Background()
	lim, err := sluice.ParseLimit("10/day in Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	// 23:00:01 in Berlin: its day ends at 23:00 UTC, an hour before the
	// UTC day does.
	clk.Set(time.Date(2030, 1, 1, 22, 0, 1, 0, time.UTC))
	req := sluice.Request{Key: prefix + "cal", Algorithm: sluice.FixedWindow, Limit: lim, Cost: 1}
	d, err := s.Apply(ctx, sluice.OpAllow, req)
	if err != nil || !d.Allowed || d.Source != sluice.FromShare {
		t.Fatalf("first call: %+v %v", d, err)
	}
	if d.ResetAfter > time.Hour-time.Second || d.ResetAfter < time.Hour-2*time.Second {
		t.Fatalf("share ends in %s, want Berlin's midnight, 59m59s away", d.ResetAfter)
	}
	held := d.Remaining
	clk.Set(time.Date(2030, 1, 1, 23, 0, 0, 0, time.UTC)) // Berlin's midnight
	d, err = s.Apply(ctx, sluice.OpAllow, req)
	if err != nil || !d.Allowed {
		t.Fatalf("first call of the next day: %+v %v", d, err)
	}
	p := req
	p.Cost = 0
	hd, err := home.Apply(ctx, sluice.OpPeek, p)
	if err != nil {
		t.Fatal(err)
	}
	if taken := 10 - hd.Remaining; taken != d.Remaining+1 {
		t.Fatalf("the home's new day gave %d, the region holds %d and spent 1: the old day's %d units were carried over", taken, d.Remaining, held)
	}
}
