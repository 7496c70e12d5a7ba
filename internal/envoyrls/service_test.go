package envoyrls

import (
	"context"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
)

// t0 is 10.3 seconds into a day: not aligned to any window, and fractional,
// so that reset durations exercise the rounding.
var t0 = time.Date(2030, 1, 1, 0, 0, 10, 300_000_000, time.UTC)

// storeFactory returns a store that reads the time from clk.
type storeFactory func(t *testing.T, clk *clock.Fake) sluice.Store

// forStores runs test on the memory store, Redis and Redis Cluster.
func forStores(t *testing.T, test func(*testing.T, storeFactory)) {
	t.Run("memory", func(t *testing.T) { test(t, memStore) })
	t.Run("redis", func(t *testing.T) { test(t, redisStore) })
	t.Run("cluster", func(t *testing.T) { test(t, clusterStore) })
}

func memStore(t *testing.T, clk *clock.Fake) sluice.Store {
	s, err := memstore.New(memstore.Options{Clock: clk, MaxKeys: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// env is a Service behind a real gRPC server on a loopback port, and a
// real client.
type env struct {
	t      *testing.T
	svc    *Service
	client rlsv3.RateLimitServiceClient
	conn   *grpc.ClientConn
	clk    *clock.Fake
	reg    *prometheus.Registry
}

func newEnv(t *testing.T, newStore storeFactory, dir string, mod func(*Options)) *env {
	t.Helper()
	clk := clock.NewFake(t0)
	reg := prometheus.NewRegistry()
	opts := Options{Store: newStore(t, clk), ConfigDir: dir, Registerer: reg, Logger: slog.New(slog.DiscardHandler),
		KeyPrefix: "rls:" + sluice.NewLeaseID()[:12] + ":"} // tests share Redis servers: keep apart
	if mod != nil {
		mod(&opts)
	}
	svc, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx, lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &env{t: t, svc: svc, client: rlsv3.NewRateLimitServiceClient(conn), conn: conn, clk: clk, reg: reg}
}

// desc builds a request descriptor from key, value pairs.
func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	return &ratelimitv3.RateLimitDescriptor{Entries: entries(kv...)}
}

func (e *env) call(domain string, descs ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	e.t.Helper()
	return e.callReq(&rlsv3.RateLimitRequest{Domain: domain, Descriptors: descs})
}

func (e *env) callReq(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := e.client.ShouldRateLimit(ctx, req)
	if err != nil {
		e.t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.GetStatuses()) != len(req.GetDescriptors()) {
		e.t.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(req.GetDescriptors()))
	}
	return resp
}

// st is an expected descriptor status; rate 0 means no current_limit.
type st struct {
	code      rlsv3.RateLimitResponse_Code
	rate      uint32
	remaining uint32
	reset     time.Duration // checked when rate > 0
}

var (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

func (e *env) expect(resp *rlsv3.RateLimitResponse, overall rlsv3.RateLimitResponse_Code, want ...st) {
	e.t.Helper()
	if resp.GetOverallCode() != overall {
		e.t.Errorf("overall %s, want %s (%v)", resp.GetOverallCode(), overall, resp)
	}
	for i, w := range want {
		s := resp.GetStatuses()[i]
		if s.GetCode() != w.code || s.GetLimitRemaining() != w.remaining || s.GetCurrentLimit().GetRequestsPerUnit() != w.rate {
			e.t.Errorf("status %d: %s limit %d remaining %d; want %s limit %d remaining %d",
				i, s.GetCode(), s.GetCurrentLimit().GetRequestsPerUnit(), s.GetLimitRemaining(), w.code, w.rate, w.remaining)
		}
		if w.rate == 0 && w.reset == 0 && s.GetCurrentLimit() != nil {
			e.t.Errorf("status %d: current_limit %v, want none", i, s.GetCurrentLimit())
		}
		if (w.rate > 0 || w.reset > 0) && s.GetDurationUntilReset().AsDuration() != w.reset {
			e.t.Errorf("status %d: duration_until_reset %s, want %s", i, s.GetDurationUntilReset().AsDuration(), w.reset)
		}
	}
}

func TestNestedDescriptors(t *testing.T) { forStores(t, testNestedDescriptors) }

func testNestedDescriptors(t *testing.T, f storeFactory) {
	e := newEnv(t, f, "testdata/config", nil)
	d := desc("key1", "value1", "subkey1", "anything")
	// 0.7s are left in the second: rounded up to 1s, as envoyproxy/ratelimit's 1-0.
	for i := range 5 {
		e.expect(e.call("test-domain", d), ok, st{ok, 5, uint32(4 - i), time.Second})
	}
	e.expect(e.call("test-domain", d), over, st{over, 5, 0, time.Second})
	// A sibling value has its own counter; an exact value its own limit.
	e.expect(e.call("test-domain", desc("key1", "value1", "subkey1", "other")), ok, st{ok, 5, 4, time.Second})
	e.expect(e.call("test-domain", desc("key1", "value1", "subkey1", "subvalue1")), ok, st{ok, 10, 9, time.Second})
	// No limit: deeper or shallower than configured, unknown key, unknown domain.
	e.expect(e.call("test-domain", desc("key1", "value1")), ok, st{ok, 0, 0, 0})
	e.expect(e.call("test-domain", desc("key1", "value1", "subkey1", "x", "more", "y")), ok, st{ok, 0, 0, 0})
	e.expect(e.call("test-domain", desc("nope", "x")), ok, st{ok, 0, 0, 0})
	e.expect(e.call("no-such-domain", desc("key1", "value1")), ok, st{ok, 0, 0, 0})
	e.clk.Advance(700 * time.Millisecond) // the next second
	e.expect(e.call("test-domain", d), ok, st{ok, 5, 4, time.Second})
}

func TestUnlimited(t *testing.T) { forStores(t, testUnlimited) }

func testUnlimited(t *testing.T, f storeFactory) {
	e := newEnv(t, f, "testdata/config", nil)
	for range 3 {
		resp := e.call("test-domain", desc("key6", "x"))
		e.expect(resp, ok, st{ok, 0, math.MaxUint32, 0})
	}
}

func TestWildcardsAndShareThreshold(t *testing.T) { forStores(t, testWildcardsAndShareThreshold) }

func testWildcardsAndShareThreshold(t *testing.T, f storeFactory) {
	e := newEnv(t, f, "testdata/config", nil)
	reset := 50 * time.Second // 49.7s to the minute, rounded up
	// /foo/* : 10/min per value
	e.expect(e.call("wildcard", desc("path", "/foo/a")), ok, st{ok, 10, 9, reset})
	e.expect(e.call("wildcard", desc("path", "/foo/b")), ok, st{ok, 10, 9, reset})
	// exact beats wildcard
	e.expect(e.call("wildcard", desc("path", "/foo/bar")), ok, st{ok, 20, 19, reset})
	// /bar/* with share_threshold: 3/min across all values
	e.expect(e.call("wildcard", desc("path", "/bar/a")), ok, st{ok, 3, 2, reset})
	e.expect(e.call("wildcard", desc("path", "/bar/b")), ok, st{ok, 3, 1, reset})
	e.expect(e.call("wildcard", desc("path", "/bar/c")), ok, st{ok, 3, 0, reset})
	e.expect(e.call("wildcard", desc("path", "/bar/d")), over, st{over, 3, 0, reset})
	// middle wildcard
	e.expect(e.call("wildcard", desc("path", "/api/x/v1")), ok, st{ok, 4, 3, reset})
	// key-only default
	e.expect(e.call("wildcard", desc("path", "/zzz")), ok, st{ok, 100, 99, reset})
}

func TestReplaces(t *testing.T) { forStores(t, testReplaces) }

func testReplaces(t *testing.T, f storeFactory) {
	e := newEnv(t, f, "testdata/config", nil)
	reset := 50 * time.Second
	e.expect(e.call("replaces", desc("user", "alice")), ok, st{ok, 2, 1, reset})
	e.expect(e.call("replaces", desc("user", "alice")), ok, st{ok, 2, 0, reset})
	e.expect(e.call("replaces", desc("user", "alice")), over, st{over, 2, 0, reset})
	// With the premium tier, per_user is replaced: no limit, not charged.
	for i := range 3 {
		e.expect(e.call("replaces", desc("user", "alice"), desc("tier", "premium")), ok,
			st{ok, 0, 0, 0}, st{ok, 50, uint32(49 - i), reset})
	}
}

func TestShadowMode(t *testing.T) { forStores(t, testShadowMode) }

func testShadowMode(t *testing.T, f storeFactory) {
	e := newEnv(t, f, "testdata/config", nil)
	reset := 50 * time.Second
	e.expect(e.call("shadow", desc("client", "c"), desc("route", "r")), ok, st{ok, 2, 1, reset}, st{ok, 10, 9, reset})
	e.expect(e.call("shadow", desc("client", "c"), desc("route", "r")), ok, st{ok, 2, 0, reset}, st{ok, 10, 8, reset})
	// Over the shadow limit: reported OK, and the other limit is still charged.
	e.expect(e.call("shadow", desc("client", "c"), desc("route", "r")), ok, st{ok, 2, 0, reset}, st{ok, 10, 7, reset})
	e.expect(e.call("shadow", desc("client", "c"), desc("route", "r")), ok, st{ok, 2, 0, reset}, st{ok, 10, 6, reset})
	shadow := testutil.ToFloat64(e.svc.metrics.hits.WithLabelValues("shadow", "client", "shadow_mode"))
	if shadow != 2 {
		t.Errorf("shadow_mode hits %v, want 2", shadow)
	}
}

// TestFixedWindowUnits checks, across units, that answers, remaining counts
// and reset durations are those of a clock-aligned fixed window, as
// envoyproxy/ratelimit computes them: the count restarts at every multiple
// of the unit since the epoch, and duration_until_reset is the unit minus
// the whole seconds elapsed in it.
func TestFixedWindowUnits(t *testing.T) { forStores(t, testFixedWindowUnits) }

func testFixedWindowUnits(t *testing.T, f storeFactory) {
	for _, u := range []struct {
		name string
		p    time.Duration
	}{{"minute", time.Minute}, {"hour", time.Hour}, {"day", 24 * time.Hour}, {"week", 7 * 24 * time.Hour}} {
		t.Run(u.name, func(t *testing.T) {
			e := newEnv(t, f, "testdata/config", nil)
			d := desc("unit", u.name)
			upstreamReset := func() time.Duration {
				sec := int64(u.p / time.Second)
				now := e.clk.Now() / int64(time.Second)
				return time.Duration(sec-now%sec) * time.Second
			}
			// Walk through three windows, with uneven steps.
			model := map[int64]int64{}
			steps := []time.Duration{0, u.p / 7, u.p / 3, u.p / 2, u.p/2 + time.Second, u.p / 5, u.p - u.p/5, 0}
			for i, adv := range steps {
				e.clk.Advance(adv)
				for range 2 {
					window := e.clk.Now() / int64(u.p)
					used := model[window]
					resp := e.call("units", d)
					if used < 3 {
						model[window] = used + 1
						e.expect(resp, ok, st{ok, 3, uint32(2 - used), upstreamReset()})
					} else {
						e.expect(resp, over, st{over, 3, 0, upstreamReset()})
					}
					if t.Failed() {
						t.Fatalf("step %d at %s", i, e.clk.Time())
					}
				}
			}
			if len(model) < 3 {
				t.Fatalf("walked %d windows, want 3", len(model))
			}
		})
	}
}

// TestAllOrNothing: a request over one limit charges none of the others
// (envoyproxy/ratelimit's issue #1060).
func TestAllOrNothing(t *testing.T) { forStores(t, testAllOrNothing) }

func testAllOrNothing(t *testing.T, f storeFactory) {
	e := newEnv(t, f, "testdata/config", nil)
	minute, hour := 50*time.Second, time.Hour-10*time.Second
	pair := []*ratelimitv3.RateLimitDescriptor{desc("key2", "value2"), desc("key3", "foo")}
	e.expect(e.call("test-domain", pair...), ok, st{ok, 30, 29, minute}, st{ok, 1, 0, hour})
	for range 3 {
		// key3 is exhausted; key2 alone would pass but is not charged.
		e.expect(e.call("test-domain", pair...), over, st{ok, 30, 29, minute}, st{over, 1, 0, hour})
	}
	e.expect(e.call("test-domain", desc("key2", "value2")), ok, st{ok, 30, 28, minute})
}

func TestHitsAddend(t *testing.T) { forStores(t, testHitsAddend) }

func testHitsAddend(t *testing.T, f storeFactory) {
	e := newEnv(t, f, "testdata/config", nil)
	minute := 50 * time.Second
	d := desc("key2", "value2") // 30/min
	e.expect(e.callReq(&rlsv3.RateLimitRequest{Domain: "test-domain", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}, HitsAddend: 3}),
		ok, st{ok, 30, 27, minute})
	// A descriptor's hits_addend wins over the request's.
	d5 := desc("key2", "value2")
	d5.HitsAddend = wrapperspb.UInt64(5)
	other := desc("key2", "other") // 20/min
	e.expect(e.callReq(&rlsv3.RateLimitRequest{Domain: "test-domain", Descriptors: []*ratelimitv3.RateLimitDescriptor{d5, other}, HitsAddend: 2}),
		ok, st{ok, 30, 22, minute}, st{ok, 20, 18, minute})
	// hits_addend 0 checks without charging.
	d0 := desc("key2", "value2")
	d0.HitsAddend = wrapperspb.UInt64(0)
	e.expect(e.call("test-domain", d0), ok, st{ok, 30, 22, minute})
	e.expect(e.call("test-domain", d0), ok, st{ok, 30, 22, minute})
	// More hits than the limit can ever admit: over, and nothing charged.
	big := desc("key2", "value2")
	big.HitsAddend = wrapperspb.UInt64(31)
	e.expect(e.call("test-domain", big, desc("key2", "other")), over, st{over, 30, 0, minute}, st{ok, 20, 18, minute})
	e.expect(e.call("test-domain", desc("key2", "other")), ok, st{ok, 20, 17, minute})
	// Exactly the rest of the window.
	rest := desc("key2", "value2")
	rest.HitsAddend = wrapperspb.UInt64(22)
	e.expect(e.call("test-domain", rest), ok, st{ok, 30, 0, minute})
	e.expect(e.call("test-domain", d0), over, st{over, 30, 0, minute})
}

func TestLimitOverride(t *testing.T) { forStores(t, testLimitOverride) }

func testLimitOverride(t *testing.T, f storeFactory) {
	e := newEnv(t, f, "testdata/config", nil)
	d := desc("anything", "x")
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE}
	e.expect(e.call("test-domain", d), ok, st{ok, 2, 1, 50 * time.Second})
	e.expect(e.call("test-domain", d), ok, st{ok, 2, 0, 50 * time.Second})
	resp := e.call("test-domain", d)
	e.expect(resp, over, st{over, 2, 0, 50 * time.Second})
	if u := resp.GetStatuses()[0].GetCurrentLimit().GetUnit(); u != rlsv3.RateLimitResponse_RateLimit_MINUTE {
		t.Errorf("current_limit unit %s", u)
	}
	// The override replaces a configured limit too (key2: 20/min).
	d2 := desc("key2", "y")
	d2.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	e.expect(e.call("test-domain", d2), ok, st{ok, 1, 0, time.Hour - 10*time.Second})
	e.expect(e.call("test-domain", d2), over, st{over, 1, 0, time.Hour - 10*time.Second})
}

