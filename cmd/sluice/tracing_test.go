package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/gateway"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/internal/server"
	"github.com/sluice-io/sluice/internal/tracing"
)

// otlpReceiver is an OTLP/HTTP trace endpoint: it decodes each export
// (protobuf) and keeps its spans.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []otlpSpan
}

// otlpSpan is what the test reads of an exported span.
type otlpSpan struct {
	name  string
	root  bool
	attrs map[string]string
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/traces" {
		http.NotFound(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				a := map[string]string{}
				for _, kv := range s.GetAttributes() {
					a[kv.GetKey()] = anyString(kv.GetValue())
				}
				o.spans = append(o.spans, otlpSpan{name: s.GetName(), root: len(s.GetParentSpanId()) == 0, attrs: a})
			}
		}
	}
	o.mu.Unlock()
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (o *otlpReceiver) take() []otlpSpan {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.spans
	o.spans = nil
	return s
}

// anyString renders an OTLP value: a string as is, an array as
// ["a","b"], others as Go prints them.
func anyString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	case *commonpb.AnyValue_DoubleValue:
		return fmt.Sprint(x.DoubleValue)
	case *commonpb.AnyValue_ArrayValue:
		parts := make([]string, 0, len(x.ArrayValue.GetValues()))
		for _, e := range x.ArrayValue.GetValues() {
			parts = append(parts, `"`+anyString(e)+`"`)
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	return v.String()
}

// pingCounter sits between the guard and the Redis store and signals each
// probe: the guard finds its Sharded methods first (through the traced
// store's Unwrap) and pings every node through it.
type pingCounter struct {
	sluice.Store
	sharded interface {
		NodeOf(key string) string
		Nodes(ctx context.Context) ([]string, error)
		PingNode(ctx context.Context, node string) error
	}
	pings chan struct{}
}

func (p *pingCounter) Unwrap() sluice.Store                            { return p.Store }
func (p *pingCounter) NodeOf(key string) string                        { return p.sharded.NodeOf(key) }
func (p *pingCounter) Nodes(ctx context.Context) ([]string, error)     { return p.sharded.Nodes(ctx) }
func (p *pingCounter) PingNode(ctx context.Context, node string) error { return p.ping(ctx, node) }

func (p *pingCounter) ping(ctx context.Context, node string) error {
	err := p.sharded.PingNode(ctx, node)
	select {
	case p.pings <- struct{}{}:
	default:
	}
	return err
}

// addrHandler passes log records on and reports the Envoy service's gRPC
// address from its "listening" line.
type addrHandler struct {
	slog.Handler
	grpc chan string
}

func (h addrHandler) Handle(ctx context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "grpc" {
			h.grpc <- a.Value.String()
		}
		return true
	})
	return h.Handler.Handle(ctx, r)
}

func (h addrHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return addrHandler{h.Handler.WithAttrs(as), h.grpc}
}

func (h addrHandler) WithGroup(name string) slog.Handler {
	return addrHandler{h.Handler.WithGroup(name), h.grpc}
}

const (
	traceProKey     = "sk-trace-pro-SECRET-1"
	traceGatewayKey = "sk-trace-gw-SECRET-2"
	traceUserID     = "user-SECRET-3"
)

