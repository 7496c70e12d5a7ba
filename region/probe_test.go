package region_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/redisstore"
	"github.com/sluice-io/sluice/region"
)

// Held sums the live shares of the keys an instance tracks, by the
// ledger's clock, and counts debts; an expired share holds nothing.
func TestHeld(t *testing.T) {
	s, home, clk, prefix := fakeRegions(t)
	ctx := context.Background()
	req := sluice.Request{Key: prefix + "held", Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 1, Period: time.Hour, Burst: 1}, Cost: 1}
	// The home spent: the region's fetch comes back empty, and the next
	// waits an hour, so the share is only what the test writes.
	if d, err := home.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed {
		t.Fatalf("home: %+v %v", d, err)
	}
	if d, err := s.Apply(ctx, sluice.OpAllow, req); err != nil || d.Allowed {
		t.Fatalf("from an empty home: %+v %v", d, err)
	}
	client := home.(*redisstore.Store).Client() // one redis-server holds both regions here
	set := func(n int64, exp time.Time) {
		t.Helper()
		cmd := client.B().Hset().Key(region.DefaultPrefix+req.Key).FieldValue().
			FieldValue("n", strconv.FormatInt(n, 10)).FieldValue("exp", strconv.FormatInt(exp.UnixMilli(), 10)).Build()
		if err := client.Do(ctx, cmd).Error(); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Unix(0, clk.Now())
	for _, c := range []struct {
		n    int64
		exp  time.Time
		want region.Held
	}{
		{7, now.Add(time.Minute), region.Held{Shares: 1, Units: 7, Read: 1}},
		{-2, now.Add(time.Minute), region.Held{Debts: 1, Read: 1}},
		{5, now.Add(-time.Millisecond), region.Held{Read: 1}},
	} {
		set(c.n, c.exp)
		h, err := s.Held(ctx, 10)
		if err != nil || h != c.want {
			t.Errorf("share %d until %s: %+v %v, want %+v", c.n, c.exp.Sub(now), h, err, c.want)
		}
	}
	if h, err := s.Held(ctx, 0); err != nil || h.Read != 0 {
		t.Errorf("none asked: %+v %v", h, err)
	}
}