func TestAlgorithmExtension(t *testing.T) { forStores(t, testAlgorithmExtension) }

func testAlgorithmExtension(t *testing.T, f storeFactory) {
	e := newEnv(t, f, "testdata/config", nil)
	for i := range 10 {
		resp := e.call("algos", desc("gcra", "u"))
		if resp.GetOverallCode() != ok || resp.GetStatuses()[0].GetLimitRemaining() != uint32(9-i) {
			t.Fatalf("gcra call %d: %v", i, resp)
		}
	}
	resp := e.call("algos", desc("gcra", "u"))
	if resp.GetOverallCode() != over {
		t.Fatalf("gcra 11th call: %v", resp)
	}
	if got := resp.GetStatuses()[0].GetDurationUntilReset().AsDuration(); got != time.Second {
		t.Errorf("gcra reset %s, want 1s (exact, not rounded)", got)
	}
	e.clk.Advance(100 * time.Millisecond) // one token back
	e.expect(e.call("algos", desc("gcra", "u")), ok, st{ok, 10, 0, time.Second})
	// token_bucket with burst 20
	for i := range 20 {
		if e.call("algos", desc("tb", "u")).GetOverallCode() != ok {
			t.Fatalf("tb call %d denied", i)
		}
	}
	if e.call("algos", desc("tb", "u")).GetOverallCode() != over {
		t.Fatal("tb call 21 admitted")
	}
	// requests_per_unit 0 denies everything and charges nothing else.
	// (Remaining counts of a denied request are those before it: nothing was charged.)
	// An untouched limit reports its whole unit as duration_until_reset.
	e.expect(e.call("algos", desc("zero", "u"), desc("sw", "u")), over, st{over, 0, 0, time.Second}, st{ok, 10, 10, time.Minute})
	// sliding_window: the count is forgotten two windows after the current
	// one began, but duration_until_reset is at most the unit.
	e.expect(e.call("algos", desc("sw", "u")), ok, st{ok, 10, 9, time.Minute})
}

