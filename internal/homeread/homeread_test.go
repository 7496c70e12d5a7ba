package homeread_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/homeread"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/internal/regiontest"
	"github.com/sluice-io/sluice/region"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// peeks counts the peeks a region's store sends to a home.
type peeks struct {
	sluice.Store
	n atomic.Int64
}

func (p *peeks) Apply(ctx context.Context, op sluice.Op, req sluice.Request) (sluice.Decision, error) {
	if op == sluice.OpPeek {
		p.n.Add(1)
	}
	return p.Store.Apply(ctx, op, req)
}

// The cache's bounds, on us's store of the World (eu the home): a key's
// answer is read once per Reuse, by the cache's clock; at most MaxKeys
// keys are kept, and a key past them answers nothing (the caller's
// share figure) until a kept one is older than Reuse; a regional key has
// no home to read; without a region store nothing is read.
func TestCacheBounds(t *testing.T) {
	w := regiontest.NewWorld(t)
	home := &peeks{}
	rs := w.Store(t, "us", func(o *region.Options) {
		home.Store = o.Regions["eu"]
		o.Regions["eu"] = home
	})
	var now atomic.Int64
	now.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	c := homeread.New(rs, homeread.Options{MaxKeys: 2, Timeout: 10 * time.Second, Now: func() time.Time { return time.Unix(0, now.Load()) }})
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	req := func(name string) sluice.Request {
		return sluice.Request{Key: region.GlobalKey("eu", "{"+prefix+"}:"+name), Algorithm: sluice.TokenBucket, Limit: sluice.Limit{Rate: 100, Period: time.Minute}}
	}
	for range 3 {
		if d, ok := c.Get(ctx, req("a")); !ok || d.Remaining != 100 {
			t.Fatalf("a: %+v %v", d, ok)
		}
	}
	if _, ok := c.Get(ctx, req("b")); !ok {
		t.Fatal("b: not read")
	}
	if n := home.n.Load(); n != 2 {
		t.Fatalf("%d reads for a three times and b, want 2", n)
	}
	if _, ok := c.Get(ctx, req("c")); ok || home.n.Load() != 2 {
		t.Fatalf("a third key past MaxKeys 2 was read (%d reads)", home.n.Load())
	}
	now.Add(int64(homeread.DefaultReuse))
	if _, ok := c.Get(ctx, req("c")); !ok || home.n.Load() != 3 {
		t.Fatalf("c once a and b aged: %d reads", home.n.Load())
	}
	if _, ok := c.Get(ctx, sluice.Request{Key: prefix + ":regional", Algorithm: sluice.TokenBucket, Limit: sluice.Limit{Rate: 1, Period: time.Second}}); ok {
		t.Fatal("a regional key read at a home")
	}
	var none *homeread.Cache
	if none.Enabled() || homeread.New(nil, homeread.Options{}).Enabled() {
		t.Fatal("a cache without a region store reads")
	}
}

// Merge adds the home's remaining to the share's, within the capacity,
// and admits when the share admits or the home has the cost left.
func TestMerge(t *testing.T) {
	share := sluice.Decision{Remaining: 3, ResetAfter: time.Second, RetryAfter: time.Second, Source: sluice.FromShare}
	d := homeread.Merge(share, sluice.Decision{Allowed: true, Remaining: 6, ResetAfter: time.Minute}, 5, 8)
	if !d.Allowed || d.Remaining != 8 || d.ResetAfter != time.Minute || d.RetryAfter != 0 || d.Source != sluice.FromShare {
		t.Fatalf("%+v", d)
	}
	// Cost 7: neither the share (3) nor the home (6) has it.
	d = homeread.Merge(share, sluice.Decision{Allowed: true, Remaining: 6, ResetAfter: time.Minute}, 7, 8)
	if d.Allowed || d.Remaining != 8 || d.RetryAfter != time.Second {
		t.Fatalf("%+v", d)
	}
	d = homeread.Merge(sluice.Decision{Remaining: -2}, sluice.Decision{Remaining: 0}, 1, 8)
	if d.Allowed || d.Remaining != 0 {
		t.Fatalf("%+v", d)
	}
}
