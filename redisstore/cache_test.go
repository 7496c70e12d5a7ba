package redisstore

import (
	"context"
	"testing"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
)

// 10,000 denied ApplyAll checks on one hot key (the Envoy, AllowAll and
// gateway path) cost Redis a handful of calls, as Apply's do; a batch
// holding the denied key and another is denied without charging the other.
func TestDenyCacheAnswersBatches(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newStore(t, Options{URL: srv.URL()})
	ctx := context.Background()
	p := redistest.Prefix(t)
	hot := sluice.Request{Key: p + "{t}:hot", Algorithm: sluice.FixedWindow, Limit: sluice.PerHour(5), Cost: 1}
	other := sluice.Request{Key: p + "{t}:other", Algorithm: sluice.GCRA, Limit: sluice.PerHour(100), Cost: 1}
	for range 5 {
		if d, _, err := sluice.AllowAll(ctx, s, []sluice.Request{hot}); err != nil || !d.Allowed {
			t.Fatalf("warm-up: %+v %v", d, err)
		}
	}
	before := scriptCalls(t, srv)
	hits := s.Stats().CacheHits
	for i := range 10_000 {
		d, ds, err := sluice.AllowAll(ctx, s, []sluice.Request{hot})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed || d.RetryAfter <= 0 || d.Remaining != 0 || len(ds) != 1 {
			t.Fatalf("check %d: %+v", i, d)
		}
		if i > 0 && d.Source != sluice.FromCache {
			t.Fatalf("check %d: source %s, want cache", i, d.Source)
		}
	}
	calls := scriptCalls(t, srv) - before
	t.Logf("10000 denied batches: %d Redis script calls, %d cache hits", calls, s.Stats().CacheHits-hits)
	if calls > 5 {
		t.Fatalf("%d Redis calls for 10000 denied batches, want at most 5", calls)
	}

	// The batch is all or nothing: the other member is not charged, only
	// peeked (one call per batch), so its decision is what a denied batch
	// reports for it.
	before = scriptCalls(t, srv)
	for range 100 {
		d, ds, err := sluice.AllowAll(ctx, s, []sluice.Request{other, hot})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed || d.Source != sluice.FromCache || d.Limit != hot.Limit || d.RetryAfter <= 0 {
			t.Fatalf("mixed batch: %+v", d)
		}
		if !ds[0].Allowed || ds[0].Source != sluice.FromStore || ds[0].Remaining != 100 || ds[1].Allowed || ds[1].Source != sluice.FromCache {
			t.Fatalf("mixed batch members: %+v", ds)
		}
	}
	if n := scriptCalls(t, srv) - before; n != 100 {
		t.Fatalf("100 mixed batches made %d Redis calls, want 100 peeks", n)
	}
	if d, err := s.Apply(ctx, sluice.OpPeek, other); err != nil || d.Remaining != 100 {
		t.Fatalf("other after denied batches: %+v %v, want 100 remaining (never charged)", d, err)
	}

	// A refund in a batch drops the entry: the next batch asks Redis.
	if _, err := s.ApplyAll(ctx, sluice.OpRefund, []sluice.Request{hot}); err != nil {
		t.Fatal(err)
	}
	before = scriptCalls(t, srv)
	if d, _, err := sluice.AllowAll(ctx, s, []sluice.Request{other, hot}); err != nil || !d.Allowed || d.Source != sluice.FromStore {
		t.Fatalf("after refund: %+v %v, want allowed by the store", d, err)
	}
	if n := scriptCalls(t, srv) - before; n != 1 {
		t.Fatalf("after refund: %d Redis calls, want 1", n)
	}
}

// A denial learnt in a batch is cached only when the key's own limit
// denied it: a key charged twice in one batch may be denied by its own
// first charge, and must not be cached as over its limit.
func TestDenyCacheSkipsRepeatedKeys(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newStore(t, Options{URL: srv.URL()})
	ctx := context.Background()
	k := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.GCRA, Limit: sluice.PerHour(1), Cost: 1}
	if d, _, err := sluice.AllowAll(ctx, s, []sluice.Request{k, k}); err != nil || d.Allowed {
		t.Fatalf("double charge of a 1/h limit: %+v %v, want denied", d, err)
	}
	if d, _, err := sluice.AllowAll(ctx, s, []sluice.Request{k}); err != nil || !d.Allowed || d.Source != sluice.FromStore {
		t.Fatalf("single charge after a denied double: %+v %v, want allowed by the store", d, err)
	}
	// Now it is over its limit, and that is cached.
	if d, _, err := sluice.AllowAll(ctx, s, []sluice.Request{k}); err != nil || d.Allowed {
		t.Fatalf("second charge: %+v %v", d, err)
	}
	if d, _, err := sluice.AllowAll(ctx, s, []sluice.Request{k}); err != nil || d.Allowed || d.Source != sluice.FromCache {
		t.Fatalf("third charge: %+v %v, want a cached denial", d, err)
	}
}
