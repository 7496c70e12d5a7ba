package envoyrls

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// erlExamples is envoyproxy/ratelimit's own examples/ratelimit/config
// directory, unchanged (testdata/erl-examples/NOTICE): its example.yaml
// uses quota_mode and metadata, added to envoyproxy/ratelimit in 2026.
const erlExamples = "testdata/erl-examples"

// TestERLExamples serves envoyproxy/ratelimit's examples directory as it is
// and checks quota_mode as envoyproxy/ratelimit's service decides it
// (src/service/ratelimit.go, shouldRateLimitWorker): a quota-mode
// descriptor over its limit is reported OVER_LIMIT in its status, but the
// request is over only when some other descriptor is over or every
// quota-mode descriptor of the request is. Where the request passes, the
// descriptors over their quota are not charged (all or nothing, as for
// shadow mode); where it does not, nothing is.
func TestERLExamples(t *testing.T) { forStores(t, testERLExamples) }

func testERLExamples(t *testing.T, f storeFactory) {
	e := newEnv(t, f, erlExamples, nil)
	if got := e.svc.Domains(); got != 2 {
		t.Fatalf("%d domains, want 2 (rl and mongo_cps)", got)
	}
	reset := 50 * time.Second // t0 is 10.3 s into its minute
	s1, s2, foo := desc("service", "service_1"), desc("service", "service_2"), desc("foo", "x")
	// service_1: quota_mode, 1/min.
	e.expect(e.call("rl", s1), ok, st{ok, 1, 0, reset})
	// Its only quota descriptor over: the request is over.
	e.expect(e.call("rl", s1), over, st{over, 1, 0, reset})
	// Every quota descriptor over, another limit within: over, and the
	// other limit (foo, 2/min) is not charged.
	if got := e.call("rl", s1, foo).GetOverallCode(); got != over {
		t.Errorf("service_1 over its quota beside foo: %s, want OVER_LIMIT", got)
	}
	e.expect(e.call("rl", foo), ok, st{ok, 2, 1, reset})
	// service_2 (quota_mode, 2/min) still has quota: the request passes,
	// service_1's status says it is over, and only service_2 is charged.
	e.expect(e.call("rl", s1, s2), ok, st{over, 1, 0, reset}, st{ok, 2, 1, reset})
	e.expect(e.call("rl", s1, s2), ok, st{over, 1, 0, reset}, st{ok, 2, 0, reset})
	// Now both are over.
	e.expect(e.call("rl", s1, s2), over, st{over, 1, 0, reset}, st{over, 2, 0, reset})
	// A quota descriptor does not excuse a rate limit over its limit.
	e.expect(e.call("rl", foo), ok, st{ok, 2, 0, reset})
	e.expect(e.call("rl", foo, s2), over, st{over, 2, 0, reset}, st{over, 2, 0, reset})

	// The counters count quota descriptors as any other.
	if got := testutil.ToFloat64(e.svc.metrics.hits.WithLabelValues("rl", "service_service_1", "over_limit")); got != 5 {
		t.Errorf("service_1 over_limit %v, want 5", got)
	}
	// The other file of the directory serves too.
	e.expect(e.call("mongo_cps", desc("database", "users")), ok, st{ok, 500, 499, 1 * time.Second})
	// A new minute: quota again.
	e.clk.Advance(reset)
	e.expect(e.call("rl", s1, s2), ok, st{ok, 1, 0, time.Minute}, st{ok, 2, 1, time.Minute})
}

// TestDynamicMetadata checks envoy.response_dynamic_metadata against
// envoyproxy/ratelimit's ratelimitToMetadata: the domain, the descriptors'
// entries as "key=value", and the metadata: of the rules of the
// descriptors that passed, merged with the first one's values kept.
func TestDynamicMetadata(t *testing.T) {
	e := newEnv(t, memStore, erlExamples, func(o *Options) { o.ResponseDynamicMetadata, o.ResponseHeaders = true, true })
	s1, s2 := desc("service", "service_1"), desc("service", "service_2")
	resp := e.call("rl", s1, s2)
	want := map[string]any{
		"domain": "rl",
		"descriptors": []any{
			map[string]any{"entries": []any{"service=service_1"}},
			map[string]any{"entries": []any{"service=service_2"}},
		},
		// Both passed: service_1's name is kept, as mergeMetadata keeps a
		// field already present.
		"metadata": map[string]any{"service_with_quota": map[string]any{"name": "service_1"}},
	}
	checkStruct(t, "both pass", resp.GetDynamicMetadata(), want)
	resp = e.call("rl", s1, s2)
	want["metadata"] = map[string]any{"service_with_quota": map[string]any{"name": "service_2"}}
	checkStruct(t, "service_1 over its quota", resp.GetDynamicMetadata(), want)
	// The request passed: the quota it could not take says nothing about
	// when to retry.
	for _, h := range resp.GetResponseHeadersToAdd() {
		if h.GetKey() == "Retry-After" {
			t.Errorf("Retry-After %s on a request that passed", h.GetValue())
		}
	}
	resp = e.call("rl", s1, s2)
	delete(want, "metadata")
	checkStruct(t, "both over", resp.GetDynamicMetadata(), want)

	off := newEnv(t, memStore, erlExamples, nil)
	if md := off.call("rl", s1).GetDynamicMetadata(); md != nil {
		t.Errorf("dynamic metadata %v without response_dynamic_metadata", md)
	}
}

func checkStruct(t *testing.T, what string, got *structpb.Struct, want map[string]any) {
	t.Helper()
	w, err := structpb.NewStruct(want)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, w) {
		t.Errorf("%s: dynamic metadata\n%v\nwant\n%v", what, got, w)
	}
}
