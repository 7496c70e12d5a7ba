package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/lease"
	"github.com/sluice-io/sluice/storetest"
)

// TestLeasedKeyStillValidated: once a key is leased, its OpAllow skips
// Validate's limit checks (the lease's limit was checked already), but a
// request that Validate rejects is still rejected with Validate's error,
// charging nothing: a cost past the burst, a cost of 0, an AdmittedAgo on
// an OpAllow.
func TestLeasedKeyStillValidated(t *testing.T) {
	clk := clock.NewFake(storetest.T0)
	s := newLease(t, lease.Options{All: true, Store: newMem(t, clk), Clock: clk, SweepEvery: -1})
	lim := sluice.Limit{Rate: 10_000, Period: time.Second, Burst: 2000}
	req := sluice.Request{Key: "hot", Algorithm: sluice.GCRA, Limit: lim, Cost: 1}
	if _, local := drive(t, s, clk, req, 5, time.Millisecond, 200*time.Millisecond); local == 0 {
		t.Fatal("the key was never leased")
	}
	ctx := context.Background()
	before, _ := s.Apply(ctx, sluice.OpPeek, req)
	for _, c := range []struct {
		name string
		mod  func(*sluice.Request)
		want error
	}{
		{"cost past the burst", func(r *sluice.Request) { r.Cost = lim.Burst + 1 }, sluice.ErrCostExceedsBurst},
		{"cost 0", func(r *sluice.Request) { r.Cost = 0 }, sluice.ErrInvalidCost},
		{"negative cost", func(r *sluice.Request) { r.Cost = -3 }, sluice.ErrInvalidCost},
		{"AdmittedAgo on OpAllow", func(r *sluice.Request) { r.AdmittedAgo = time.Second }, sluice.ErrInvalidRequest},
	} {
		r := req
		c.mod(&r)
		want := r.Validate(sluice.OpAllow)
		if want == nil {
			t.Fatalf("%s: Validate accepts it; the case tests nothing", c.name)
		}
		d, err := s.Apply(ctx, sluice.OpAllow, r)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: Apply = %+v, %v; want %v (Validate: %v)", c.name, d, err, c.want, want)
		}
	}
	if after, _ := s.Apply(ctx, sluice.OpPeek, req); after.Remaining != before.Remaining {
		t.Fatalf("rejected requests charged: remaining %d, was %d", after.Remaining, before.Remaining)
	}
	// A valid request on the leased key is decided from the lease.
	if d, err := s.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed || d.Source != sluice.FromLease {
		t.Fatalf("valid request: %+v %v", d, err)
	}
}
