package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
)

// PlainLayoutOnly: a store across a slow link (a region.Store's store of
// another region) counts a fixed window in the per-window layout of the
// instances near the Redis, decided by the scripts, and starts no clock
// sampler (whose TIME reads, 80 ms at most, broke a connection across
// regions every second). Without the layout, its fetches charged another
// key than the near instances' checks, and each side admitted the limit.
func TestPlainLayoutOnly(t *testing.T) {
	url := redistest.Standalone(t).URL()
	near := newStore(t, Options{URL: url, PlainWindows: true})
	far := newStore(t, Options{URL: url, PlainWindows: true, PlainLayoutOnly: true})
	if far.clocks.stop != nil || near.clocks.stop == nil {
		t.Fatalf("clock samplers: far %v, near %v; want the near store's only", far.clocks.stop != nil, near.clocks.stop != nil)
	}
	ctx := context.Background()
	req := sluice.Request{Key: redistest.Prefix(t) + "{w}", Algorithm: sluice.FixedWindow, Limit: sluice.Limit{Rate: 10, Period: time.Hour}, Cost: 1}
	waitPlain(t, near, req.Key)
	for range 3 {
		if d, err := near.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed {
			t.Fatalf("near: %+v %v", d, err)
		}
	}
	fetch := req
	fetch.Cost = 4
	if d, err := far.Apply(ctx, sluice.OpAllow, fetch); err != nil || !d.Allowed || d.Remaining != 3 {
		t.Fatalf("far's fetch of 4 after 3 near: %+v %v, want 3 left", d, err)
	}
	if d, err := far.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed || d.Remaining != 2 {
		t.Fatalf("far's cost 1: %+v %v, want 2 left (by the scripts)", d, err)
	}
	peek := req
	peek.Cost = 0
	if d, err := near.Apply(ctx, sluice.OpPeek, peek); err != nil || d.Remaining != 2 {
		t.Fatalf("near after far's 5: %+v %v, want 2 left", d, err)
	}
	if st := far.Stats(); st.Plain != 0 {
		t.Fatalf("far took the plain path %d times", st.Plain)
	}
}
