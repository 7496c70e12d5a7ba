package envoyrls

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/lease"
)

// Descriptors with `lease: true` are decided from leased capacity: a hot
// one under its limit costs Redis a few calls for many requests, one over
// its limit fewer than 0.01 per request; a descriptor without it still
// makes one call per request.
func TestLeasedDescriptors(t *testing.T) {
	srv := redistest.Standalone(t)
	e := newEnv(t, func(t *testing.T, _ *clock.Fake) sluice.Store {
		l, err := lease.New(lease.Options{Store: openRedis(t, srv.URL(), nil)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
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
	over, last := run("over", 2000, rlsv3.RateLimitResponse_OVER_LIMIT)
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
