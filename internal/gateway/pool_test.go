package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeanthropic"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/upstream"
	"github.com/sluice-io/sluice/memstore"
)

// poolConfig routes gpt-test to every server of ups, as model gpt-test-N
// on upstream upN, each with limits l; the test key's tier has generous
// limits.
func poolConfig(t *testing.T, ups []*fakeopenai.Server, l upstream.Limits) *Config {
	t.Helper()
	cfg := &Config{
		Models: []string{"gpt-test"},
		Store:  StoreConfig{Timeout: 5 * time.Second},
		Tiers:  map[string]TierConfig{"t": Tier(Limits{RPM: 1_000_000, TPM: 100_000_000})},
		Keys:   []KeyConfig{{Name: "test", Hash: sluice.HashKey(clientKey), Tier: "t"}},
		Routes: map[string][]upstream.Target{},
	}
	for i, up := range ups {
		name := fmt.Sprintf("up%d", i)
		cfg.Upstreams = append(cfg.Upstreams, upstream.Def{Name: name, Kind: upstream.OpenAI, BaseURL: up.URL() + "/v1", KeyEnv: "KEY_" + name,
			Models: map[string]upstream.Limits{fmt.Sprintf("gpt-test-%d", i): l}})
		cfg.Routes["gpt-test"] = append(cfg.Routes["gpt-test"], upstream.Target{Upstream: name, Model: fmt.Sprintf("gpt-test-%d", i)})
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// poolGateway starts a gateway on cfg and st; every upstream key is
// upstreamKey.
func poolGateway(t *testing.T, cfg *Config, st sluice.Store, period time.Duration, reg prometheus.Registerer) (*Gateway, *httptest.Server) {
	t.Helper()
	gw, err := New(Options{Config: cfg, Store: st, Getenv: func(string) string { return upstreamKey }, PoolPeriod: period, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(func() { srv.Close(); _ = gw.Close() })
	return gw, srv
}

func postTo(t *testing.T, url, body string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+clientKey)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0, nil, ""
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, string(b)
}

func memStore(t *testing.T) sluice.Store {
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				if !hasLabel(m, k, v) {
					continue next
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

func hasLabel(m *dto.Metric, k, v string) bool {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == k && lp.GetValue() == v {
			return true
		}
	}
	return false
}

// TestPoolRoutesWithUpstreamModel: a request goes to an upstream with
// that upstream's model id and key, and the client's key stays here.
func TestPoolRoutesWithUpstreamModel(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey})
	_, srv := poolGateway(t, poolConfig(t, []*fakeopenai.Server{up}, upstream.Limits{RPM: 100}), memStore(t), 0, nil)
	status, _, body := postTo(t, srv.URL, chatBody)
	if status != 200 {
		t.Fatalf("status %d %s", status, body)
	}
	got := up.Requests()[0]
	if !strings.Contains(string(got.Body), `"model":"gpt-test-0"`) || got.Authorization != "Bearer "+upstreamKey {
		t.Fatalf("upstream got %s with %q", got.Body, got.Authorization)
	}
}

// TestPoolNoRoomRefuses: with every upstream at its provider limit the
// gateway answers 429 with an honest Retry-After and sends nothing, and
// the client's own limits are refunded.
func TestPoolNoRoomRefuses(t *testing.T) {
	ups := []*fakeopenai.Server{fakeopenai.New(t, fakeopenai.Options{RPM: 2}), fakeopenai.New(t, fakeopenai.Options{RPM: 2})}
	cfg := poolConfig(t, ups, upstream.Limits{RPM: 2})
	cfg.Routing.Margin = new(float64) // the exact limits (2% of 2 keeps 1 back)
	cfg.Tiers["t"] = Tier(Limits{RPM: 5})
	st := memStore(t)
	gw, srv := poolGateway(t, cfg, st, 0, nil)
	for i := range 4 {
		if status, _, body := postTo(t, srv.URL, chatBody); status != 200 {
			t.Fatalf("request %d: %d %s", i, status, body)
		}
	}
	status, h, body := postTo(t, srv.URL, chatBody)
	if status != 429 || h.Get("Retry-After") == "" || h.Get("Retry-After") == "0" || !strings.Contains(body, "provider limit") {
		t.Fatalf("5th: %d %v %s", status, h, body)
	}
	if n := ups[0].Count() + ups[1].Count(); n != 4 || ups[0].Limited()+ups[1].Limited() != 0 {
		t.Fatalf("upstreams got %d, limited %d", n, ups[0].Limited()+ups[1].Limited())
	}
	// The refused request's rpm came back: one of the client's 5 is left.
	gw.Close() // settlements done
	d, err := st.Apply(context.Background(), sluice.OpPeek, sluice.Request{Key: "{gw:" + cfg.Keys[0].Client + "}:rpm", Algorithm: sluice.GCRA,
		Limit: sluice.Limit{Rate: 5, Period: time.Minute}})
	if err != nil || d.Remaining != 1 {
		t.Fatalf("client rpm left %d (%v), want 1: the refused request was charged", d.Remaining, err)
	}
}

// TestPoolFailover: a 5xx, 529, 429 or refused connection before the first
// byte moves the request to another upstream; the client sees 200, and
// each upstream was sent the request once.
func TestPoolFailover(t *testing.T) {
	for _, fault := range []fakeopenai.Fault{{Status: 500}, {Status: 529}, {Status: 429, RetryAfter: "2"}, {Status: 503}} {
		t.Run(fmt.Sprint(fault.Status), func(t *testing.T) {
			a, b := fakeopenai.New(t, fakeopenai.Options{}), fakeopenai.New(t, fakeopenai.Options{})
			a.Enqueue(fault)
			b.Enqueue(fault)
			reg := prometheus.NewRegistry()
			cfg := poolConfig(t, []*fakeopenai.Server{a, b, fakeopenai.New(t, fakeopenai.Options{})}, upstream.Limits{RPM: 100})
			cfg.Routing.Policy = upstream.PolicyLatency // up0 first: no latency known, stable order
			_, srv := poolGateway(t, cfg, memStore(t), 0, reg)
			for _, stream := range []bool{false, true} {
				body := chatBody
				if stream {
					body = strings.Replace(chatBody, `"max_tokens":50`, `"max_tokens":50,"stream":true`, 1)
				}
				status, _, resp := postTo(t, srv.URL, body)
				if status != 200 || (stream && !strings.Contains(resp, "[DONE]")) {
					t.Fatalf("stream %v: %d %s", stream, status, resp)
				}
			}
			if f := counter(t, reg, "sluice_gateway_upstream_failovers_total", nil); f < 2 {
				t.Fatalf("failovers %v", f)
			}
		})
	}
	t.Run("connection refused", func(t *testing.T) {
		a, b := fakeopenai.New(t, fakeopenai.Options{}), fakeopenai.New(t, fakeopenai.Options{})
		a.Close()
		_, srv := poolGateway(t, poolConfig(t, []*fakeopenai.Server{a, b}, upstream.Limits{RPM: 100}), memStore(t), 0, nil)
		for range 4 {
			if status, _, body := postTo(t, srv.URL, chatBody); status != 200 {
				t.Fatalf("%d %s", status, body)
			}
		}
	})
}

// TestPoolStreamNotReplayed: a stream cut after its first byte is the
// client's; it is never sent to another upstream.
func TestPoolStreamNotReplayed(t *testing.T) {
	a, b := fakeopenai.New(t, fakeopenai.Options{}), fakeopenai.New(t, fakeopenai.Options{})
	a.Enqueue(fakeopenai.Fault{CutAfter: 2})
	b.Enqueue(fakeopenai.Fault{CutAfter: 2})
	_, srv := poolGateway(t, poolConfig(t, []*fakeopenai.Server{a, b}, upstream.Limits{RPM: 100}), memStore(t), 0, nil)
	body := strings.Replace(chatBody, `"max_tokens":50`, `"max_tokens":50,"stream":true`, 1)
	status, _, resp := postTo(t, srv.URL, body)
	if status != 200 || strings.Contains(resp, "[DONE]") {
		t.Fatalf("%d %s", status, resp)
	}
	if a.Count()+b.Count() != 1 {
		t.Fatalf("sent %d times", a.Count()+b.Count())
	}
}

// TestPoolOfficialSDK: the official openai-go SDK, unmodified, against a
// pool whose first upstream fails: JSON and a stream both arrive whole.
func TestPoolOfficialSDK(t *testing.T) {
	a, b := fakeopenai.New(t, fakeopenai.Options{CompletionTokens: 6}), fakeopenai.New(t, fakeopenai.Options{CompletionTokens: 6})
	a.Enqueue(fakeopenai.Fault{Status: 503})
	cfg := poolConfig(t, []*fakeopenai.Server{a, b}, upstream.Limits{RPM: 100, TPM: 100000})
	cfg.Routing.Policy = upstream.PolicyLatency
	_, srv := poolGateway(t, cfg, memStore(t), 0, nil)
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey(clientKey), option.WithMaxRetries(0))
	ctx := context.Background()
	params := chatParams(20)
	params.StreamOptions.IncludeUsage = openai.Bool(true)
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if acc.Choices[0].Message.Content != strings.Repeat("tok ", 6) || acc.Usage.CompletionTokens != 6 {
		t.Fatalf("stream %+v", acc.ChatCompletion)
	}
	resp, err := client.Chat.Completions.New(ctx, chatParams(20))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Message.Content != strings.Repeat("tok ", 6) {
		t.Fatalf("response %+v", resp)
	}
	// The stream failed over from a; the JSON request then went to b
	// first, a being marked down on this replica.
	if b.Count() != 2 || a.Count() != 1 {
		t.Fatalf("a got %d, b %d", a.Count(), b.Count())
	}
}

// TestPoolStatus: /v1/status shows each upstream model's headroom to an
// admin token only: a client key sees its own limits, never the pool's
// upstream names, limits or remaining capacity; and the metrics count
// what was sent, per upstream and model.
func TestPoolStatus(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{RPM: 10})
	reg := prometheus.NewRegistry()
	const adminToken = "admin-token-for-the-test"
	gw, err := New(Options{Config: poolConfig(t, []*fakeopenai.Server{up}, upstream.Limits{RPM: 10}), Store: memStore(t), Getenv: func(string) string { return upstreamKey },
		Registerer: reg, Admin: func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer "+adminToken }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(func() { srv.Close(); _ = gw.Close() })
	for range 3 {
		if status, _, body := postTo(t, srv.URL, chatBody); status != 200 {
			t.Fatalf("%d %s", status, body)
		}
	}
	get := func(token string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/status", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	status, body := get(clientKey)
	if status != 200 || strings.Contains(body, "upstream") || strings.Contains(body, "up0") || strings.Contains(body, "gpt-test-0") {
		t.Fatalf("a client key's status shows the pool: %d %s", status, body)
	}
	if status, body := get("not-the-admin-token"); status != 401 || strings.Contains(body, "up0") {
		t.Fatalf("a wrong token: %d %s", status, body)
	}
	status, body = get(adminToken)
	var st struct{ Upstreams []upstream.Status }
	if err := json.Unmarshal([]byte(body), &st); status != 200 || err != nil || len(st.Upstreams) != 1 {
		t.Fatalf("admin: %d %v %s", status, err, body)
	}
	u := st.Upstreams[0]
	// The store holds 9 of 10: the 2% margin keeps 1 back, by ceiling.
	if u.Upstream != "up0" || u.Model != "gpt-test-0" || u.Remaining["rpm"] != 6 || u.ProviderRemainingRequests != 7 || u.Headroom < 0.66 || u.Headroom > 0.67 || !u.Up || u.Unreachable != nil {
		t.Fatalf("status %+v", u)
	}
	if n := counter(t, reg, "sluice_gateway_upstream_requests_total", map[string]string{"upstream": "up0", "model": "gpt-test-0", "status": "2xx"}); n != 3 {
		t.Fatalf("sent %v", n)
	}
}

// TestPoolAnthropicUpstream: /v1/messages goes to the route's anthropic
// upstream, with its x-api-key and model id, and OpenAI's paths to the
// route's OpenAI upstream.
func TestPoolAnthropicUpstream(t *testing.T) {
	ant := fakeanthropic.New(t, fakeanthropic.Options{APIKey: "sk-ant-pool"})
	oa := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey})
	cfg := &Config{
		Models: []string{"claude-test"},
		Store:  StoreConfig{Timeout: 5 * time.Second},
		Tiers:  map[string]TierConfig{"t": Tier(Limits{RPM: 1000, TPM: 1_000_000})},
		Keys:   []KeyConfig{{Name: "test", Hash: sluice.HashKey(clientKey), Tier: "t"}},
		Upstreams: []upstream.Def{
			{Name: "ant", Kind: upstream.Anthropic, BaseURL: ant.URL() + "/v1", KeyEnv: "ANT", Models: map[string]upstream.Limits{"claude-test-20250101": {RPM: 10}}},
			{Name: "oa", Kind: upstream.OpenAICompatible, BaseURL: oa.URL() + "/v1", KeyEnv: "OA", Models: map[string]upstream.Limits{"claude-test": {RPM: 10}}},
		},
		Routes: map[string][]upstream.Target{"claude-test": {{Upstream: "ant", Model: "claude-test-20250101"}, {Upstream: "oa"}}},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{"ANT": "sk-ant-pool", "OA": upstreamKey}
	gw, err := New(Options{Config: cfg, Store: memStore(t), Getenv: func(k string) string { return keys[k] }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(func() { srv.Close(); _ = gw.Close() })
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages", strings.NewReader(messagesBody))
	req.Header.Set("x-api-key", clientKey)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || ant.Count() != 1 || oa.Count() != 0 {
		t.Fatalf("messages: %d %s; anthropic got %d, openai %d", res.StatusCode, b, ant.Count(), oa.Count())
	}
	got := ant.Requests()[0]
	if !strings.Contains(string(got.Body), `"model":"claude-test-20250101"`) || got.Header.Get("Authorization") != "" || got.Header.Get("Anthropic-Version") == "" {
		t.Fatalf("anthropic got %s %v", got.Body, got.Header)
	}
	chat := strings.Replace(chatBody, "gpt-test", "claude-test", 1)
	if status, _, body := postTo(t, srv.URL, chat); status != 200 || oa.Count() != 1 || ant.Count() != 1 {
		t.Fatalf("chat: %d %s", status, body)
	}
}

// TestPoolRouteWrongPath: a Claude model on OpenAI's path, whose route has
// only an Anthropic upstream (or an OpenAI model on /v1/messages), gets a
// routing error naming the route and the path to use, not 400
// request_too_large (which it got: no upstream of the path's kind fitted
// "its" reservation); nothing is sent or charged.
func TestPoolRouteWrongPath(t *testing.T) {
	ant := fakeanthropic.New(t, fakeanthropic.Options{})
	oa := fakeopenai.New(t, fakeopenai.Options{})
	cfg := &Config{
		Models: []string{"claude-test", "gpt-test"},
		Store:  StoreConfig{Timeout: 5 * time.Second},
		Tiers:  map[string]TierConfig{"t": Tier(Limits{RPM: 1000, TPM: 1_000_000})},
		Keys:   []KeyConfig{{Name: "test", Hash: sluice.HashKey(clientKey), Tier: "t"}},
		Upstreams: []upstream.Def{
			{Name: "ant", Kind: upstream.Anthropic, BaseURL: ant.URL() + "/v1", KeyEnv: "K", Models: map[string]upstream.Limits{"claude-test": {RPM: 10}}},
			{Name: "oa", Kind: upstream.OpenAI, BaseURL: oa.URL() + "/v1", KeyEnv: "K", Models: map[string]upstream.Limits{"gpt-test": {RPM: 10}}},
		},
		Routes: map[string][]upstream.Target{"claude-test": {{Upstream: "ant"}}, "gpt-test": {{Upstream: "oa"}}},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	st := memStore(t)
	gw, err := New(Options{Config: cfg, Store: st, Getenv: func(string) string { return "k" }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(func() { srv.Close(); _ = gw.Close() })
	chat := strings.Replace(chatBody, "gpt-test", "claude-test", 1)
	status, _, body := postTo(t, srv.URL, chat)
	if status != 400 || !strings.Contains(body, "model_not_on_this_path") || !strings.Contains(body, `route \"claude-test\"`) || !strings.Contains(body, "/v1/messages") {
		t.Fatalf("claude on /v1/chat/completions: %d %s", status, body)
	}
	msg := strings.Replace(messagesBody, "claude-test", "gpt-test", 1)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages", strings.NewReader(msg))
	req.Header.Set("x-api-key", clientKey)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 400 || !strings.Contains(string(b), `route \"gpt-test\"`) || !strings.Contains(string(b), "/v1/chat/completions") {
		t.Fatalf("gpt on /v1/messages: %d %s", res.StatusCode, b)
	}
	if ant.Count()+oa.Count() != 0 {
		t.Fatalf("sent %d", ant.Count()+oa.Count())
	}
	_ = gw.Close()
	d, err := st.Apply(context.Background(), sluice.OpPeek, sluice.Request{Key: "{gw:" + cfg.Keys[0].Client + "}:rpm", Algorithm: sluice.GCRA,
		Limit: sluice.Limit{Rate: 1000, Period: time.Minute}})
	if err != nil || d.Remaining != 1000 {
		t.Fatalf("client rpm left %d (%v): a routing error was charged", d.Remaining, err)
	}
}
