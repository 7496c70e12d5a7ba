package envoyrls

import (
	"context"
	"os"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/redisstore"
)

func TestMain(m *testing.M) {
	if code, ok := childMain(); ok { // a process of the fairness tests
		os.Exit(code)
	}
	redistest.Main(m)
}

func openRedis(t *testing.T, url string, clk clock.Clock) sluice.Store {
	t.Helper()
	opts := redisstore.Options{URL: url, Timeout: 5 * time.Second}
	if clk != nil {
		opts.Clock = clk // tests drive the time; production reads Redis TIME
	}
	s, err := redisstore.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func redisStore(t *testing.T, clk *clock.Fake) sluice.Store {
	return openRedis(t, redistest.Standalone(t).URL(), clk)
}

func clusterStore(t *testing.T, clk *clock.Fake) sluice.Store {
	return openRedis(t, redistest.SharedCluster(t).URL(), clk)
}

// scriptCalls counts the scripts a Redis server has run.
func scriptCalls(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	var n int64
	for _, cmd := range []string{"evalsha", "eval", "fcall", "evalsha_ro", "eval_ro"} {
		c, err := srv.CommandCalls(context.Background(), cmd)
		if err != nil {
			t.Fatal(err)
		}
		n += c
	}
	return n
}

// TestOneRoundTrip: on Redis a request is one script call, however many
// descriptors it has, allowed or denied.
func TestOneRoundTrip(t *testing.T) {
	srv := redistest.Standalone(t)
	e := newEnv(t, func(t *testing.T, _ *clock.Fake) sluice.Store { return openRedis(t, srv.URL(), nil) }, "testdata/config", nil)
	descs := []*ratelimitv3.RateLimitDescriptor{
		desc("key2", "a"), desc("key2", "value2"), desc("key3", "b"), desc("key4", "c"),
		desc("key1", "value1", "subkey1", "x"), desc("key6", "unlimited"), desc("nothing", "here"),
	}
	e.call("test-domain", desc("key2", "warm-up")) // the first use of a script loads it
	for i := range 3 {
		before := scriptCalls(t, srv)
		resp := e.call("test-domain", descs...)
		if after := scriptCalls(t, srv); after-before != 1 {
			t.Errorf("call %d: %d script calls for %d descriptors, want 1", i, after-before, len(descs))
		}
		want := rlsv3.RateLimitResponse_OK
		if i > 0 { // key3: 1/hour
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if resp.GetOverallCode() != want {
			t.Errorf("call %d: %s", i, resp.GetOverallCode())
		}
	}
}

// TestRedisTime: without an injected clock the window is Redis's: the
// reset duration agrees with Redis TIME.
func TestRedisTime(t *testing.T) {
	srv := redistest.Standalone(t)
	e := newEnv(t, func(t *testing.T, _ *clock.Fake) sluice.Store { return openRedis(t, srv.URL(), nil) }, "testdata/config", nil)
	redisNow := func() int64 {
		r, err := srv.Do(context.Background(), "TIME")
		if err != nil {
			t.Fatal(err)
		}
		parts := r.([]any)
		var sec int64
		for _, c := range parts[0].(string) {
			sec = sec*10 + int64(c-'0')
		}
		return sec
	}
	before := redisNow()
	resp := e.call("units", desc("unit", "hour"))
	after := redisNow()
	got := int64(resp.GetStatuses()[0].GetDurationUntilReset().AsDuration() / time.Second)
	lo, hi := 3600-after%3600, 3600-before%3600
	if after/3600 != before/3600 {
		lo, hi = 1, 3600 // the hour turned during the call
	}
	if got < lo || got > hi {
		t.Errorf("duration_until_reset %ds, want %d..%d from Redis TIME", got, lo, hi)
	}
}
