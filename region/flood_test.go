package region_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/region"
)

// TestGlobalKeyFloodEvicted: an instance tracking MaxKeys exact global
// keys (here one, filled by one client's key) makes room for a new key at
// once when a tracked key has no fetch in flight and was last used two
// fetch round trips ago (at least 100ms): one client's flood of new keys
// denies another client's new key for a fetch round, not until the sweep
// forgets idle keys (IdleAfter: an hour here, and no sweep runs).
func TestGlobalKeyFloodEvicted(t *testing.T) {
	s, _, clk, prefix := fakeRegionsWith(t, func(o *region.Options) {
		o.MaxKeys = 1
		o.IdleAfter = time.Hour
	})
	ctx := context.Background()
	lim := sluice.Limit{Rate: 10, Period: time.Minute, Burst: 10}
	flood := sluice.Request{Key: prefix + "flood:1", Algorithm: sluice.GCRA, Limit: lim, Cost: 1}
	if d, err := s.Apply(ctx, sluice.OpAllow, flood); err != nil || !d.Allowed {
		t.Fatalf("the flood's key: %+v %v", d, err)
	}
	other := flood
	other.Key = prefix + "other"
	// Within a round of the flood key's use, it holds the table: the new
	// key is not tracked, has no share and cannot fetch.
	if d, err := s.Apply(ctx, sluice.OpAllow, other); err != nil || d.Allowed {
		t.Fatalf("a key past MaxKeys while the flood's is in use: %+v %v, want denied", d, err)
	}
	clk.Advance(100 * time.Millisecond)
	if d, err := s.Apply(ctx, sluice.OpAllow, other); err != nil || !d.Allowed || d.Source != sluice.FromShare {
		t.Fatalf("another client's key a round after the flood's: %+v %v, want admitted from a share", d, err)
	}
	if n := s.Stats().Keys; n != 1 {
		t.Fatalf("%d keys tracked, want 1 (MaxKeys)", n)
	}
	// The flood's key, back within the round, waits for the other's
	// round in turn: it still has its share in the region's Redis.
	if d, err := s.Apply(ctx, sluice.OpAllow, flood); err != nil || !d.Allowed {
		t.Fatalf("the flood's key from its share: %+v %v", d, err)
	}
}

// An evicted key's share is not stranded: the sweep refunds it at home
// once it went unspent for IdleAfter, as a tracked key's.
func TestEvictedShareRefunded(t *testing.T) {
	s, home, clk, prefix := fakeRegionsWith(t, func(o *region.Options) { o.MaxKeys = 1 })
	ctx := context.Background()
	lim := sluice.Limit{Rate: 10, Period: time.Minute, Burst: 100}
	flood := sluice.Request{Key: prefix + "flood:1", Algorithm: sluice.GCRA, Limit: lim, Cost: 1}
	d, err := s.Apply(ctx, sluice.OpAllow, flood)
	if err != nil || !d.Allowed {
		t.Fatalf("the flood's key: %+v %v", d, err)
	}
	held := d.Remaining
	clk.Advance(region.EvictAfter)
	other := flood
	other.Key = prefix + "other"
	if d, err := s.Apply(ctx, sluice.OpAllow, other); err != nil || !d.Allowed {
		t.Fatalf("another key a round later: %+v %v", d, err)
	}
	clk.Advance(region.DefaultIdleAfter)
	s.Sweep(ctx)
	p := flood
	p.Cost = 0
	got, err := home.Apply(ctx, sluice.OpPeek, p)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(100 - 1); got.Remaining < want {
		t.Fatalf("home holds %d of the evicted key, want ≥ %d (its share of %d refunded)", got.Remaining, want, held)
	}
}
