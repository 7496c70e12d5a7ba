package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
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
// estimate: of two 5000-token prompts under an itpm of 8000, the second is
// refused here, not sent; the same prompt again asks nothing. Off, nothing
// is asked, and the second is sent on the estimate.
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
					Models: map[string]upstream.Limits{"claude-test-2025": {ITPM: 8000}}}},
				Routes: map[string][]upstream.Target{"claude-test": {{Upstream: "ant", Model: "claude-test-2025"}}},
			}
			margin := 0.0
			cfg.Routing.Margin = &margin
			cfg.Routing.CountTokens = on
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			_, srv := poolGateway(t, cfg, memStore(t), 0, nil)
			body := `{"model":"claude-test","max_tokens":50,"messages":[{"role":"user","content":"hello there"}]}`
			var statuses []int
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
				statuses = append(statuses, res.StatusCode)
			}
			calls, sent := 0, 0
			for _, r := range a.Requests() {
				if r.Path == "/v1/messages" {
					sent++
				}
				if r.Path != "/v1/messages/count_tokens" {
					continue
				}
				calls++
				var m map[string]json.RawMessage
				if err := json.Unmarshal(r.Body, &m); err != nil || string(m["model"]) != `"claude-test-2025"` || r.Header.Get("X-Api-Key") != upstreamKey {
					t.Fatalf("count_tokens got %s with key %q", r.Body, r.Header.Get("X-Api-Key"))
				}
			}
			if want := map[bool]int{true: 1, false: 0}[on]; calls != want {
				t.Fatalf("count_tokens called %d times, want %d", calls, want)
			}
			if want := map[bool][]int{true: {200, 429}, false: {200, 200}}[on]; !slices.Equal(statuses, want) {
				t.Fatalf("statuses %v, want %v", statuses, want)
			}
			if wantSent := map[bool]int{true: 1, false: 2}[on]; sent != wantSent {
				t.Fatalf("%d sent to the upstream, want %d (statuses %v)", sent, wantSent, statuses)
			}
		})
	}
}

// TestCountTokensBoundedPerClient: counts run before the client's limits
// are checked, so one client's burst of new prompts gets at most
// countPerClient count_tokens calls in flight; the rest reserve their
// estimate and go on, none of them refused for it.
func TestCountTokensBoundedPerClient(t *testing.T) {
	a := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey, OutputTokens: 6,
		Default: fakeanthropic.Fault{Delay: 900 * time.Millisecond}}) // each count in flight a while
	cfg := &Config{
		Models: []string{"claude-test"},
		Store:  StoreConfig{Timeout: 5 * time.Second},
		Tiers:  map[string]TierConfig{"t": Tier(Limits{RPM: 1000})},
		Keys:   []KeyConfig{{Name: "test", Hash: sluice.HashKey(clientKey), Tier: "t"}},
		Upstreams: []upstream.Def{{Name: "ant", Kind: upstream.Anthropic, BaseURL: a.URL() + "/v1", KeyEnv: "KEY_ANT",
			Models: map[string]upstream.Limits{"claude-test-2025": {ITPM: 1_000_000}}}},
		Routes: map[string][]upstream.Target{"claude-test": {{Upstream: "ant", Model: "claude-test-2025"}}},
	}
	cfg.Routing.CountTokens = true
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	_, srv := poolGateway(t, cfg, memStore(t), 0, nil)
	const burst = 12
	var wg sync.WaitGroup
	statuses := make([]int, burst)
	for i := range burst {
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":"claude-test","max_tokens":50,"messages":[{"role":"user","content":"prompt number %d"}]}`, i)
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages", strings.NewReader(body))
			req.Header.Set("x-api-key", clientKey)
			req.Header.Set("anthropic-version", "2023-06-01")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			statuses[i] = res.StatusCode
		})
	}
	wg.Wait()
	calls := 0
	for _, r := range a.Requests() {
		if r.Path == "/v1/messages/count_tokens" {
			calls++
		}
	}
	for i, s := range statuses {
		if s != 200 {
			t.Fatalf("request %d: %d", i, s)
		}
	}
	if calls > countPerClient {
		t.Fatalf("%d count_tokens calls for one client's burst of %d, bound %d", calls, burst, countPerClient)
	}
}

// TestCountTokensAfterOwnLimits: count_tokens runs only once the client's
// own limits admitted the request: a client of 1 request per minute
// sending 20 new prompts gets one through and 19 of its own 429s, and the
// upstream is asked to count once, for the single upstream and for a
// pool. (Before, every refused request was counted first: 388 calls in
// 10 s for a 1-rpm client.)
func TestCountTokensAfterOwnLimits(t *testing.T) {
	for _, pooled := range []bool{false, true} {
		t.Run(fmt.Sprint("pool=", pooled), func(t *testing.T) {
			a := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey, InputTokens: 50, OutputTokens: 6, StrictCount: true})
			var url string
			if pooled {
				cfg := &Config{
					Models: []string{"claude-test"},
					Store:  StoreConfig{Timeout: 5 * time.Second},
					Tiers:  map[string]TierConfig{"t": Tier(Limits{RPM: 1, TPM: 1_000_000})},
					Keys:   []KeyConfig{{Name: "test", Hash: sluice.HashKey(clientKey), Tier: "t"}},
					Upstreams: []upstream.Def{{Name: "ant", Kind: upstream.Anthropic, BaseURL: a.URL() + "/v1", KeyEnv: "KEY_ANT",
						Models: map[string]upstream.Limits{"claude-test-2025": {ITPM: 1_000_000}}}},
					Routes: map[string][]upstream.Target{"claude-test": {{Upstream: "ant", Model: "claude-test-2025"}}},
				}
				cfg.Routing.CountTokens = true
				if err := cfg.Validate(); err != nil {
					t.Fatal(err)
				}
				_, srv := poolGateway(t, cfg, memStore(t), 0, nil)
				url = srv.URL
			} else {
				e := newBudgetEnv(t, `
upstream: {base_url: %[1]s, api: anthropic, api_key_env: UP, count_tokens: true}
store: {timeout: 5s}
tiers: {t: {rpm: 1, tpm: 1000000}}
keys: [{name: one, hash: %[2]s, tier: t}]
`, a, fakeClockStore(t))
				url = e.urls[0]
			}
			statuses := map[int]int{}
			for i := range 20 {
				body := fmt.Sprintf(`{"model":"claude-test","max_tokens":50,"messages":[{"role":"user","content":"new prompt %d"}]}`, i)
				req, _ := http.NewRequest(http.MethodPost, url+"/v1/messages", strings.NewReader(body))
				req.Header.Set("x-api-key", clientKey)
				req.Header.Set("anthropic-version", "2023-06-01")
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				statuses[res.StatusCode]++
			}
			if statuses[200] != 1 || statuses[429] != 19 {
				t.Fatalf("statuses %v, want one 200 and 19 of the client's own 429s", statuses)
			}
			if n := countCalls(t, a); n != 1 {
				t.Fatalf("%d count_tokens calls upstream for one admitted request", n)
			}
		})
	}
}
