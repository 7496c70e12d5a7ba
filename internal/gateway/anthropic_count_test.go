package gateway

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/fakeanthropic"
)

// countCalls is the count_tokens calls the fake upstream received, and
// whether one carried a member count_tokens does not take.
func countCalls(t *testing.T, up *fakeanthropic.Server) int {
	t.Helper()
	n := 0
	for _, r := range up.Requests() {
		if r.Path != "/v1/messages/count_tokens" {
			continue
		}
		n++
		var m map[string]json.RawMessage
		if err := json.Unmarshal(r.Body, &m); err != nil || m["max_tokens"] != nil || m["stream"] != nil {
			t.Fatalf("count_tokens body %s", r.Body)
		}
	}
	return n
}

// TestAnthropicUpstreamCount: with upstream.count_tokens a Claude
// request under a token limit is counted by the upstream's count_tokens
// (only the members it counts; StrictCount refuses others), the larger of
// that count and the estimate is reserved, and the count is cached: the
// same prompt again asks nothing. A lower count leaves the estimate;
// without count_tokens the upstream is not asked.
func TestAnthropicUpstreamCount(t *testing.T) {
	const model = "claude-sonnet-4-5-20250929"
	body := `{"model":"` + model + `","max_tokens":50,"stream":false,"messages":[{"role":"user","content":"hello there"}]}`
	for _, tc := range []struct {
		name    string
		count   bool
		input   int
		reserve func(est int64) int64 // the input reserved, for the estimate est
		calls   int
	}{
		{"higher count", true, 5000, func(int64) int64 { return 5000 }, 1},
		{"lower count", true, 1, func(est int64) int64 { return est }, 1},
		{"off", false, 5000, func(est int64) int64 { return est }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey, InputTokens: tc.input, StrictCount: true})
			e := newBudgetEnv(t, fmt.Sprintf(`
upstream: {base_url: %%[1]s, api: anthropic, api_key_env: UP, count_tokens: %v}
store: {timeout: 5s}
tiers: {t: {tpm: 100000}}
keys: [{name: one, hash: %%[2]s, tier: t}]
`, tc.count), up, fakeClockStore(t))
			p, perr := parseAnthropicBody([]byte(body), epMessages)
			if perr != nil {
				t.Fatal(perr.msg)
			}
			for range 2 {
				res := e.anthropic(body)
				if res.StatusCode != 200 {
					t.Fatalf("status %d", res.StatusCode)
				}
				if s := e.settle(); s.Reserved != tc.reserve(p.promptEst)+p.maxTokens {
					t.Fatalf("reserved %d, estimate %d + max_tokens %d, upstream count %d", s.Reserved, p.promptEst, p.maxTokens, tc.input)
				}
			}
			if n := countCalls(t, up); n != tc.calls {
				t.Fatalf("count_tokens called %d times, want %d (cached after the first)", n, tc.calls)
			}
		})
	}
}

// anthropic posts a /v1/messages body to the first gateway.
func (e *budgetEnv) anthropic(body string) *http.Response {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.urls[0]+"/v1/messages", strings.NewReader(body))
	req.Header.Set("x-api-key", clientKey)
	req.Header.Set("anthropic-version", "2023-06-01")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res
}

// TestBudgetHardStopBase64: a dollar budget's hard stop holds for a
// base64-heavy Claude prompt, whose tokens the upstream counts at about
// 0.7 per character: requests are admitted until the budget's rest no
// longer covers a reservation, and the settled spend never passes the
// budget, with the heuristic alone (which counts base64 at 3/4 token per
// character, aitoken.Count) and with count_tokens.
func TestBudgetHardStopBase64(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 3))
	raw := make([]byte, 9000)
	for i := range raw {
		raw[i] = byte(rng.Uint32())
	}
	blob := base64.StdEncoding.EncodeToString(raw) // 12000 characters
	// o200k_base counts this blob at 0.69 token per character (aitoken's
	// golden corpus, kind base64); the fake upstream reports 0.72, the
	// higher of cl100k_base's and o200k_base's rates.
	input := len(blob) * 72 / 100
	body := `{"model":"claude-sonnet-4-5-20250929","max_tokens":20,"messages":[{"role":"user","content":"Describe this file: ` + blob + `"}]}`
	const budget = 150_000 // micro-dollars: $0.15, about six requests at $3 per million input tokens
	for _, count := range []bool{false, true} {
		t.Run(fmt.Sprintf("count_tokens=%v", count), func(t *testing.T) {
			up := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey, InputTokens: input, OutputTokens: 20})
			e := newBudgetEnv(t, fmt.Sprintf(`
upstream: {base_url: %%[1]s, api: anthropic, api_key_env: UP, count_tokens: %v}
store: {timeout: 5s}
tiers: {t: {budgets: [{usd: 0.15, per: day}]}}
keys: [{name: one, hash: %%[2]s, tier: t}]
`, count), up, fakeClockStore(t))
			var spent int64
			admitted := 0
			for range 20 {
				res := e.anthropic(body)
				if res.StatusCode == 429 {
					break
				}
				if res.StatusCode != 200 {
					t.Fatalf("status %d", res.StatusCode)
				}
				admitted++
				spent += int64(e.settle().Cost)
			}
			t.Logf("%d admitted, %d µ$ spent of %d", admitted, spent, budget)
			if admitted == 0 || spent > budget {
				t.Fatalf("%d admitted, spent %d µ$ of a %d µ$ budget", admitted, spent, budget)
			}
		})
	}
}

// TestAnthropicCountTokensHeaders: a count_tokens answer carries the
// anthropic-ratelimit-requests-* fields of the limits it takes (requests)
// and no tokens-* ones: it reserves no tokens, as docs/gateway.md says.
func TestAnthropicCountTokensHeaders(t *testing.T) {
	up := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey})
	e := newAnthEnv(t, Limits{RPM: 5, TPM: 1000}, up, nil, "")
	res := e.post(t.Context(), "/v1/messages/count_tokens", clientKey, `{"model":"claude-test","messages":[{"role":"user","content":"hello there"}]}`)
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	h := res.Header
	if h.Get("anthropic-ratelimit-requests-limit") != "5" || h.Get("anthropic-ratelimit-requests-remaining") != "4" || h.Get("anthropic-ratelimit-requests-reset") == "" {
		t.Fatalf("requests headers %v", h)
	}
	for k := range h {
		if strings.HasPrefix(strings.ToLower(k), "anthropic-ratelimit-tokens") || strings.HasPrefix(strings.ToLower(k), "anthropic-ratelimit-input-tokens") {
			t.Fatalf("count_tokens answer has %s: %v", k, h)
		}
	}
}

// TestCountCacheBounded: the count cache keeps at most its size, the
// newest, as docs/gateway.md says.
func TestCountCacheBounded(t *testing.T) {
	c := newCountCache(3)
	for i := range byte(10) {
		c.put([32]byte{i}, int64(i))
	}
	if c.len() != 3 {
		t.Fatalf("%d counts kept, want 3", c.len())
	}
	if _, ok := c.get([32]byte{6}); ok {
		t.Fatal("an old count kept")
	}
	if n, ok := c.get([32]byte{9}); !ok || n != 9 {
		t.Fatal("the newest count lost")
	}
	if countCacheSize != 10000 {
		t.Fatalf("countCacheSize %d, docs/gateway.md says 10,000", countCacheSize)
	}
}
