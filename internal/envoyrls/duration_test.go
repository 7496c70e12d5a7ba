package envoyrls

import (
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	dto "github.com/prometheus/client_model/go"
)

// TestRequestDuration: every ShouldRateLimit call, answered or refused as
// invalid, is one observation of sluice_envoy_rls_request_duration_seconds.
func TestRequestDuration(t *testing.T) {
	e := newEnv(t, memStore, "testdata/config", nil)
	if _, err := e.callRaw(&rlsv3.RateLimitRequest{Domain: "test-domain", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key2", "x")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.callRaw(&rlsv3.RateLimitRequest{Domain: ""}); err == nil {
		t.Fatal("an empty domain was answered")
	}
	var m dto.Metric
	if err := e.svc.metrics.seconds.Write(&m); err != nil {
		t.Fatal(err)
	}
	if n := m.GetHistogram().GetSampleCount(); n != 2 {
		t.Errorf("%d observations, want 2", n)
	}
}
