package envoyrls

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/lease"
)

// rawCodec sends pre-encoded requests, as Envoy's C++ protobuf does: its
// strings may be any bytes, which Go's protobuf would refuse to encode.
type rawCodec struct{}

type rawMsg []byte

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*rawMsg))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

// encodeRequest writes req in wire format without checking that its
// strings are UTF-8.
func encodeRequest(req *rlsv3.RateLimitRequest) []byte {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, req.GetDomain())
	for _, d := range req.GetDescriptors() {
		var db []byte
		for _, e := range d.GetEntries() {
			var eb []byte
			eb = protowire.AppendTag(eb, 1, protowire.BytesType)
			eb = protowire.AppendString(eb, e.GetKey())
			eb = protowire.AppendTag(eb, 2, protowire.BytesType)
			eb = protowire.AppendString(eb, e.GetValue())
			db = protowire.AppendTag(db, 1, protowire.BytesType)
			db = protowire.AppendBytes(db, eb)
		}
		if d.GetLimit() != nil {
			lb, _ := proto.Marshal(d.GetLimit())
			db = protowire.AppendTag(db, 2, protowire.BytesType)
			db = protowire.AppendBytes(db, lb)
		}
		if d.GetHitsAddend() != nil {
			hb, _ := proto.Marshal(d.GetHitsAddend())
			db = protowire.AppendTag(db, 3, protowire.BytesType)
			db = protowire.AppendBytes(db, hb)
		}
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, db)
	}
	if req.GetHitsAddend() != 0 {
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(req.GetHitsAddend()))
	}
	return b
}

// callRaw sends req as Envoy would, bytes as they are.
func (e *env) callRaw(req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg := rawMsg(encodeRequest(req))
	resp := &rlsv3.RateLimitResponse{}
	err := e.conn.Invoke(ctx, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &msg, resp, grpc.ForceCodecV2(rawCodec{}))
	return resp, err
}

// checkResets: every status that has a limit carries a duration_until_reset
// in (0, unit].
func checkResets(t *testing.T, resp *rlsv3.RateLimitResponse) {
	t.Helper()
	for i, st := range resp.GetStatuses() {
		cl := st.GetCurrentLimit()
		if cl == nil {
			continue
		}
		unit := unitPeriods[cl.GetUnit()] * time.Duration(max(1, cl.GetUnitMultiplier().GetValue()))
		if r := st.GetDurationUntilReset().AsDuration(); r <= 0 || r > unit {
			t.Errorf("status %d: duration_until_reset %s, want in (0, %s]", i, r, unit)
		}
	}
}

func withHits(d *ratelimitv3.RateLimitDescriptor, hits uint64) *ratelimitv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(hits)
	return d
}

func withOverride(d *ratelimitv3.RateLimitDescriptor, rpu uint32, unit typev3.RateLimitUnit, mult uint32) *ratelimitv3.RateLimitDescriptor {
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
	if mult > 0 {
		d.Limit.UnitMultiplier = wrapperspb.UInt32(mult)
	}
	return d
}

// manyEntries is a descriptor with n entries.
func manyEntries(n int) *ratelimitv3.RateLimitDescriptor {
	var kv []string
	for i := range n {
		kv = append(kv, fmt.Sprintf("k%d", i), "v")
	}
	return desc(kv...)
}

// TestBypassEnvoy: each row is a request a hostile client (or a client's
// bytes in Envoy's descriptors) sends with a descriptor that is over its
// limit, to get it through. Every row must come back OVER_LIMIT, never an
// error that an Envoy with failure_mode_deny: false turns into OK, and the
// exhausted counter never admits a second hit.
func TestBypassEnvoy(t *testing.T) {
	forStores(t, func(t *testing.T, f storeFactory) { testBypassEnvoy(t, f, nil) })
}

