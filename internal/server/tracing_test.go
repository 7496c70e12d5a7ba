package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/tracing"
	"github.com/sluice-io/sluice/memstore"
)

// TestTracingSpans runs the service with tracing on (an in-memory
// exporter): a /v1/check on the pro tier (two policies, one of them
// shadow) is one server span continuing the caller's traceparent, with the
// policies, algorithms, outcome, degraded flag and store latency, and the
// store calls are its children. Neither the API key nor its hash nor the
// caller's key appears in any span.
func TestTracingSpans(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	path := t.TempDir() + "/sluice.yaml"
	writeAtomic(t, path, testConfig)
	listening := make(chan net.Addr, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, ServiceOptions{
			ConfigPath: path,
			Listen:     "127.0.0.1:0",
			Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
			OnListen:   func(a net.Addr) { listening <- a },
			Tracing:    tracing.New(tp),
			OpenStore: func(context.Context, config.StoreSection) (sluice.Store, io.Closer, error) {
				ms, err := memstore.New(memstore.Options{SweepInterval: -1})
				return ms, ms, err
			},
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	var base string
	select {
	case a := <-listening:
		base = "http://" + a.String()
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	const caller = "customer-7f3a-secret-id"
	for _, body := range []string{`{"api_key":"` + proKey + `"}`, `{"tier":"free","key":"` + caller + `"}`} {
		req, _ := http.NewRequest("POST", base+"/v1/check", strings.NewReader(body))
		req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("check %s: %d %s", body, resp.StatusCode, out)
		}
	}

	spans := exp.GetSpans()
	var server tracetest.SpanStub
	n := 0
	for _, s := range spans {
		if s.Name == "POST /v1/check" {
			n++
			if n == 1 {
				server = s
			}
		}
	}
	if n != 2 {
		t.Fatalf("%d POST /v1/check spans, want 2; all: %v", n, spanNames(spans))
	}
	if got := server.SpanContext.TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("trace id %s, want the caller's", got)
	}
	a := map[string]string{}
	for _, kv := range server.Attributes {
		a[string(kv.Key)] = kv.Value.String()
	}
	for k, want := range map[string]string{
		"sluice.policy":             `["pro","daily"]`,
		"sluice.algorithm":          `["token_bucket","fixed_window"]`,
		"sluice.outcome":            "allowed",
		"sluice.degraded":           "false",
		"http.response.status_code": "200",
		"http.route":                "/v1/check",
	} {
		if a[k] != want {
			t.Errorf("%s = %q, want %q", k, a[k], want)
		}
	}
	if a["sluice.store.latency_ms"] == "" {
		t.Error("no sluice.store.latency_ms")
	}
	stores := 0
	for _, s := range spans {
		// Only store calls made for a request have spans (no root spans).
		if strings.HasPrefix(s.Name, "sluice.store ") && s.Parent.IsValid() {
			stores++
			if s.Parent.TraceID() != server.SpanContext.TraceID() {
				t.Errorf("store span %s is not in the request's trace", s.Name)
			}
		}
		for _, kv := range s.Attributes {
			v := kv.Value.String()
			for _, secret := range []string{proKey, caller, "0d7308f7692a"} {
				if strings.Contains(v, secret) || strings.Contains(s.Name, secret) {
					t.Errorf("span %s attribute %s holds %q", s.Name, kv.Key, secret)
				}
			}
		}
	}
	if stores == 0 {
		t.Error("no store spans")
	}
}

func spanNames(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}