// TestTracingIdleAndDoors runs `sluice serve` on a real Redis with the
// Envoy service and the gateway, exporting through the real OTLP/HTTP
// exporter to a receiver in the test. Idle over several probes of the
// store, it exports nothing: the guard's probes and heartbeats, the
// console's flushes and the overrides' loads make no root span. Then one
// request through each door exports one span named by its route, with the
// decision (policy, outcome, degraded) and, for the gateway, OpenTelemetry's
// GenAI attributes; no span holds a key.
func TestTracingIdleAndDoors(t *testing.T) {
	recv := &otlpReceiver{}
	collector := httptest.NewServer(recv)
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_TRACES_SAMPLER", "always_on")
	t.Setenv("TRACE_UPSTREAM_KEY", "sk-up")
	tr, err := tracing.FromEnv(context.Background(), "test")
	if err != nil || tr == nil {
		t.Fatalf("tracing: %v %v", tr, err)
	}
	defer func() { _ = tr.Shutdown(context.Background()) }()

	rds := redistest.NewStandalone(t)
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: "sk-up", PromptTokens: 7, CompletionTokens: 4})
	dir := t.TempDir()
	rl := "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n"
	if err := os.MkdirAll(filepath.Join(dir, "ratelimit"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ratelimit", "edge.yaml"), []byte(rl), 0o644); err != nil {
		t.Fatal(err)
	}
	doc := `listen: 127.0.0.1:0
store:
  url: ` + rds.URL() + `
  failure_policy: local
policies:
  pro: {algorithm: token_bucket, limit: 100/min}
  anon: {algorithm: gcra, limit: 30/min}
tiers:
  pro: {policies: [pro]}
  anon: {policies: [anon]}
keys:
  - {name: trace-pro, hash: ` + sluice.HashKey(traceProKey) + `, tier: pro}
authz:
  user_header: X-User-ID
  trusted_proxies: [127.0.0.0/8]
  default_tier: anon
envoy:
  grpc_addr: 127.0.0.1:0
  config_dir: ratelimit
gateway:
  listen: 127.0.0.1:0
  upstream: {base_url: "` + up.URL() + `/v1", api: openai, api_key_env: TRACE_UPSTREAM_KEY}
  models: [gpt-4o-mini]
  tiers:
    t: {rpm: 100, tpm: 100000}
  keys:
    - {name: trace-gw, hash: ` + sluice.HashKey(traceGatewayKey) + `, tier: t}
`
	path := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}

	pings := make(chan struct{}, 1)
	grpcAddr := make(chan string, 4)
	gwAddr := make(chan net.Addr, 1)
	listening := make(chan net.Addr, 1)
	gatewayWithAddr := func(d server.Deps) (server.Component, error) {
		c, err := gatewayComponent(d)
		if gs, ok := c.(*gateway.Server); ok {
			gs.OnListen = func(a net.Addr) { gwAddr <- a }
		}
		return c, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- server.Run(ctx, server.ServiceOptions{
			ConfigPath: path,
			Logger:     slog.New(addrHandler{slog.NewTextHandler(io.Discard, nil), grpcAddr}),
			OnListen:   func(a net.Addr) { listening <- a },
			Tracing:    tr,
			OpenStore: func(ctx context.Context, sc config.StoreSection) (sluice.Store, io.Closer, error) {
				st, closer, err := server.OpenStore(ctx, sc)
				if err != nil {
					return nil, nil, err
				}
				pc := &pingCounter{Store: st, pings: pings}
				for s := st; s != nil; {
					if sh, ok := s.(interface {
						NodeOf(string) string
						Nodes(context.Context) ([]string, error)
						PingNode(context.Context, string) error
					}); ok {
						pc.sharded = sh
						break
					}
					u, ok := s.(interface{ Unwrap() sluice.Store })
					if !ok {
						break
					}
					s = u.Unwrap()
				}
				if pc.sharded == nil {
					closer.Close()
					return nil, nil, fmt.Errorf("the Redis store is not sharded")
				}
				return pc, closer, nil
			},
			Components: []server.ComponentFunc{envoyComponent, gatewayWithAddr},
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	var base, gw, rlsAddr string
	for base == "" || gw == "" || rlsAddr == "" {
		select {
		case a := <-listening:
			base = "http://" + a.String()
		case a := <-gwAddr:
			gw = "http://" + a.String()
		case a := <-grpcAddr:
			rlsAddr = a
		case err := <-done:
			t.Fatalf("serve exited: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("serve did not start within 30 s")
		}
	}

	// Idle: five probes of the store after everything started (the
	// guard's ticker runs every 200 ms), then every span that ended is
	// exported: there must be none.
	for range 5 {
		select {
		case <-pings:
		case <-time.After(30 * time.Second):
			t.Fatal("the guard did not probe the store within 30 s")
		}
	}
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if spans := recv.take(); len(spans) != 0 {
		t.Fatalf("idle: %d spans exported, want 0; first %q (root %v)", len(spans), spans[0].name, spans[0].root)
	}

	// One request per door.
	post := func(url, body string, hdr map[string]string) string {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		if body == "" {
			req.Method = http.MethodGet
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", url, res.StatusCode, out)
		}
		return string(out)
	}
	post(base+"/v1/check", `{"api_key":"`+traceProKey+`"}`, nil)
	post(base+"/v1/authz/orders", "", map[string]string{"X-User-ID": traceUserID})
	conn, err := grpc.NewClient(rlsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rres, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
		Domain:      "edge",
		Descriptors: []*rlscommon.RateLimitDescriptor{{Entries: []*rlscommon.RateLimitDescriptor_Entry{{Key: "tenant", Value: traceUserID}}}},
	})
	if err != nil || rres.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit: %v %v", rres, err)
	}
	chat := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello"}],"max_tokens":10`
	auth := map[string]string{"Authorization": "Bearer " + traceGatewayKey}
	post(gw+"/v1/chat/completions", chat+`}`, auth)
	if out := post(gw+"/v1/chat/completions", chat+`,"stream":true}`, auth); !strings.Contains(out, "[DONE]") {
		t.Fatalf("stream: %s", out)
	}
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}

	spans := recv.take()
	roots := map[string][]otlpSpan{}
	for _, s := range spans {
		for k, v := range s.attrs {
			for _, secret := range []string{traceProKey, traceGatewayKey, traceUserID, "sk-up"} {
				if strings.Contains(v, secret) || strings.Contains(s.name, secret) {
					t.Errorf("span %q attribute %s=%q holds a secret", s.name, k, v)
				}
			}
		}
		if s.root {
			roots[s.name] = append(roots[s.name], s)
		}
	}
	if len(roots) != 4 {
		var names []string
		for n, ss := range roots {
			names = append(names, fmt.Sprintf("%s ×%d", n, len(ss)))
		}
		t.Errorf("root spans %v, want the 4 doors' (gateway ×2)", names)
	}
	want := []struct {
		name  string
		n     int
		attrs map[string]string
	}{
		{"POST /v1/check", 1, map[string]string{"sluice.policy": `["pro"]`, "sluice.outcome": "allowed", "sluice.degraded": "false", "http.route": "/v1/check"}},
		{"GET /v1/authz/", 1, map[string]string{"sluice.policy": `["anon"]`, "sluice.outcome": "allowed", "sluice.degraded": "false"}},
		{"envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", 1, map[string]string{
			"sluice.policy": `["edge.tenant"]`, "sluice.outcome": "allowed", "sluice.degraded": "false", "sluice.domain": "edge", "rpc.grpc.status_code": "0"}},
		{"POST /v1/chat/completions", 2, map[string]string{
			"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.system": "openai",
			"gen_ai.request.model": "gpt-4o-mini", "gen_ai.response.model": "gpt-4o-mini", "gen_ai.request.max_tokens": "10",
			"gen_ai.usage.input_tokens": "7", "gen_ai.usage.output_tokens": "4",
			"sluice.policy": `["t/rpm","t/tpm","t/reservation"]`, "sluice.outcome": "allowed", "sluice.degraded": "false", "http.route": "/v1/chat/completions"}},
	}
	for _, w := range want {
		got := roots[w.name]
		if len(got) != w.n {
			t.Errorf("%d root spans %q, want %d", len(got), w.name, w.n)
			continue
		}
		for i, s := range got {
			for k, v := range w.attrs {
				if s.attrs[k] != v {
					t.Errorf("%s #%d: %s = %q, want %q (all: %v)", w.name, i, k, s.attrs[k], v, s.attrs)
				}
			}
		}
	}
	streams := map[string]bool{}
	for _, s := range roots["POST /v1/chat/completions"] {
		streams[s.attrs["sluice.gateway.stream"]] = true
	}
	if !streams["true"] || !streams["false"] {
		t.Errorf("gateway spans' sluice.gateway.stream %v, want one of each", streams)
	}
}