func TestResponseHeaders(t *testing.T) { forStores(t, testResponseHeaders) }

func testResponseHeaders(t *testing.T, f storeFactory) {
	e := newEnv(t, f, "testdata/config", func(o *Options) { o.ResponseHeaders = true })
	d := desc("key3", "h") // 1/hour
	headers := func(resp *rlsv3.RateLimitResponse) map[string]string {
		m := map[string]string{}
		for _, h := range resp.GetResponseHeadersToAdd() {
			m[h.GetKey()] = h.GetValue()
		}
		return m
	}
	h := headers(e.call("test-domain", d))
	if h["X-RateLimit-Limit"] != "1" || h["X-RateLimit-Remaining"] != "0" || h["X-RateLimit-Reset"] != "3590" || h["Retry-After"] != "" {
		t.Errorf("allowed: headers %v", h)
	}
	if h["RateLimit-Policy"] != `"test-domain.key3";q=1;w=3600` || h["RateLimit"] != `"test-domain.key3";r=0;t=3590` {
		t.Errorf("allowed: IETF headers %v", h)
	}
	e.clk.Advance(500 * time.Millisecond)
	h = headers(e.call("test-domain", d))
	if h["Retry-After"] != "3590" || h["X-RateLimit-Remaining"] != "0" {
		t.Errorf("denied: headers %v (Retry-After is 3589.2s rounded up)", h)
	}
}

