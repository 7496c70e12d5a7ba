package envoyrls

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/tracing"
)

// TestDecisionSpans: with tracing on, each ShouldRateLimit call's server
// span carries the configured domain, the decided descriptors' configured
// keys and algorithms, the outcome, the overall code, degraded and the
// store latency; an unknown domain is named "_unknown_"; and no descriptor
// value or domain a client sent appears in any span.
func TestDecisionSpans(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tr := tracing.New(tp)
	svc, err := New(Options{Store: tr.Store(memStore(t, clock.NewFake(t0))), ConfigDir: "testdata/config",
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx, lis, tr.GRPCServerOptions()...) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	client := rlsv3.NewRateLimitServiceClient(conn)

	const secret = "sk-secret-value"
	calls := []*rlsv3.RateLimitRequest{
		{Domain: "algos", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("gcra", secret+"1"), desc("sw", secret+"2")}},
		{Domain: "algos", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("zero", secret+"3")}},
		{Domain: secret + "4", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", secret+"5")}},
	}
	for _, req := range calls {
		if _, err := client.ShouldRateLimit(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	_ = conn.Close()
	cancel()
	if err := <-done; err != nil { // graceful: every span has ended
		t.Fatal(err)
	}

	spans := map[string]map[string]attribute.Value{} // by domain and code: spans end in any order
	for _, s := range exp.GetSpans() {
		if strings.Contains(s.Name, secret) {
			t.Errorf("span name %q holds a client value", s.Name)
		}
		for _, kv := range s.Attributes {
			if strings.Contains(kv.Value.String(), secret) {
				t.Errorf("span %s attribute %s = %s holds a client value", s.Name, kv.Key, kv.Value.String())
			}
		}
		if s.Name == "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" {
			m := map[string]attribute.Value{}
			for _, kv := range s.Attributes {
				m[string(kv.Key)] = kv.Value
			}
			spans[m["sluice.domain"].AsString()+" "+m["sluice.envoy.code"].AsString()] = m
		}
	}
	if len(spans) != len(calls) {
		t.Fatalf("%d ShouldRateLimit spans, want %d", len(spans), len(calls))
	}
	for i, w := range []struct {
		domain, code, outcome string
		policies, algs        []string
		store                 bool
	}{
		{"algos", "OK", "allowed", []string{"algos.gcra", "algos.sw"}, []string{sluice.GCRA.String(), sluice.SlidingWindowCounter.String()}, true},
		{"algos", "OVER_LIMIT", "denied", []string{"algos.zero"}, []string{sluice.FixedWindow.String()}, false},
		{unknownDomain, "OK", "", nil, nil, false},
	} {
		a := spans[w.domain+" "+w.code]
		if a["sluice.domain"].AsString() != w.domain || a["sluice.envoy.code"].AsString() != w.code ||
			a["sluice.outcome"].AsString() != w.outcome || a["sluice.descriptors"].AsInt64() != int64(len(calls[i].Descriptors)) {
			t.Errorf("call %d: domain %q code %q outcome %q descriptors %d, want %q %q %q %d", i,
				a["sluice.domain"].AsString(), a["sluice.envoy.code"].AsString(), a["sluice.outcome"].AsString(), a["sluice.descriptors"].AsInt64(),
				w.domain, w.code, w.outcome, len(calls[i].Descriptors))
		}
		if got := a["sluice.policy"].AsStringSlice(); !slices.Equal(got, w.policies) {
			t.Errorf("call %d: sluice.policy %q, want %q", i, got, w.policies)
		}
		if got := a["sluice.algorithm"].AsStringSlice(); !slices.Equal(got, w.algs) {
			t.Errorf("call %d: sluice.algorithm %q, want %q", i, got, w.algs)
		}
		if w.policies != nil {
			if d, ok := a["sluice.degraded"]; !ok || d.AsBool() {
				t.Errorf("call %d: sluice.degraded %v (present %v), want false", i, d.AsBool(), ok)
			}
		}
		if _, ok := a["sluice.store.latency_ms"]; ok != w.store {
			t.Errorf("call %d: store latency present %v, want %v", i, ok, w.store)
		}
	}
}
