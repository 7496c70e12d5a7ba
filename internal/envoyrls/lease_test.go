package envoyrls

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/lease"
	"github.com/sluice-io/sluice/redisstore"
)

// Descriptors with `lease: true` are decided from leased capacity: a hot
// one under its limit costs Redis a few calls for many requests; a
// descriptor without it still makes one call per request. A key over its
// limit costs fewer than 0.01 calls per request, and it is the Redis
// store's over-limit cache that answers it (store.local_cache), not the
// lease: docs/envoy.md says so.
func TestLeasedDescriptors(t *testing.T) {
	srv := redistest.Standalone(t)
	var rs *redisstore.Store
	var ls *lease.Store
	e := newEnv(t, func(t *testing.T, _ *clock.Fake) sluice.Store {
		rs = openRedis(t, srv.URL(), nil).(*redisstore.Store)
		l, err := lease.New(lease.Options{Store: rs})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		ls = l
		return l
	}, "testdata/lease", nil)
	run := func(key string, n int, want rlsv3.RateLimitResponse_Code) (calls int64, last *rlsv3.RateLimitResponse) {
		t.Helper()
		before := scriptCalls(t, srv)
		for range n {
			last = e.call("lease", desc(key, "x"))
		}
		if last.GetOverallCode() != want {
			t.Fatalf("%s: %s, want %s", key, last.GetOverallCode(), want)
		}
		return scriptCalls(t, srv) - before, last
	}
	hot, _ := run("hot", 2000, rlsv3.RateLimitResponse_OK)
	plain, _ := run("plain", 200, rlsv3.RateLimitResponse_OK)
	run("over", 1000, rlsv3.RateLimitResponse_OK) // the hour's 1000
	// over runs n requests of a key already at its limit and returns the
	// Redis calls they made and how many the store's over-limit cache and
	// the lease answered.
	overRun := func(key string, n int) (calls int64, cache, hits uint64, last *rlsv3.RateLimitResponse) {
		t.Helper()
		cache0, hits0 := rs.Stats().CacheHits, ls.Stats().Hits
		calls, last = run(key, n, rlsv3.RateLimitResponse_OVER_LIMIT)
		return calls, rs.Stats().CacheHits - cache0, ls.Stats().Hits - hits0, last
	}
	over, cache, hits, last := overRun("over", 2000)
	t.Logf("over: %d Redis calls for 2000, the over-limit cache answered %d, the lease %d", over, cache, hits)
	if hits < 2000-20 {
		t.Errorf("over (leased, held by the lease): the lease answered %d of 2000, the over-limit cache %d", hits, cache)
	}
	// Which mechanism answers a key over its limit: the lease for a key
	// it holds (over, overfw), the store's over-limit cache for every
	// other (overplain: no lease; oversmall: a limit too small to lease).
	for _, c := range []struct {
		key   string
		limit int
		lease bool
	}{{"overfw", 1000, true}, {"overplain", 1000, false}, {"oversmall", 2, false}} {
		run(c.key, c.limit, rlsv3.RateLimitResponse_OK)
		calls, cache, hits, _ := overRun(c.key, 2000)
		t.Logf("%s: %d Redis calls for 2000 over the limit, the over-limit cache answered %d, the lease %d", c.key, calls, cache, hits)
		if answered := map[bool]uint64{true: hits, false: cache}[c.lease]; calls > 20 || answered < 2000-20 {
			t.Errorf("%s over its limit: %d Redis calls, the over-limit cache answered %d of 2000, the lease %d (want the lease: %v)", c.key, calls, cache, hits, c.lease)
		}
	}
	t.Logf("Redis script calls: hot %d for 2000, plain %d for 200, over the limit %d for 2000", hot, plain, over)
	if hot > 200 {
		t.Errorf("hot leased descriptor: %d Redis calls for 2000 requests", hot)
	}
	// (plus the idle return of the hot descriptor's chunk, made meanwhile)
	if plain < 200 || plain > 202 {
		t.Errorf("descriptor without lease: %d Redis calls for 200 requests, want 200", plain)
	}
	if over > 20 {
		t.Errorf("over the limit: %d Redis calls for 2000 requests, want ≤ 20 (0.01 per request)", over)
	}
	if st := last.GetStatuses()[0]; st.GetLimitRemaining() != 0 || st.GetDurationUntilReset().AsDuration() <= 0 {
		t.Errorf("over-limit status: %v", st)
	}
}
