package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeanthropic"
	"github.com/sluice-io/sluice/internal/upstream"
)

// TestPoolCountTokens: with routing.count_tokens a Claude request whose
// route has a provider token limit is counted by the route's Anthropic
// upstream (its own model id and key, never the client's), and the
// provider's input-token limit takes the larger of that count and the
// estimate; the same prompt again asks nothing. Off, nothing is asked.
func TestPoolCountTokens(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprint("count_tokens=", on), func(t *testing.T) {
			a := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey, InputTokens: 5000, OutputTokens: 6, StrictCount: true})
			cfg := &Config{
				Models: []string{"claude-test"},
				Store:  StoreConfig{Timeout: 5 * time.Second},
				Tiers:  map[string]TierConfig{"t": Tier(Limits{RPM: 1000})}, // no client token limit
				Keys:   []KeyConfig{{Name: "test", Hash: sluice.HashKey(clientKey), Tier: "t"}},
				Upstreams: []upstream.Def{{Name: "ant", Kind: upstream.Anthropic, BaseURL: a.URL() + "/v1", KeyEnv: "KEY_ANT",
					Models: map[string]upstream.Limits{"claude-test-2025": {ITPM: 100_000}}}},
				Routes: map[string][]upstream.Target{"claude-test": {{Upstream: "ant", Model: "claude-test-2025"}}},
			}
			margin := 0.0
			cfg.Routing.Margin = &margin
			cfg.Routing.CountTokens = on
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			gw, srv := poolGateway(t, cfg, memStore(t), 0, nil)
			body := `{"model":"claude-test","max_tokens":50,"messages":[{"role":"user","content":"hello there"}]}`
			for range 2 {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages", strings.NewReader(body))
				req.Header.Set("x-api-key", clientKey)
				req.Header.Set("anthropic-version", "2023-06-01")
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != 200 {
					t.Fatalf("status %d", res.StatusCode)
				}
			}
			calls := 0
			for _, r := range a.Requests() {
				if r.Path != "/v1/messages/count_tokens" {
					continue
				}
				calls++
				var m map[string]json.RawMessage
				if err := json.Unmarshal(r.Body, &m); err != nil || string(m["model"]) != `"claude-test-2025"` || r.Header.Get("X-Api-Key") != upstreamKey {
					t.Fatalf("count_tokens got %s with key %q", r.Body, r.Header.Get("X-Api-Key"))
				}
			}
			st, err := gw.pool.Status(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			used := 100_000 - st[0].Remaining["itpm"]
			if want := map[bool]int{true: 1, false: 0}[on]; calls != want {
				t.Fatalf("count_tokens called %d times, want %d", calls, want)
			}
			if on && used != 2*5000 {
				t.Fatalf("itpm used %d, want the upstream's count, 5000, twice", used)
			}
			if !on && used >= 2*5000 {
				t.Fatalf("itpm used %d without count_tokens", used)
			}
		})
	}
}