// TestBypassEnvoyLeased: the same with every descriptor decided from
// leased capacity (Options.Lease) on real Redis.
func TestBypassEnvoyLeased(t *testing.T) {
	srv := redistest.Standalone(t)
	testBypassEnvoy(t, func(t *testing.T, _ *clock.Fake) sluice.Store {
		l, err := lease.New(lease.Options{Store: openRedis(t, srv.URL(), nil)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return l
	}, func(o *Options) { o.Lease = true })
}

func testBypassEnvoy(t *testing.T, f storeFactory, mod func(*Options)) {
	long := strings.Repeat("/very/long/path", 20_000)                                   // 300 KB, a long :path
	victim := func() *ratelimitv3.RateLimitDescriptor { return desc("key3", "victim") } // 1 per hour
	rows := []struct {
		name  string
		descs []*ratelimitv3.RateLimitDescriptor
		hits  uint32
	}{
		{"alone", []*ratelimitv3.RateLimitDescriptor{victim()}, 0},
		{"beside a 300 KB value", []*ratelimitv3.RateLimitDescriptor{victim(), desc("key2", long)}, 0},
		{"beside a 300 KB value under a key-only rule", []*ratelimitv3.RateLimitDescriptor{desc("key1", "value1", "subkey1", long), victim()}, 0},
		{"beside a 300 KB key", []*ratelimitv3.RateLimitDescriptor{victim(), desc(long, "x")}, 0},
		{"beside invalid UTF-8", []*ratelimitv3.RateLimitDescriptor{victim(), desc("key2", "\xff\xfe")}, 0},
		{"beside an invalid UTF-8 key", []*ratelimitv3.RateLimitDescriptor{victim(), desc("\xc3", "x")}, 0},
		{"beside a descriptor of 65 entries", []*ratelimitv3.RateLimitDescriptor{victim(), manyEntries(maxEntries + 1)}, 0},
		{"beside 300 descriptors", append([]*ratelimitv3.RateLimitDescriptor{victim()}, func() (ds []*ratelimitv3.RateLimitDescriptor) {
			for i := range 300 {
				ds = append(ds, desc("key2", fmt.Sprint(i)))
			}
			return ds
		}()...), 0},
		{"beside an empty key and value", []*ratelimitv3.RateLimitDescriptor{victim(), desc("", "")}, 0},
		{"with an override of unknown unit", []*ratelimitv3.RateLimitDescriptor{withOverride(victim(), 1000, typev3.RateLimitUnit_UNKNOWN, 0)}, 0},
		{"with an override of unit 99", []*ratelimitv3.RateLimitDescriptor{withOverride(victim(), 1000, typev3.RateLimitUnit(99), 0)}, 0},
		{"with an override of unit -1", []*ratelimitv3.RateLimitDescriptor{withOverride(victim(), 1000, typev3.RateLimitUnit(-1), 0)}, 0},
		{"with an override whose period overflows", []*ratelimitv3.RateLimitDescriptor{withOverride(victim(), 1000, typev3.RateLimitUnit_YEAR, math.MaxUint32)}, 0},
		{"check-only (hits_addend 0)", []*ratelimitv3.RateLimitDescriptor{withHits(victim(), 0)}, 0},
		{"descriptor hits_addend 2^64-1", []*ratelimitv3.RateLimitDescriptor{withHits(victim(), math.MaxUint64)}, 0},
		{"descriptor hits_addend 2^63", []*ratelimitv3.RateLimitDescriptor{withHits(victim(), 1<<63)}, 0},
		{"request hits_addend 2^32-1", []*ratelimitv3.RateLimitDescriptor{victim(), desc("key2", "other")}, math.MaxUint32},
		{"beside an unlimited and a shadow-free unknown descriptor", []*ratelimitv3.RateLimitDescriptor{desc("key6", "u"), victim(), desc("nope", "x")}, 0},
	}
	e := newEnv(t, f, "testdata/config", mod)
	first, err := e.callRaw(&rlsv3.RateLimitRequest{Domain: "test-domain", Descriptors: []*ratelimitv3.RateLimitDescriptor{victim()}})
	if err != nil || first.GetOverallCode() != ok {
		t.Fatalf("first hit: %v %v", first, err)
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			resp, err := e.callRaw(&rlsv3.RateLimitRequest{Domain: "test-domain", Descriptors: row.descs, HitsAddend: row.hits})
			if err != nil {
				t.Fatalf("error %v: Envoy with failure_mode_deny: false would let it through", err)
			}
			if resp.GetOverallCode() != over {
				t.Fatalf("overall %s, want OVER_LIMIT", resp.GetOverallCode())
			}
			if len(resp.GetStatuses()) != len(row.descs) {
				t.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(row.descs))
			}
			checkResets(t, resp)
		})
	}
	// Nothing above took a second hit from the victim's counter.
	if d, err := e.svc.store.Apply(context.Background(), sluice.OpPeek, peekReq(t, e, victim())); err != nil || d.Remaining != 0 {
		t.Fatalf("victim: remaining %d, %v", d.Remaining, err)
	}
	if n := testutil.ToFloat64(e.svc.metrics.requestErrors.WithLabelValues("test-domain", "bad_override")); n != 4 {
		t.Errorf("bad_override errors %v, want 4", n)
	}
	if n := testutil.ToFloat64(e.svc.metrics.requestErrors.WithLabelValues("test-domain", "over_bounds")); n != 2 {
		t.Errorf("over_bounds errors %v, want 2", n)
	}
}

