package tracing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/memstore"
)

const (
	incomingTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	incomingSpan  = "00f067aa0ba902b7"
	traceparent   = "00-" + incomingTrace + "-" + incomingSpan + "-01"
)

func newTest(t *testing.T) (*Tracing, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return New(tp), exp
}

// spanByName returns the one span called name.
func spanByName(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		var names []string
		for _, s := range spans {
			names = append(names, s.Name)
		}
		t.Fatalf("%d spans named %q; have %v", len(found), name, names)
	}
	return found[0]
}

func attrs(s tracetest.SpanStub) map[string]string {
	m := map[string]string{}
	for _, a := range s.Attributes {
		m[string(a.Key)] = a.Value.String()
	}
	return m
}

// noSecret fails if secret appears in any span's name, attribute or event.
func noSecret(t *testing.T, spans tracetest.SpanStubs, secret string) {
	t.Helper()
	for _, s := range spans {
		if strings.Contains(s.Name, secret) {
			t.Errorf("span name %q holds the key", s.Name)
		}
		for k, v := range attrs(s) {
			if strings.Contains(v, secret) {
				t.Errorf("span %q attribute %s=%q holds the key", s.Name, k, v)
			}
		}
		for _, e := range s.Events {
			for _, a := range e.Attributes {
				if strings.Contains(a.Value.String(), secret) {
					t.Errorf("span %q event %s holds the key", s.Name, e.Name)
				}
			}
		}
	}
}

// TestHandlerStoreAnnotate: a request span continues the incoming
// traceparent, carries the decision, the store call is its child, and no
// key appears anywhere, also for a path that holds one.
func TestHandlerStoreAnnotate(t *testing.T) {
	tr, exp := newTest(t)
	ms, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	store := tr.Store(ms)
	const secret = "sk-live-SECRET-key-123"
	lim, _ := sluice.ParseLimit("1/min")
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/status/{key}", func(w http.ResponseWriter, r *http.Request) {
		req := sluice.Request{Key: "key:" + secret, Algorithm: sluice.GCRA, Limit: lim, Cost: 1}
		ds, err := store.ApplyAll(r.Context(), sluice.OpAllow, []sluice.Request{req})
		if err != nil {
			t.Error(err)
			return
		}
		Annotate(r.Context(), []Decision{{Policy: "free", Algorithm: sluice.GCRA, Decision: ds[0]}})
		if !ds[0].Allowed {
			w.WriteHeader(http.StatusTooManyRequests)
		}
	})
	h := tr.Handler(mux)
	for i, want := range []int{200, 429} {
		req := httptest.NewRequest("POST", "/v1/status/"+secret+"?api_key="+secret, nil)
		req.Header.Set("traceparent", traceparent)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Fatalf("request %d: status %d, want %d", i, rec.Code, want)
		}
	}
	spans := exp.GetSpans()
	noSecret(t, spans, secret)
	var servers []tracetest.SpanStub
	for _, s := range spans {
		if s.SpanKind == trace.SpanKindServer {
			servers = append(servers, s)
		}
	}
	if len(servers) != 2 {
		t.Fatalf("%d server spans, want 2", len(servers))
	}
	for i, s := range servers {
		if s.Name != "POST /v1/status/{key}" {
			t.Errorf("span name %q, want the route pattern", s.Name)
		}
		if s.SpanContext.TraceID().String() != incomingTrace || s.Parent.SpanID().String() != incomingSpan {
			t.Errorf("server span does not continue the incoming traceparent: trace %s parent %s", s.SpanContext.TraceID(), s.Parent.SpanID())
		}
		a := attrs(s)
		wantOutcome, wantStatus := "allowed", "200"
		if i == 1 {
			wantOutcome, wantStatus = "denied", "429"
		}
		for k, v := range map[string]string{"sluice.policy": `["free"]`, "sluice.algorithm": `["gcra"]`, "sluice.outcome": wantOutcome, "sluice.degraded": "false", "http.response.status_code": wantStatus} {
			if a[k] != v {
				t.Errorf("request %d: %s = %q, want %q (all: %v)", i, k, a[k], v, a)
			}
		}
		if _, ok := a["sluice.store.latency_ms"]; !ok {
			t.Errorf("request %d: no sluice.store.latency_ms", i)
		}
	}
	n := 0
	for _, s := range spans {
		if s.Name == "sluice.store ApplyAll" {
			n++
			if s.Parent.SpanID() != servers[0].SpanContext.SpanID() && s.Parent.SpanID() != servers[1].SpanContext.SpanID() {
				t.Error("store span is not a child of a request span")
			}
			if a := attrs(s); a["sluice.op"] != "allow" || a["sluice.algorithm"] != `["gcra"]` {
				t.Errorf("store span attributes %v", a)
			}
		}
	}
	if n != 2 {
		t.Errorf("%d store spans, want 2", n)
	}
}

