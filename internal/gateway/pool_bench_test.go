package gateway

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/memstore"

	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/upstream"
)

// BenchmarkPoolRouting: the process CPU per request of a gateway routing
// among three upstreams (provider rpm and tpm reserved, settled, headers
// learned), beside a single-upstream gateway in the same run, both on the
// memory store in front of one fake upstream; alternating blocks of 50
// requests, so that both see the same machine. added-cpu-µs/req is the
// routing's cost.
//
//	go test -run '^$' -bench BenchmarkPoolRouting -benchtime 2000x ./internal/gateway/
func BenchmarkPoolRouting(b *testing.B) {
	up := fakeopenai.New(b, fakeopenai.Options{CompletionTokens: 2, MaxRecorded: 1})
	single := &Config{
		Upstream: UpstreamConfig{BaseURL: up.URL() + "/v1", APIKeyEnv: "K"},
		Models:   []string{"gpt-test"},
		Store:    StoreConfig{Timeout: 5 * time.Second},
		Tiers:    map[string]TierConfig{"t": Tier(Limits{RPM: 1 << 30, TPM: 1 << 36})},
		Keys:     []KeyConfig{{Name: "test", Hash: sluice.HashKey(clientKey), Tier: "t"}},
	}
	if err := single.Validate(); err != nil {
		b.Fatal(err)
	}
	pool := &Config{Models: single.Models, Store: single.Store, Tiers: single.Tiers, Keys: single.Keys, Routes: map[string][]upstream.Target{}}
	for i := range 3 {
		name := fmt.Sprintf("up%d", i)
		pool.Upstreams = append(pool.Upstreams, upstream.Def{Name: name, Kind: upstream.OpenAI, BaseURL: up.URL() + "/v1", KeyEnv: "K",
			Models: map[string]upstream.Limits{"gpt-test-" + name: {RPM: 1 << 30, TPM: 1 << 36}}})
		pool.Routes["gpt-test"] = append(pool.Routes["gpt-test"], upstream.Target{Upstream: name, Model: "gpt-test-" + name})
	}
	if err := pool.Validate(); err != nil {
		b.Fatal(err)
	}
	_, singleSrv := benchGateway(b, single)
	_, poolSrv := benchGateway(b, pool)
	for range 20 { // warm connections and vocabularies
		benchPost(b, singleSrv.URL)
		benchPost(b, poolSrv.URL)
	}
	const block = 50
	var cpuSingle, cpuPool time.Duration
	n := 0
	b.ResetTimer()
	for n < b.N {
		c0 := processCPU(b)
		for range block {
			benchPost(b, singleSrv.URL)
		}
		c1 := processCPU(b)
		for range block {
			benchPost(b, poolSrv.URL)
		}
		c2 := processCPU(b)
		cpuSingle += c1 - c0
		cpuPool += c2 - c1
		n += block
	}
	b.StopTimer()
	perReq := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
	b.ReportMetric(perReq(cpuSingle), "single-cpu-µs/req")
	b.ReportMetric(perReq(cpuPool), "pool-cpu-µs/req")
	b.ReportMetric(perReq(cpuPool-cpuSingle), "added-cpu-µs/req")
	b.ReportMetric(float64(cpuPool)/float64(cpuSingle), "pool/single")
}

// benchGateway starts a gateway on cfg and a memory store.
func benchGateway(b *testing.B, cfg *Config) (*Gateway, *httptest.Server) {
	b.Helper()
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	gw, err := New(Options{Config: cfg, Store: st, Getenv: func(string) string { return upstreamKey }})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	b.Cleanup(func() { srv.Close(); _ = gw.Close() })
	return gw, srv
}

// benchPost sends one chat request and reads the answer whole.
func benchPost(b *testing.B, url string) {
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Authorization", "Bearer "+clientKey)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	_ = res.Body.Close()
	if res.StatusCode != 200 {
		b.Fatalf("status %d", res.StatusCode)
	}
}