// peekReq is the store request of descriptor d in the test-domain.
func peekReq(t *testing.T, e *env, d *ratelimitv3.RateLimitDescriptor) sluice.Request {
	t.Helper()
	dom := e.svc.cfg.Load().domains["test-domain"]
	req := &rlsv3.RateLimitRequest{Domain: "test-domain", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}
	items := make([]item, 1)
	e.svc.plan(dom, req, items)
	return items[0].request()
}

// TestKeysAreBytes: distinct values never share a counter, whatever their
// bytes or length, and a long value is counted like a short one.
func TestKeysAreBytes(t *testing.T) { forStores(t, testKeysAreBytes) }

func testKeysAreBytes(t *testing.T, f storeFactory) {
	e := newEnv(t, f, "testdata/config", nil)
	long := strings.Repeat("a", 10_000)
	values := []string{
		"\xff", "\xfe", "\xef\xbf\xbd", // two invalid bytes and U+FFFD, which a decoder would turn them into
		long + "1", long + "2", long[:maxLiteral], long[:maxLiteral+1],
		"%H" + strings.Repeat("0", 64), // looks like a hashed value, is a literal
		"a=b", "a%3Db", "x|y", "{x}",
	}
	for _, v := range values {
		resp, err := e.callRaw(&rlsv3.RateLimitRequest{Domain: "test-domain", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key3", v)}})
		if err != nil || resp.GetOverallCode() != ok {
			t.Fatalf("first hit of %q: %v %v (another value's counter?)", v[:min(len(v), 20)], resp.GetOverallCode(), err)
		}
	}
	for _, v := range values {
		resp, err := e.callRaw(&rlsv3.RateLimitRequest{Domain: "test-domain", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key3", v)}})
		if err != nil || resp.GetOverallCode() != over {
			t.Fatalf("second hit of %q: %v %v (not counted)", v[:min(len(v), 20)], resp.GetOverallCode(), err)
		}
	}
}

// TestDurationUntilReset: every status with a limit has a reset in
// (0, unit], check-only on an untouched key included.
func TestDurationUntilReset(t *testing.T) { forStores(t, testDurationUntilReset) }

func testDurationUntilReset(t *testing.T, f storeFactory) {
	e := newEnv(t, f, "testdata/config", nil)
	for _, descs := range [][]*ratelimitv3.RateLimitDescriptor{
		{withHits(desc("key3", "untouched"), 0)},
		{withHits(desc("gcra", "untouched"), 0)},
		{withHits(desc("sw", "untouched"), 0)},
		{desc("zero", "x"), withHits(desc("tb", "untouched"), 0)},
		{desc("sw", "a")}, {desc("sw", "a")},
		{withOverride(desc("o", "x"), 5, typev3.RateLimitUnit_SECOND, 30), withHits(desc("gcra", "u2"), 0)},
	} {
		domain := "algos"
		if descs[0].GetEntries()[0].GetKey() == "key3" {
			domain = "test-domain"
		}
		resp, err := e.callRaw(&rlsv3.RateLimitRequest{Domain: domain, Descriptors: descs})
		if err != nil {
			t.Fatal(err)
		}
		checkResets(t, resp)
		for i, st := range resp.GetStatuses() {
			if st.GetCurrentLimit() == nil {
				t.Errorf("%v: status %d has no limit", descs, i)
			}
		}
	}
}

// TestDetailedMetricAnyBytes: a detailed_metric descriptor's value becomes
// a metric label; one that is not UTF-8 (which Prometheus refuses) is
// hashed, and counted like any other.
func TestDetailedMetricAnyBytes(t *testing.T) {
	e := newEnv(t, memStore, "testdata/config", nil)
	for range 2 {
		resp, err := e.callRaw(&rlsv3.RateLimitRequest{Domain: "test-domain", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key7", "\xff\xfe")}})
		if err != nil || resp.GetOverallCode() != ok {
			t.Fatalf("%v %v", resp, err)
		}
	}
	label := "key7_" + metricValue("key7", "\xff\xfe")
	if n := testutil.ToFloat64(e.svc.metrics.hits.WithLabelValues("test-domain", label, "total_hits")); n != 2 {
		t.Errorf("hits of %s: %v, want 2", label, n)
	}
}