// TestTransportPropagates: through a reverse proxy (as the gateway is),
// the upstream receives a traceparent of the incoming trace whose parent
// is the client span, not the caller's own span id.
func TestTransportPropagates(t *testing.T) {
	tr, exp := newTest(t)
	got := make(chan string, 1)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("traceparent")
		_, _ = io.WriteString(w, "ok")
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) }, Transport: tr.Transport(nil)}
	front := httptest.NewServer(tr.Handler(proxy))
	defer front.Close()
	req, _ := http.NewRequest("POST", front.URL+"/v1/chat/completions", strings.NewReader("{}"))
	req.Header.Set("traceparent", traceparent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	tp := <-got
	client := spanByName(t, exp.GetSpans(), "upstream POST")
	want := "00-" + incomingTrace + "-" + client.SpanContext.SpanID().String() + "-01"
	if tp != want {
		t.Errorf("upstream traceparent %q, want %q", tp, want)
	}
	if a := attrs(client); a["http.response.status_code"] != "200" || a["server.address"] != u.Host {
		t.Errorf("client span attributes %v", a)
	}
}

// TestOff: a nil *Tracing changes nothing: the same handler, transport and
// store come back, and the environment alone decides whether it is on.
func TestOff(t *testing.T) {
	var tr *Tracing
	h := http.NotFoundHandler()
	if got := tr.Handler(h); got == nil || tr.Transport(http.DefaultTransport) != http.DefaultTransport || tr.GRPCServerOptions() != nil || tr.Shutdown(context.Background()) != nil {
		t.Error("a nil Tracing wraps something")
	}
	ms, _ := memstore.New(memstore.Options{})
	defer ms.Close()
	if tr.Store(ms) != sluice.Store(ms) {
		t.Error("a nil Tracing wraps the store")
	}
	for _, env := range [][2]string{{"OTEL_EXPORTER_OTLP_ENDPOINT", ""}, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", ""}} {
		t.Setenv(env[0], env[1])
	}
	if Enabled() {
		t.Error("enabled without an endpoint")
	}
	if got, err := FromEnv(context.Background(), "test"); got != nil || err != nil {
		t.Errorf("FromEnv without an endpoint = %v, %v", got, err)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
	if !Enabled() {
		t.Error("not enabled with an endpoint")
	}
	t.Setenv("OTEL_SDK_DISABLED", "true")
	if Enabled() {
		t.Error("enabled with OTEL_SDK_DISABLED=true")
	}
	t.Setenv("OTEL_SDK_DISABLED", "")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
	if _, err := FromEnv(context.Background(), "test"); err == nil {
		t.Error("an unknown protocol was accepted")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	got, err := FromEnv(context.Background(), "test")
	if err != nil || got == nil {
		t.Fatalf("FromEnv with an endpoint = %v, %v", got, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	_ = got.Shutdown(ctx) // nothing was exported; just stop it
}

// TestStoreErrorHoldsNoKey: a store error names the request's key
// (sluice's errors do, and a caller can provoke one with a cost past the
// burst); its span records the error's class only.
func TestStoreErrorHoldsNoKey(t *testing.T) {
	tr, exp := newTest(t)
	ms, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	const secret = "user:alice@example.com"
	lim, _ := sluice.ParseLimit("1/min")
	ctx, parent := tr.tracer.Start(context.Background(), "request")
	_, err = tr.Store(ms).Apply(ctx, sluice.OpAllow, sluice.Request{Key: secret, Algorithm: sluice.GCRA, Limit: lim, Cost: 5})
	parent.End()
	if !errors.Is(err, sluice.ErrCostExceedsBurst) || !strings.Contains(err.Error(), secret) {
		t.Fatalf("the store's error, which names the key, is returned whole: %v", err)
	}
	spans := exp.GetSpans()
	noSecret(t, spans, secret)
	s := spanByName(t, spans, "sluice.store Apply")
	if len(s.Events) != 1 || !strings.Contains(fmt.Sprint(s.Events[0].Attributes), sluice.ErrCostExceedsBurst.Error()) {
		t.Fatalf("the span does not record the error's class: %v", s.Events)
	}
}

// TestNoRootSpans: a store call outside a traced request (a probe, a
// heartbeat, a background flush) and a health check or scrape make no
// span, and the store wrapper unwraps to the store, so that the guard
// finds its Ping, Sharded and Membership.
func TestNoRootSpans(t *testing.T) {
	tr, exp := newTest(t)
	ms, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	st := tr.Store(ms)
	if u, ok := st.(interface{ Unwrap() sluice.Store }); !ok || u.Unwrap() != sluice.Store(ms) {
		t.Error("the traced store does not unwrap to the store")
	}
	lim, _ := sluice.ParseLimit("1/s")
	req := sluice.Request{Key: "k", Algorithm: sluice.GCRA, Limit: lim}
	if _, err := st.Apply(context.Background(), sluice.OpPeek, req); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ApplyAll(context.Background(), sluice.OpPeek, []sluice.Request{req}); err != nil {
		t.Fatal(err)
	}
	h := tr.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for _, p := range []string{"/healthz", "/readyz", "/livez", "/metrics"} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", p, nil))
	}
	if spans := exp.GetSpans(); len(spans) != 0 {
		t.Fatalf("%d spans without a request, want 0: %v", len(spans), spans[0].Name)
	}
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/v1/status", nil))
	if n := len(exp.GetSpans()); n != 1 {
		t.Fatalf("%d spans for a request, want 1", n)
	}
}
