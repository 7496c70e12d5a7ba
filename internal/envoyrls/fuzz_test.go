package envoyrls

import (
	"context"
	"log/slog"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/mem"

	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
)

// FuzzEnvoyDescriptors: a request that carries an exhausted descriptor is
// OVER_LIMIT, never OK and never an error, whatever else it carries and
// whatever its bytes: other descriptors of any key, value, count, limit
// override and hits_addend, the exhausted one at any position, with an
// override of an unknown unit or any hits_addend of its own. The request
// goes through the server's codec, as Envoy's bytes would.
func FuzzEnvoyDescriptors(f *testing.F) {
	f.Add("key2", "v", uint16(1), uint64(0), uint32(0), uint32(0), int32(0), uint32(0), int32(-1), uint64(1), uint16(0))
	f.Add("key2", "\xff\xfe", uint16(2), uint64(5), uint32(3), uint32(10), int32(2), uint32(0), int32(0), uint64(0), uint16(1))
	f.Add("key1", string(make([]byte, 5000)), uint16(300), uint64(1<<63), uint32(1<<31), uint32(1), int32(6), uint32(1<<31), int32(99), uint64(1<<64-1), uint16(7))
	f.Add("key7", "\xff\xc3", uint16(3), uint64(0), uint32(0), uint32(0), int32(0), uint32(0), int32(-1), uint64(1), uint16(1)) // detailed_metric: the value becomes a label
	f.Add("", "", uint16(65), uint64(0), uint32(0), uint32(0), int32(-7), uint32(0), int32(-1), uint64(2), uint16(64))
	svc, err := New(Options{Store: newFuzzStore(f), ConfigDir: "testdata/config", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	codec := newCodec()
	victim := func() *ratelimitv3.RateLimitDescriptor { return desc("key3", "victim") } // 1 per hour
	f.Fuzz(func(t *testing.T, key, value string, n uint16, hits uint64, reqHits, rpu uint32, unit int32, mult uint32,
		victimUnit int32, victimHits uint64, pos uint16) {
		svc.store = newFuzzStore(t)
		ctx := context.Background()
		if r, err := svc.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "test-domain",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{victim()}}); err != nil || r.GetOverallCode() != ok {
			t.Fatalf("exhausting the victim: %v %v", r, err)
		}
		var descs []*ratelimitv3.RateLimitDescriptor
		for range int(n) % 300 {
			d := desc(key, value)
			if rpu != 0 || unit != 0 {
				withOverride(d, rpu, typev3.RateLimitUnit(unit), mult)
			}
			if hits != 0 {
				withHits(d, hits-1)
			}
			descs = append(descs, d)
		}
		v := victim()
		if _, valid := unitPeriods[rlsv3.RateLimitResponse_RateLimit_Unit(victimUnit)]; !valid && victimUnit != -1 {
			// An override the service must ignore (a valid one is Envoy's
			// configuration, which may loosen the limit on purpose).
			withOverride(v, 1_000_000, typev3.RateLimitUnit(victimUnit), mult)
		}
		if victimHits != 1 {
			withHits(v, victimHits)
		}
		at := int(pos) % (len(descs) + 1)
		descs = append(descs[:at], append([]*ratelimitv3.RateLimitDescriptor{v}, descs[at:]...)...)
		req := &rlsv3.RateLimitRequest{}
		wire := encodeRequest(&rlsv3.RateLimitRequest{Domain: "test-domain", Descriptors: descs, HitsAddend: reqHits})
		if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, req); err != nil {
			t.Fatalf("decode: %v", err)
		}
		resp, err := svc.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("error %v: an Envoy with failure_mode_deny: false lets it through", err)
		}
		if resp.GetOverallCode() != over || resp.GetStatuses()[at].GetCode() != over {
			t.Fatalf("overall %s, victim %s: want OVER_LIMIT", resp.GetOverallCode(), resp.GetStatuses()[at].GetCode())
		}
		checkResets(t, resp)
	})
}

func newFuzzStore(tb testing.TB) *memstore.Store {
	s, err := memstore.New(memstore.Options{Clock: clock.NewFake(t0), SweepInterval: -1})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}
