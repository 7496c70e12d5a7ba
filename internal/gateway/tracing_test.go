package gateway

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/tracing"
	"github.com/sluice-io/sluice/memstore"
)

// TestTraceContextToUpstream: with tracing on, a chat completion through
// the gateway reaches the upstream with a traceparent of the caller's
// trace whose parent is the gateway's upstream span, and no span carries
// the caller's API key or the upstream's.
func TestTraceContextToUpstream(t *testing.T) {
	got := make(chan string, 1)
	front, exp := tracedGateway(t, Limits{RPM: 100, TPM: 100000}, func(r *http.Request) { got <- r.Header.Get("traceparent") })

	req, _ := http.NewRequest("POST", front.URL+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-test","messages":[{"role":"user","content":"hello"}],"max_tokens":5}`))
	req.Header.Set("Authorization", "Bearer "+clientKey)
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	tp2 := <-got
	var upstream tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == "upstream POST" {
			upstream = s
		}
		for _, kv := range s.Attributes {
			if v := kv.Value.String(); strings.Contains(v, clientKey) || strings.Contains(v, upstreamKey) {
				t.Errorf("span %s attribute %s holds a key", s.Name, kv.Key)
			}
		}
	}
	if !upstream.SpanContext.IsValid() {
		t.Fatal("no upstream span")
	}
	want := "00-4bf92f3577b34da6a3ce929d0e0e4736-" + upstream.SpanContext.SpanID().String() + "-01"
	if tp2 != want {
		t.Errorf("upstream got traceparent %q, want %q", tp2, want)
	}
}

// TestAdmitSpans: with tracing on, each request's span carries the tier,
// the model's label, the admission outcome (admitted, too_large, limited),
// degraded, and the store latency when the store was asked; the client's
// key and an unknown model's name appear nowhere.
func TestAdmitSpans(t *testing.T) {
	front, exp := tracedGateway(t, Limits{RPM: 1, TPM: 1000}, func(*http.Request) {})

	const oddModel = "model-sk-private"
	for i, c := range []struct {
		model     string
		maxTokens int
		status    int
	}{
		{"gpt-test", 5, 200},
		{oddModel, 5000, 429}, // more tokens than the tier's TPM holds
		{"gpt-test", 5, 429},  // the minute's one request is spent
	} {
		req, _ := http.NewRequest("POST", front.URL+"/v1/chat/completions", strings.NewReader(
			`{"model":"`+c.model+`","messages":[{"role":"user","content":"hello"}],"max_tokens":`+strconv.Itoa(c.maxTokens)+`}`))
		req.Header.Set("Authorization", "Bearer "+clientKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Fatalf("request %d: status %d, want %d: %s", i, resp.StatusCode, c.status, body)
		}
	}
	front.Close()                         // waits for the handlers: every request span has ended
	got := map[string]map[string]string{} // by outcome: spans end in any order
	for _, s := range exp.GetSpans() {
		for _, kv := range s.Attributes {
			if v := kv.Value.String(); strings.Contains(v, clientKey) || strings.Contains(v, upstreamKey) || strings.Contains(v, oddModel) {
				t.Errorf("span %s attribute %s = %s holds a client's string", s.Name, kv.Key, v)
			}
		}
		if s.SpanKind == trace.SpanKindServer {
			m := map[string]string{}
			for _, kv := range s.Attributes {
				m[string(kv.Key)] = kv.Value.String()
			}
			got[m["sluice.gateway.outcome"]] = m
		}
	}
	want := []struct {
		model, outcome string
		store          bool
	}{
		{"gpt-test", "admitted", true},
		{"other", "too_large", false},
		{"gpt-test", "limited", true},
	}
	if len(got) != len(want) {
		t.Fatalf("%d server spans, want %d", len(got), len(want))
	}
	for i, w := range want {
		a := got[w.outcome]
		if a["sluice.tier"] != "t" || a["sluice.model"] != w.model || a["sluice.gateway.outcome"] != w.outcome || a["sluice.degraded"] != "false" {
			t.Errorf("request %d: attributes %v, want tier t, model %s, outcome %s, not degraded", i, a, w.model, w.outcome)
		}
		if _, ok := a["sluice.store.latency_ms"]; ok != w.store {
			t.Errorf("request %d: store latency present %v, want %v", i, ok, w.store)
		}
	}
}

// tracedGateway starts a gateway with tracing on (spans to exp, W3C
// traceparent upstream) for clientKey on a tier of limits, in front of an
// upstream that calls seen with each request and answers one chat
// completion.
func tracedGateway(t *testing.T, limits Limits, seen func(*http.Request)) (*httptest.Server, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr := tracing.New(tp)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen(r)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-test","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	}))
	t.Cleanup(up.Close)
	st, err := memstore.New(memstore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	cfg := &Config{
		Upstream: UpstreamConfig{BaseURL: up.URL + "/v1", APIKeyEnv: "TEST_UPSTREAM_KEY"},
		Models:   []string{"gpt-test"},
		Tiers:    map[string]TierConfig{"t": Tier(limits)},
		Keys:     []KeyConfig{{Name: "test", Hash: sluice.HashKey(clientKey), Tier: "t"}},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	gw, err := New(Options{
		Config: cfg, Store: tr.Store(st), WrapTransport: tr.Transport,
		Getenv: func(k string) string { return map[string]string{"TEST_UPSTREAM_KEY": upstreamKey}[k] },
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	front := httptest.NewServer(tr.Handler((&Server{Gateway: gw}).Handler()))
	t.Cleanup(front.Close)
	return front, exp
}
