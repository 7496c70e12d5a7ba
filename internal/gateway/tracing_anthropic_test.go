package gateway

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeanthropic"
	"github.com/sluice-io/sluice/internal/tracing"
	"github.com/sluice-io/sluice/memstore"
)

// TestAnthropicGenAISpans: an Anthropic Messages request, JSON and
// streamed, is a span named by its route with the GenAI attributes: the
// provider anthropic, the model asked and answered, max_tokens and the
// upstream's input (cache reads and writes included, unweighted) and
// output tokens.
func TestAnthropicGenAISpans(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr := tracing.New(tp)
	up := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey, InputTokens: 30, OutputTokens: 6, CacheReadInputTokens: 40, CacheCreationInputTokens: 8})
	st, err := memstore.New(memstore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	cfg := &Config{
		Upstream: UpstreamConfig{BaseURL: up.URL() + "/v1", API: APIAnthropic},
		Models:   []string{"claude-test"},
		Store:    StoreConfig{Timeout: 5 * time.Second},
		Tiers:    map[string]TierConfig{"t": Tier(Limits{RPM: 100, TPM: 100000})},
		Keys:     []KeyConfig{{Name: "test", Hash: sluice.HashKey(clientKey), Tier: "t"}},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	gw, err := New(Options{
		Config: cfg, Store: tr.Store(st), WrapTransport: tr.Transport,
		Getenv: func(k string) string { return map[string]string{DefaultAnthropicKeyEnv: upstreamKey}[k] },
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	front := httptest.NewServer(tr.Handler((&Server{Gateway: gw}).Handler()))
	for _, body := range []string{
		`{"model":"claude-test","max_tokens":20,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"claude-test","max_tokens":20,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
	} {
		req, _ := http.NewRequest(http.MethodPost, front.URL+"/v1/messages", strings.NewReader(body))
		req.Header.Set("x-api-key", clientKey)
		req.Header.Set("anthropic-version", "2023-06-01")
		req.Header.Set("content-type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", res.StatusCode, out)
		}
	}
	front.Close() // every request span has ended
	n := 0
	for _, s := range exp.GetSpans() {
		if s.SpanKind != trace.SpanKindServer {
			continue
		}
		n++
		a := attrs(s)
		for k, v := range map[string]string{
			"gen_ai.operation.name": "chat", "gen_ai.provider.name": "anthropic", "gen_ai.request.model": "claude-test",
			"gen_ai.response.model": "claude-test", "gen_ai.request.max_tokens": "20",
			"gen_ai.usage.input_tokens": "78", "gen_ai.usage.output_tokens": "6", "sluice.outcome": "allowed",
		} {
			if a[k] != v {
				t.Errorf("%s (stream %s): %s = %q, want %q (all %v)", s.Name, a["sluice.gateway.stream"], k, a[k], v, a)
			}
		}
		if s.Name != "POST /v1/messages" {
			t.Errorf("span name %q", s.Name)
		}
	}
	if n != 2 {
		t.Fatalf("%d server spans, want 2", n)
	}
}

func attrs(s tracetest.SpanStub) map[string]string {
	m := map[string]string{}
	for _, kv := range s.Attributes {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}
