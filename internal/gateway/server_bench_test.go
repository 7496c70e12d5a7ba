package gateway

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/memstore"
)

// BenchmarkServerHandler is BenchmarkServeHTTP through the Server's
// handler: the Host check and the count of the generation a request is
// served by (reload.go) on top of the Gateway.
func BenchmarkServerHandler(b *testing.B) {
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	cfg := &Config{
		Upstream: UpstreamConfig{BaseURL: "http://upstream.invalid/v1"},
		Models:   []string{"gpt-test"},
		Tiers:    map[string]TierConfig{"big": {RPM: 1 << 30, TPM: 1 << 36, RPD: 1 << 36, Concurrency: 1 << 20}},
	}
	var keys []string
	for i := range 64 {
		keys = append(keys, fmt.Sprintf("sk-cpu-%d", i))
		cfg.Keys = append(cfg.Keys, KeyConfig{Name: "b", Hash: sluice.HashKey(keys[i]), Tier: "big"})
	}
	resp := []byte(`{"id":"x","object":"chat.completion","model":"gpt-test","choices":[{"index":0,"message":{"role":"assistant","content":"tok tok "},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14}}`)
	gw, err := New(Options{Config: cfg, Store: st, Transport: cannedUpstream{body: resp}})
	if err != nil {
		b.Fatal(err)
	}
	defer gw.Close()
	h := (&Server{Gateway: gw, Addr: "127.0.0.1:8090"}).Handler()
	b.ReportAllocs()
	b.ResetTimer()
	var n atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		key := "Bearer " + keys[n.Add(1)%int64(len(keys))]
		for pb.Next() {
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(benchBody))
			req.Host = "127.0.0.1:8090"
			req.Header.Set("Authorization", key)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != 200 {
				b.Fatalf("status %d: %s", w.Code, w.Body)
			}
		}
	})
}
