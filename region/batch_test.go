package region_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/region"
)

// A tier's check is one batch, all or nothing: a global key of another
// home (spent from us's share) with a regional key. When the regional key
// denies, the global key's unit goes back to its share; when the global
// key's share is spent, the regional key is not charged.
func TestBatchAllOrNothing(t *testing.T) {
	w := newWorld(t, worldOpts{home: "eu", region: func(o *region.Options) {
		// One fetch takes the whole limit: the share is what the test
		// counts, with no fetch racing it.
		o.MaxFraction, o.Horizon = 1, time.Hour
	}})
	s := w.inst["us"][0]
	ctx := context.Background()
	t0 := time.Now()
	defer func() { t.Logf("took %s", time.Since(t0)) }()
	win := sluice.Limit{Rate: 5, Period: time.Hour}
	g := sluice.Request{Key: w.global + "tier", Algorithm: sluice.FixedWindow, Limit: win, Cost: 1}
	r := sluice.Request{Key: w.global[:len(w.global)-2] + "r:tier", Algorithm: sluice.FixedWindow, Limit: sluice.Limit{Rate: 3, Period: time.Hour}, Cost: 1}
	batch := func() []sluice.Decision {
		t.Helper()
		ds, err := s.ApplyAll(ctx, sluice.OpAllow, []sluice.Request{g, r})
		if err != nil {
			t.Fatal(err)
		}
		return ds
	}
	for i := range 3 {
		if ds := batch(); !ds[0].Allowed || !ds[1].Allowed {
			t.Fatalf("batch %d: %+v", i, ds)
		}
	}
	ds := batch()
	if ds[1].Allowed || !ds[0].Allowed {
		t.Fatalf("4th batch: want the regional key alone to deny, got %+v", ds)
	}
	if ds[0].Source != sluice.FromShare {
		t.Fatalf("global key decided by %s, want share", ds[0].Source)
	}
	// The denied batch gave its global unit back: 2 of 5 are left.
	for i := range 2 {
		d, err := s.Apply(ctx, sluice.OpAllow, g)
		if err != nil || !d.Allowed {
			t.Fatalf("global alone %d: %+v %v (the denied batch kept its unit)", i, d, err)
		}
	}
	if d, err := s.Apply(ctx, sluice.OpAllow, g); err != nil || d.Allowed {
		t.Fatalf("6th global unit: %+v %v", d, err)
	}
	// Global spent: a batch with a fresh regional key charges nothing.
	r2 := r
	r2.Key += "2"
	ds = batch2(t, s, g, r2)
	if ds[0].Allowed || !ds[1].Allowed {
		t.Fatalf("want the global key alone to deny, got %+v", ds)
	}
	if d, err := s.Apply(ctx, sluice.OpPeek, r2); err != nil || d.Remaining != 3 {
		t.Fatalf("regional key after a denied batch: %+v %v, want 3 left", d, err)
	}
}

func batch2(t *testing.T, s *region.Store, a, b sluice.Request) []sluice.Decision {
	t.Helper()
	ds, err := s.ApplyAll(context.Background(), sluice.OpAllow, []sluice.Request{a, b})
	if err != nil {
		t.Fatal(err)
	}
	return ds
}
