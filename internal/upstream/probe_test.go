package upstream

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// TestProbeRequest: a probe is the kind's cheapest read with the
// upstream's own credentials: GET {base_url}/models for OpenAI
// (https://platform.openai.com/docs/api-reference/models/list) and
// Anthropic (https://docs.anthropic.com/en/api/models-list, with
// x-api-key and anthropic-version), Azure OpenAI's
// GET /openai/models?api-version= with api-key, or health_path; any
// answer below 500 is reachable, a 5xx is not.
func TestProbeRequest(t *testing.T) {
	var mu sync.Mutex
	var got []*http.Request
	status := http.StatusUnauthorized
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r)
		s := status
		mu.Unlock()
		w.WriteHeader(s)
	}))
	t.Cleanup(srv.Close)
	defs := []Def{
		{Name: "o", Kind: OpenAI, BaseURL: srv.URL + "/v1", KeyEnv: "K", Models: map[string]Limits{"m": {RPM: 1}}},
		{Name: "a", Kind: Anthropic, BaseURL: srv.URL + "/v1", KeyEnv: "K", Models: map[string]Limits{"m": {RPM: 1}}},
		{Name: "z", Kind: Azure, BaseURL: srv.URL, KeyEnv: "K", Models: map[string]Limits{"m": {RPM: 1}}},
		{Name: "h", Kind: OpenAICompatible, BaseURL: srv.URL + "/api", KeyEnv: "K", HealthPath: "/health?deep=0", Models: map[string]Limits{"m": {RPM: 1}}},
	}
	routes := map[string][]Target{"m": {{Upstream: "o"}, {Upstream: "a"}, {Upstream: "z"}, {Upstream: "h"}}}
	p, _ := testPool(t, defs, routes, Routing{})
	for _, u := range p.Upstreams() {
		if !p.probeOnce(context.Background(), u) {
			t.Fatalf("%s: a 401 is an answer: reachable", u.Name)
		}
	}
	want := []struct{ path, query, header, value string }{
		{"/v1/models", "", "Authorization", "Bearer sk-test"},
		{"/v1/models", "", "X-Api-Key", "sk-test"},
		{"/openai/models", "api-version=" + DefaultAzureAPIVersion, "Api-Key", "sk-test"},
		{"/api/health", "deep=0", "Authorization", "Bearer sk-test"},
	}
	for i, w := range want {
		r := got[i]
		if r.Method != http.MethodGet || r.URL.Path != w.path || r.URL.RawQuery != w.query || r.Header.Get(w.header) != w.value {
			t.Errorf("%s: probe %s %s?%s %v", defs[i].Name, r.Method, r.URL.Path, r.URL.RawQuery, r.Header)
		}
	}
	if got[1].Header.Get("Anthropic-Version") == "" {
		t.Error("anthropic probe without anthropic-version")
	}
	mu.Lock()
	status = http.StatusBadGateway
	mu.Unlock()
	if p.probeOnce(context.Background(), p.Upstreams()[0]) {
		t.Fatal("a 502 probe counted as reachable")
	}
}