func TestInvalidRequests(t *testing.T) {
	e := newEnv(t, memStore, "testdata/config", nil)
	ctx := context.Background()
	for _, req := range []*rlsv3.RateLimitRequest{
		{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "b")}},
		{Domain: "test-domain"},
	} {
		_, err := e.client.ShouldRateLimit(ctx, req)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: error %v, want InvalidArgument", req, err)
		}
	}
}

func TestHealthAndReflection(t *testing.T) {
	e := newEnv(t, memStore, "testdata/config", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
		resp, err := healthpb.NewHealthClient(e.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q: %v, %v", svc, resp, err)
		}
	}
	stream, err := reflectionpb.NewServerReflectionClient(e.conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range resp.GetListServicesResponse().GetService() {
		found = found || s.GetName() == "envoy.service.ratelimit.v3.RateLimitService"
	}
	if !found {
		t.Errorf("reflection lists %v", resp.GetListServicesResponse().GetService())
	}
	_ = stream.CloseSend()
	if _, err := stream.Recv(); err != nil && err != io.EOF {
		t.Logf("reflection close: %v", err)
	}
}

func TestDetailedMetricBounded(t *testing.T) {
	e := newEnv(t, memStore, "testdata/config", func(o *Options) { o.MaxDetailedSeries = 2 })
	before, err := testutil.GatherAndCount(e.reg, "sluice_envoy_rls_hits_total")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"a", "b", "c", "d", "a"} {
		e.call("test-domain", desc("key7", v))
	}
	hits := func(descriptor string) float64 {
		return testutil.ToFloat64(e.svc.metrics.hits.WithLabelValues("test-domain", descriptor, "total_hits"))
	}
	if hits("key7_a") != 2 || hits("key7_b") != 1 || hits("key7") != 2 {
		t.Errorf("hits a=%v b=%v fallback=%v; want 2, 1, 2", hits("key7_a"), hits("key7_b"), hits("key7"))
	}
	after, err := testutil.GatherAndCount(e.reg, "sluice_envoy_rls_hits_total")
	if err != nil {
		t.Fatal(err)
	}
	if after != before+2*5 {
		t.Errorf("%d hit series after, %d before; want 2 detailed descriptors × 5 outcomes more", after, before)
	}
	if metricValue("x_api_key", "secret-123") == "secret-123" || metricValue("path", "/a") != "/a" {
		t.Error("metricValue does not hash credential-like values")
	}
}

