package region_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/redisstore"
	"github.com/sluice-io/sluice/region"
)

// PeekHome reads a global key's state at its home, changing nothing: what
// the home has left once the region's share was charged there, while a
// peek in the region says what its share holds.
func TestPeekHome(t *testing.T) {
	s, home, _, prefix := fakeRegions(t)
	ctx := context.Background()
	req := sluice.Request{Key: prefix + "peekhome", Algorithm: sluice.FixedWindow, Limit: sluice.Limit{Rate: 100, Period: time.Hour}, Cost: 10}
	if d, err := s.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed || d.Source != sluice.FromShare {
		t.Fatalf("allow: %+v %v", d, err)
	}
	req.Cost = 0
	share, err := s.Apply(ctx, sluice.OpPeek, req)
	if err != nil {
		t.Fatal(err)
	}
	want, err := home.Apply(ctx, sluice.OpPeek, req)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // a peek changes nothing
		got, err := s.PeekHome(ctx, req)
		if err != nil || got.Remaining != want.Remaining || got.Source == sluice.FromShare {
			t.Fatalf("PeekHome: %+v %v; the home says %+v", got, err, want)
		}
	}
	if want.Remaining+share.Remaining+10 != 100 {
		t.Fatalf("home %d left, share %d, 10 spent: not the window's 100", want.Remaining, share.Remaining)
	}
}

// A key with no home is refused: a regional key (Options.Global says
// no), an asynchronous one.
func TestPeekHomeNotHomed(t *testing.T) {
	srv := redistest.Standalone(t)
	st, err := redisstore.New(context.Background(), redisstore.Options{URL: srv.URL(), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	s, err := region.New(region.Options{Region: "us", Regions: map[string]sluice.Store{"us": st, "eu": st}, Ledger: st.Client(),
		Global:       func(r *sluice.Request) bool { return r.Key != "regional" },
		Async:        func(r *sluice.Request) bool { return r.Key == "async" },
		SweepEvery:   -1,
		SyncInterval: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	for _, k := range []string{"regional", "async"} {
		req := sluice.Request{Key: k, Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 10, Period: time.Second}}
		if _, err := s.PeekHome(context.Background(), req); !errors.Is(err, region.ErrNotHomed) {
			t.Errorf("%s: %v", k, err)
		}
	}
}
