package region_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
)

// A fixed window's refund outside the home goes back to the region's
// share only when the charge it undoes was taken from that share's
// window (Request.ReservedAhead: the charge's ResetAfter less the time
// since). A refund racing the window's end, landing after the region
// fetched the next window's share, is dropped: the next window's units
// were charged at home for that window only, and giving the old charge
// back to them would let the region spend more in it than the home
// charged. The fake clock does not move while a fetch runs, so the share
// ends exactly with the home's window.
func TestWindowRefundRacesTheTurn(t *testing.T) {
	s, home, clk, prefix := fakeRegions(t)
	ctx := context.Background()
	req := sluice.Request{Key: prefix + "winrefund", Algorithm: sluice.FixedWindow, Limit: sluice.Limit{Rate: 100, Period: time.Hour}, Cost: 10}
	held := func() int64 {
		t.Helper()
		p := req
		p.Cost = 0
		d, err := s.Apply(ctx, sluice.OpPeek, p)
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}
	refund := func(cost int64, ahead time.Duration) {
		t.Helper()
		r := req
		r.Cost, r.ReservedAhead = cost, ahead
		if d, err := s.Apply(ctx, sluice.OpRefund, r); err != nil || !d.Allowed {
			t.Fatalf("refund: %+v %v", d, err)
		}
	}
	// 100ms before the hour's end.
	clk.Set(time.Date(2030, 1, 1, 1, 59, 59, 900_000_000, time.UTC))
	d, err := s.Apply(ctx, sluice.OpAllow, req)
	if err != nil || !d.Allowed || d.Source != sluice.FromShare {
		t.Fatalf("first call: %+v %v", d, err)
	}
	if d.ResetAfter != 100*time.Millisecond {
		t.Fatalf("share ends in %s, want 100ms (the window's end)", d.ResetAfter)
	}
	at, reset := clk.Now(), d.ResetAfter
	// 50ms later, in the same window: 7 of the 10 go back to the share.
	clk.Advance(50 * time.Millisecond)
	before := held()
	refund(7, reset-time.Duration(clk.Now()-at))
	if got := held(); got != before+7 {
		t.Fatalf("a refund within its window: share %d, want %d", got, before+7)
	}
	// A second charge of this window, settled only after the turn.
	d, err = s.Apply(ctx, sluice.OpAllow, req)
	if err != nil || !d.Allowed {
		t.Fatalf("second call: %+v %v", d, err)
	}
	at, reset = clk.Now(), d.ResetAfter
	// 60ms later: the next window. Its first call fetches the new
	// window's share, charged at home in the new window.
	clk.Advance(60 * time.Millisecond)
	d, err = s.Apply(ctx, sluice.OpAllow, req)
	if err != nil || !d.Allowed {
		t.Fatalf("first call of the next window: %+v %v", d, err)
	}
	next := held()
	p := req
	p.Cost = 0
	hd, err := home.Apply(ctx, sluice.OpPeek, p)
	if err != nil {
		t.Fatal(err)
	}
	charged := 100 - hd.Remaining // what the home charged in the new window
	if charged != next+10 {
		t.Fatalf("the home charged %d in the new window, the region holds %d and spent 10", charged, next)
	}
	// The old charge's refund lands now: its window ended (ResetAfter
	// less the time since is negative: 1ns, as a caller sends it). It
	// is dropped; given to the new share it would let the region spend
	// charged + 9 units in a window the home charged for `charged`.
	refund(9, max(reset-time.Duration(clk.Now()-at), 1))
	if got := held(); got != next {
		t.Fatalf("a refund of the ended window changed the new window's share from %d to %d", next, got)
	}
	// A refund that names no window is dropped too, as before.
	refund(3, 0)
	if got := held(); got != next {
		t.Fatalf("a refund naming no window changed the share from %d to %d", next, got)
	}
	// The new window's own charge is given back.
	refund(4, d.ResetAfter)
	if got := held(); got != next+4 {
		t.Fatalf("a refund of the new window's charge: share %d, want %d", got, next+4)
	}
}