// copyDir copies testdata/config into a temporary directory.
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	files, err := filepath.Glob(filepath.Join(src, "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, filepath.Base(f)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func TestHotReload(t *testing.T) {
	dir := copyDir(t, "testdata/config")
	reloads := make(chan error, 16)
	e := newEnv(t, memStore, dir, func(o *Options) {
		o.ReloadDelay = 10 * time.Millisecond
		o.OnReload = func(err error) { reloads <- err }
	})
	ready := make(chan struct{})
	e.svc.watching = func() { close(ready) }
	ctx, cancel := context.WithCancel(context.Background())
	watching := make(chan error, 1)
	go func() { watching <- e.svc.Watch(ctx) }()
	t.Cleanup(func() { cancel(); <-watching })
	<-ready

	e.expect(e.call("replaces", desc("user", "u")), ok, st{ok, 2, 1, 50 * time.Second})
	waitReload := func(change func()) error {
		t.Helper()
		change()
		select {
		case err := <-reloads:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("no reload within 10s")
			return nil
		}
	}
	newCfg := strings.Replace(readFile(t, filepath.Join(dir, "replaces.yaml")), "requests_per_unit: 2", "requests_per_unit: 7", 1)
	if err := waitReload(func() { writeFile(t, filepath.Join(dir, "replaces.yaml"), newCfg) }); err != nil {
		t.Fatalf("reload: %v", err)
	}
	e.expect(e.call("replaces", desc("user", "u")), ok, st{ok, 7, 5, 50 * time.Second})

	// A bad file is reported and the running configuration stays.
	err := waitReload(func() { writeFile(t, filepath.Join(dir, "zz.yaml"), "domain: replaces\n") })
	if err == nil || !strings.Contains(err.Error(), "duplicate domain 'replaces'") {
		t.Fatalf("bad reload: %v", err)
	}
	e.expect(e.call("replaces", desc("user", "u")), ok, st{ok, 7, 4, 50 * time.Second})
	loads := testutil.ToFloat64(e.svc.metrics.loads.WithLabelValues("error"))
	if loads < 1 {
		t.Errorf("config_loads_total{result=error} = %v", loads)
	}
	// Removing it restores a loadable directory.
	if err := waitReload(func() { _ = os.Remove(filepath.Join(dir, "zz.yaml")) }); err != nil {
		t.Fatalf("reload after removal: %v", err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestHalfWrittenRulesWait: a rules file written in place in two steps,
// a valid prefix (the domain with its first descriptor, its second not
// yet written) and the rest after a pause shorter than ReloadStill, is
// loaded once, whole: the prefix, a valid configuration on its own, is
// never applied (it would drop the second descriptor's limit).
func TestHalfWrittenRulesWait(t *testing.T) {
	dir := copyDir(t, "testdata/config")
	reloads := make(chan error, 16)
	e := newEnv(t, memStore, dir, func(o *Options) {
		o.ReloadDelay = 10 * time.Millisecond
		o.ReloadStill = 400 * time.Millisecond
		o.OnReload = func(err error) { reloads <- err }
	})
	ready := make(chan struct{})
	e.svc.watching = func() { close(ready) }
	ctx, cancel := context.WithCancel(context.Background())
	watching := make(chan error, 1)
	go func() { watching <- e.svc.Watch(ctx) }()
	t.Cleanup(func() { cancel(); <-watching })
	<-ready

	whole := "domain: half\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 3}\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	cut := strings.Index(whole, "  - key: b")
	path := filepath.Join(dir, "half.yaml")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(whole[:cut]); err != nil {
		t.Fatal(err)
	}
	// The writer pauses (a slow pipe, a script between two echo lines),
	// shorter than ReloadStill, then writes the rest.
	time.Sleep(150 * time.Millisecond)
	if _, err := f.WriteString(whole[cut:]); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-reloads:
		if err != nil {
			t.Fatalf("reload: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no reload within 10s")
	}
	// The first reload saw the whole file: b has its limit of 1.
	if got := e.call("half", desc("b", "x")).GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 1 {
		t.Fatalf("b's limit after the first reload: %d, want 1 (the half-written file was applied)", got)
	}
}
