package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/guard"
	"github.com/sluice-io/sluice/internal/fakeanthropic"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/pricing"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/internal/yamlconf"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/redisstore"
)

const clientKey2 = "sk-client-test-0002"

// budgetEnv is one or more gateways, built from a YAML configuration,
// in front of one fake upstream.
type budgetEnv struct {
	t       *testing.T
	cfg     *Config
	up      interface{ URL() string }
	gws     []*Gateway
	urls    []string
	stores  []sluice.Store
	reg     *prometheus.Registry
	settled chan Settlement
	// outcomes are what the gateways reported to the console
	// (Options.OnOutcome), as "identity limited limit".
	outMu    sync.Mutex
	outcomes []string
}

// reported returns the outcomes reported so far.
func (e *budgetEnv) reported() []string {
	e.outMu.Lock()
	defer e.outMu.Unlock()
	return slices.Clone(e.outcomes)
}

// newBudgetEnv parses doc, whose %[1]s is the upstream's base URL, %[2]s
// the hash of clientKey and %[3]s that of clientKey2, and starts a gateway
// per store.
// fakeClockStore is a memory store on a fake clock that only its test
// moves, closed with the test.
func fakeClockStore(t *testing.T) *memstore.Store {
	t.Helper()
	st, err := memstore.New(memstore.Options{Clock: clock.NewFake(time.Unix(1_700_000_000, 0)), SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func newBudgetEnv(t *testing.T, doc string, up interface{ URL() string }, stores ...sluice.Store) *budgetEnv {
	t.Helper()
	cfg, err := Parse("test.yaml", []byte(fmt.Sprintf(doc, up.URL()+"/v1", sluice.HashKey(clientKey), sluice.HashKey(clientKey2))))
	if err != nil {
		t.Fatal(err)
	}
	e := &budgetEnv{t: t, cfg: cfg, up: up, stores: stores, settled: make(chan Settlement, 1000)}
	for i, st := range stores {
		reg := prometheus.NewRegistry()
		if i == 0 {
			e.reg = reg
		}
		gw, err := New(Options{Config: cfg, Store: st, Registerer: reg,
			Getenv:    func(string) string { return upstreamKey },
			OnSettled: func(s Settlement) { e.settled <- s },
			OnOutcome: func(o Outcome) {
				e.outMu.Lock()
				defer e.outMu.Unlock()
				e.outcomes = append(e.outcomes, fmt.Sprintf("%s %v %s", o.Identity, o.Limited, o.Limit))
			},
			Logger: slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(gw)
		t.Cleanup(srv.Close)
		e.gws = append(e.gws, gw)
		e.urls = append(e.urls, srv.URL)
	}
	return e
}

func (e *budgetEnv) do(i int, method, path, key, body string) *http.Response {
	e.t.Helper()
	req, err := http.NewRequest(method, e.urls[i]+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { res.Body.Close() })
	return res
}

func (e *budgetEnv) settle() Settlement {
	e.t.Helper()
	select {
	case s := <-e.settled:
		return s
	case <-time.After(10 * time.Second):
		e.t.Fatal("no settlement within 10s")
	}
	return Settlement{}
}

// budget peeks the budget spec of client key hash h's levels that matches
// scope and window, and returns what is spent of it.
func (e *budgetEnv) spent(key, scope, window string) pricing.Micros {
	e.t.Helper()
	cl := e.gws[0].keys[sluice.HashKey(key)]
	for i, s := range cl.levels.specs {
		if s.kind == kindBudget && s.scope() == scope && s.window == window {
			d, err := e.stores[0].Apply(context.Background(), sluice.OpPeek, sluice.Request{Key: cl.levels.keys[i], Algorithm: s.alg, Limit: s.limit})
			if err != nil {
				e.t.Fatal(err)
			}
			return pricing.Micros(s.limit.Rate - d.Remaining)
		}
	}
	e.t.Fatalf("no %s budget per %s", scope, window)
	return 0
}

func code(t *testing.T, res *http.Response) string {
	t.Helper()
	ae := decodeError(t, res)
	if ae.Error.Code == nil {
		return ""
	}
	return *ae.Error.Code
}

// hardStopDoc: two keys in two teams of one org whose budget is $1.00 a
// month; gpt-test costs $2.50/M input, $1.25/M cached input, $10/M output.
const hardStopDoc = `
upstream: {base_url: %[1]s, api_key_env: UP}
store: {timeout: 5s}
prices:
  gpt-test: {input: 2.50, cached_input: 1.25, output: 10}
tiers:
  t: {rpm: 100000, budgets: [{usd: 100, per: month}]}
orgs:
  %[4]s: {budgets: [{usd: 1.00, per: month, timezone: Europe/Berlin}]}
teams:
  a: {org: %[4]s, rpm: 100000}
  b: {org: %[4]s, tpm: 100000000}
keys:
  - {name: one, hash: %[2]s, tier: t, team: a, client: c1}
  - {name: two, hash: %[3]s, tier: t, team: b, client: c2}
`

// hardStop: 50 concurrent requests from two keys through every gateway
// against the org's $1.00 budget never spend more than the budget plus
// one request's maximum cost, and spend exactly the usage the upstream
// reported, priced, after settlement; every request refused is 429
// insufficient_quota with x-should-retry: false and a Retry-After.
func hardStop(t *testing.T, org string, stores ...sluice.Store) {
	// The upstream reports 5 prompt tokens (fewer than the gateway's
	// estimate), 2 of them cached, and the full 4000 completion tokens.
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, PromptTokens: 5, CachedTokens: 2, CompletionTokens: 4000})
	e := newBudgetEnv(t, strings.Replace(hardStopDoc, "%[4]s", org, -1), up, stores...)
	body := `{"model":"gpt-test","messages":[{"role":"user","content":"write a long essay about the history of rate limiting in distributed systems"}],"max_tokens":4000}`
	price, _ := e.gws[0].prices.Lookup("gpt-test")
	maxCost := price.Cost(pricing.Usage{pricing.Input: promptEstimate(t, body), pricing.Output: 4000})
	each := price.Cost(pricing.OpenAIUsage(5, 2, 4000, 0)) // 7.5 + 2.5 + 40000 → 40010
	if each != 40010 || maxCost <= each {
		t.Fatalf("cost %d, max %d", each, maxCost)
	}
	var wg sync.WaitGroup
	var ok, refused atomic.Int64
	for i := range 50 {
		key := []string{clientKey, clientKey2}[i%2]
		gw := i % len(e.urls)
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, e.urls[gw]+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+key)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			switch res.StatusCode {
			case 200:
				ok.Add(1)
			case 429:
				refused.Add(1)
				if !strings.Contains(string(b), `"code":"insufficient_quota"`) || res.Header.Get("x-should-retry") != "false" || res.Header.Get("Retry-After") == "" {
					t.Errorf("refusal %v: %s", res.Header, b)
				}
			default:
				t.Errorf("status %d: %s", res.StatusCode, b)
			}
		})
	}
	wg.Wait()
	var settledCost pricing.Micros
	for range ok.Load() {
		s := e.settle()
		if s.Cost != each || s.ReservedCost != maxCost || s.CachedTokens != 2 || s.Team == "" {
			t.Fatalf("settlement %+v", s)
		}
		settledCost += s.Cost
	}
	n := pricing.Micros(ok.Load())
	if n == 0 || refused.Load() == 0 || int64(up.Count()) != ok.Load() {
		t.Fatalf("admitted %d, refused %d, upstream %d", n, refused.Load(), up.Count())
	}
	spent := e.spent(clientKey, "org "+org, "month")
	if spent > pricing.Dollar+maxCost {
		t.Fatalf("spent %s of a $1 budget, more than one request's max cost %s over", spent, maxCost)
	}
	if spent != n*each || settledCost != spent {
		t.Fatalf("spent %s, settled %s, upstream usage priced %s (%d requests)", spent, settledCost, n*each, n)
	}
	// Both keys see the same org budget; their own (tier) budgets were
	// charged their share only.
	if got := e.spent(clientKey2, "org "+org, "month"); got != spent {
		t.Fatalf("key two sees %s spent", got)
	}
	if a, b := e.spent(clientKey, "key", "month"), e.spent(clientKey2, "key", "month"); a+b != spent {
		t.Fatalf("key budgets %s + %s, org %s", a, b, spent)
	}
}

func TestBudgetHardStopMemory(t *testing.T) {
	hardStop(t, "acme", fakeClockStore(t))
}

func redisStores(t *testing.T, url string) []sluice.Store {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	var out []sluice.Store
	for range 2 {
		// Each gateway has its own connections, as two processes would.
		st, err := redisstore.New(context.Background(), redisstore.Options{URL: url, Clock: clk, DisableDenyCache: true, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		out = append(out, st)
	}
	return out
}

func uniqueName(t *testing.T) string {
	n := strings.NewReplacer(":", "", "/", "", "{", "", "}", "").Replace(redistest.Prefix(t))
	return "o" + n[max(len(n)-12, 0):]
}

// TestBudgetHardStopRedisTwoGateways: the hard stop through two gateways
// sharing one real Redis.
func TestBudgetHardStopRedisTwoGateways(t *testing.T) {
	hardStop(t, uniqueName(t), redisStores(t, redistest.Standalone(t).URL())...)
}

// TestBudgetHardStopRedisCluster: the same on a 3-master Cluster, where a
// key's, its team's and its org's store keys share the org's hash tag.
func TestBudgetHardStopRedisCluster(t *testing.T) {
	hardStop(t, uniqueName(t), redisStores(t, redistest.SharedCluster(t).URL())...)
}

// TestLevelKeysShareSlot: every store key a request of a client in an org
// touches has the org's hash tag; a client without a team keeps its own.
func TestLevelKeysShareSlot(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey})
	st, _ := memstore.New(memstore.Options{})
	t.Cleanup(func() { _ = st.Close() })
	e := newBudgetEnv(t, strings.Replace(hardStopDoc, "%[4]s", "acme", -1), up, st)
	for _, key := range []string{clientKey, clientKey2} {
		cl := e.gws[0].keys[sluice.HashKey(key)]
		all := append(append([]string(nil), cl.specKeys...), cl.levels.keys...)
		seen := map[string]bool{}
		for _, k := range all {
			if !strings.HasPrefix(k, "{gw:o:acme}:") || seen[k] {
				t.Fatalf("key %q of %v", k, all)
			}
			seen[k] = true
		}
	}
}

// TestOfficialSDKInsufficientQuota: the official SDK, allowed two
// retries, sees 429 insufficient_quota and does not retry it.
func TestOfficialSDKInsufficientQuota(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, CompletionTokens: 6})
	st, _ := memstore.New(memstore.Options{Clock: clock.NewSystem()})
	t.Cleanup(func() { _ = st.Close() })
	e := newBudgetEnv(t, `
upstream: {base_url: %[1]s, api_key_env: UP}
prices: {gpt-test: {input: 1000, output: 1000}}
tiers: {t: {budgets: [{usd: 0.05, per: day}]}}
keys: [{name: one, hash: %[2]s, tier: t}, {name: two, hash: %[3]s, tier: t}]
`, up, st)
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		e.gws[0].ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	client := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey(clientKey), option.WithMaxRetries(2))
	ctx := context.Background()
	// $1000/M: 20 tokens reserved cost $0.02 and more; the first request
	// passes, then the budget is spent.
	if _, err := client.Chat.Completions.New(ctx, chatParams(20)); err != nil {
		t.Fatal(err)
	}
	if s := e.settle(); s.Cost <= 0 || s.Cost > 50_000 {
		t.Fatalf("settled %+v", s)
	}
	for {
		_, err := client.Chat.Completions.New(ctx, chatParams(20))
		if err == nil {
			e.settle()
			continue
		}
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || apiErr.Code != "insufficient_quota" || apiErr.Type != "insufficient_quota" {
			t.Fatalf("error %v", err)
		}
		break
	}
	before := hits.Load()
	_, err := client.Chat.Completions.New(ctx, chatParams(20))
	if err == nil || hits.Load() != before+1 {
		t.Fatalf("err %v, the SDK sent %d requests for one call", err, hits.Load()-before)
	}
}

// TestBudgetHostileInput: what a caller can send to get past a budget or
// break its accounting.
func TestBudgetHostileInput(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, CompletionTokens: 10})
	st := fakeClockStore(t)
	e := newBudgetEnv(t, `
upstream: {base_url: %[1]s, api_key_env: UP}
store: {timeout: 5s}
prices: {gpt-test: {input: 2.50, output: 10}}
tiers: {t: {budgets: [{usd: 5, per: day}]}}
keys: [{name: one, hash: %[2]s, tier: t}, {name: two, hash: %[3]s, tier: t, budgets: [{usd: 1, per: week}]}]
`, up, st)
	for _, c := range []struct {
		name, body string
		status     int
		code       string
	}{
		{"negative max_tokens", `{"model":"gpt-test","prompt":"x","max_tokens":-5}`, 400, "invalid_value"},
		{"zero max_tokens", `{"model":"gpt-test","prompt":"x","max_tokens":0}`, 400, "invalid_value"},
		// 10^18 output tokens: the cost saturates and can never fit.
		{"huge max_tokens", `{"model":"gpt-test","prompt":"x","max_tokens":1000000000000000000}`, 429, "insufficient_quota"},
		{"max_tokens beyond int64", `{"model":"gpt-test","prompt":"x","max_tokens":99999999999999999999}`, 400, "invalid_type"},
		{"overflow through n", `{"model":"gpt-test","prompt":"x","max_tokens":9223372036854775807,"n":128}`, 429, "insufficient_quota"},
		// Just above the whole $5 budget: never passes, not worth a retry.
		{"over the whole budget", `{"model":"gpt-test","prompt":"x","max_tokens":500001}`, 429, "insufficient_quota"},
		{"unknown model", `{"model":"gpt-unpriced","prompt":"x","max_tokens":5}`, 400, "model_not_priced"},
		{"unknown dated model", `{"model":"gpt-unpriced-2024-01-01","prompt":"x","max_tokens":5}`, 400, "model_not_priced"},
	} {
		res := e.do(0, "POST", "/v1/completions", clientKey, c.body)
		if res.StatusCode != c.status || code(t, res) != c.code {
			t.Errorf("%s: status %d, want %d %s", c.name, res.StatusCode, c.status, c.code)
		}
		if c.status == 429 && res.Header.Get("x-should-retry") != "false" {
			t.Errorf("%s: x-should-retry %q", c.name, res.Header.Get("x-should-retry"))
		}
	}
	if up.Count() != 0 {
		t.Fatalf("upstream saw %d requests", up.Count())
	}
	if got := e.spent(clientKey, "key", "day"); got != 0 {
		t.Fatalf("refused requests spent %s", got)
	}
	// A dated snapshot of a priced model is priced as the model.
	if res := e.do(0, "POST", "/v1/completions", clientKey, `{"model":"gpt-test-2025-01-01","prompt":"x","max_tokens":5}`); res.StatusCode != 200 {
		t.Fatalf("dated model: %d", res.StatusCode)
	}
	if s := e.settle(); s.Cost <= 0 {
		t.Fatalf("dated model settled %+v", s)
	}
	// The second key's own budget replaces its tier's: $1 a week.
	res := e.do(0, "POST", "/v1/completions", clientKey2, `{"model":"gpt-test","prompt":"x","max_tokens":100001}`)
	if res.StatusCode != 429 || !strings.Contains(decodeError(t, res).Error.Message, "$1.000000 per week") {
		t.Fatalf("key budget: %d", res.StatusCode)
	}
}

// TestBudgetUpstreamOverreports: an upstream reporting absurd usage
// charges the budget at most pricing.MaxMicros, which spends it without
// wrapping the window's count.
func TestBudgetUpstreamOverreports(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, PromptTokens: math.MaxInt64 / 4, CompletionTokens: 5})
	st := fakeClockStore(t)
	e := newBudgetEnv(t, `
upstream: {base_url: %[1]s, api_key_env: UP}
store: {timeout: 5s}
prices: {gpt-test: {input: 2.50, output: 10}}
tiers: {t: {budgets: [{usd: 5, per: day}]}}
keys: [{name: one, hash: %[2]s, tier: t}]
`, up, st)
	if res := e.do(0, "POST", "/v1/completions", clientKey, `{"model":"gpt-test","prompt":"x","max_tokens":5}`); res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	if s := e.settle(); s.Err != nil || s.Cost <= pricing.MaxMicros {
		t.Fatalf("settled %+v", s)
	}
	if got := e.spent(clientKey, "key", "day"); got != 5*pricing.Dollar {
		t.Fatalf("spent %s", got)
	}
	res := e.do(0, "POST", "/v1/completions", clientKey, `{"model":"gpt-test","prompt":"x","max_tokens":5}`)
	if res.StatusCode != 429 || code(t, res) != "insufficient_quota" {
		t.Fatalf("after the overreport: %d", res.StatusCode)
	}
}

// TestBudgetVisible: the x-sluice-budget-* headers, /v1/status and the
// spend metric by org, team and model.
func TestBudgetVisible(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, PromptTokens: 100, CompletionTokens: 10, CachedTokens: 40, ReasoningTokens: 4})
	st := fakeClockStore(t)
	e := newBudgetEnv(t, `
upstream: {base_url: %[1]s, api_key_env: UP}
store: {timeout: 5s}
models: [gpt-test]
prices: {gpt-test: {input: 2.50, cached_input: 1.25, output: 10, reasoning: 20}}
tiers: {t: {rpm: 100, budgets: [{usd: 3, per: day}]}}
orgs: {acme: {tpm: 100000, budgets: [{usd: 2, per: month}]}}
teams: {research: {org: acme, rpm: 50, budgets: [{usd: 1, per: week, model: gpt-test}]}}
keys: [{name: one, hash: %[2]s, tier: t, team: research}]
`, up, st)
	res := e.do(0, "POST", "/v1/chat/completions", clientKey, `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":1000}`)
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	s := e.settle()
	// 60 input × 2.5 + 40 cached × 1.25 + 6 output × 10 + 4 reasoning × 20 = 150+50+60+80.
	if s.Cost != 340 || s.CachedTokens != 40 || s.ReasoningTokens != 4 {
		t.Fatalf("settled %+v", s)
	}
	h := res.Header
	// The $1 team budget binds first: the least is left of it.
	if h.Get("x-sluice-budget-limit-usd") != "1.000000" || h.Get("x-sluice-budget-scope") != "team research" ||
		h.Get("x-sluice-budget-window") != "week" || h.Get("x-sluice-budget-reserved-usd") != pricing.Micros(s.ReservedCost).String() ||
		h.Get("x-sluice-budget-remaining-usd") != (pricing.Dollar-s.ReservedCost).String() || h.Get("x-sluice-budget-reset") == "" {
		t.Fatalf("headers %v", h)
	}
	// Team and org limits are in the rate-limit headers too.
	if !strings.Contains(h.Get("Ratelimit-Policy"), `"team.rpm"`) || !strings.Contains(h.Get("Ratelimit-Policy"), `"org.tpm"`) {
		t.Fatalf("policy %q", h.Get("Ratelimit-Policy"))
	}
	sres := e.do(0, "GET", "/v1/status", clientKey, "")
	raw, _ := io.ReadAll(sres.Body)
	var st1 Status
	if err := json.Unmarshal(raw, &st1); err != nil || sres.StatusCode != 200 {
		t.Fatal(sres.StatusCode, err)
	}
	// Never the key, its hash, its client id or its name.
	cl := e.gws[0].keys[sluice.HashKey(clientKey)]
	for _, secret := range []string{clientKey, sluice.HashKey(clientKey)[:16], cl.id, `"` + cl.name + `"`} {
		if strings.Contains(string(raw), secret) {
			t.Fatalf("/v1/status names %q: %s", secret, raw)
		}
	}
	if st1.Team != "research" || st1.Org != "acme" || len(st1.Budgets) != 3 || len(st1.Limits) != 3 {
		t.Fatalf("status %+v", st1)
	}
	for _, b := range st1.Budgets {
		if b.SpentUSD != "0.000340" {
			t.Fatalf("budget %+v", b)
		}
	}
	if up.Count() != 1 {
		t.Fatalf("/v1/status went upstream")
	}
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.Contains(l.GetValue(), clientKey) || strings.Contains(l.GetValue(), sluice.HashKey(clientKey)[:16]) {
					t.Fatalf("metric %s labelled with the key: %v", mf.GetName(), m)
				}
			}
		}
		if mf.GetName() == "sluice_gateway_spend_microdollars_total" {
			m := mf.GetMetric()[0]
			found = m.GetCounter().GetValue() == 340 && len(m.GetLabel()) == 3
		}
	}
	if !found {
		t.Fatal("no spend metric of 340 by org, team and model")
	}
}

// TestNestedAllOrNothing: a request a team's limit refuses charges
// nothing at the key's or the org's levels, and two keys of one team
// share its limit.
func TestNestedAllOrNothing(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, CompletionTokens: 5})
	st := fakeClockStore(t)
	e := newBudgetEnv(t, `
upstream: {base_url: %[1]s, api_key_env: UP}
store: {timeout: 5s}
prices: {gpt-test: {input: 1, output: 1}}
tiers: {t: {rpm: 100}}
orgs: {acme: {rpm: 100, budgets: [{usd: 10, per: month}]}}
teams: {research: {org: acme, rpm: 3}}
keys: [{name: one, hash: %[2]s, tier: t, team: research}, {name: two, hash: %[3]s, tier: t, team: research}]
`, up, st)
	body := `{"model":"gpt-test","prompt":"x","max_tokens":5}`
	for i, key := range []string{clientKey, clientKey2, clientKey, clientKey2} {
		res := e.do(0, "POST", "/v1/completions", key, body)
		want := 200
		if i == 3 {
			want = 429
		}
		if res.StatusCode != want {
			t.Fatalf("request %d: %d", i, res.StatusCode)
		}
		if want == 200 {
			e.settle()
		} else if ae := decodeError(t, res); !strings.Contains(ae.Error.Message, "of team research") || *ae.Error.Code != "rate_limit_exceeded" {
			t.Fatalf("refusal %+v", ae)
		}
	}
	// The refused request charged neither the org's rpm nor its budget,
	// nor the key's own rpm.
	sres := e.do(0, "GET", "/v1/status", clientKey2, "")
	var body2 Status
	if err := json.NewDecoder(sres.Body).Decode(&body2); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"key/rpm": 99, "team research/rpm": 0, "org acme/rpm": 97}
	for _, l := range body2.Limits {
		if w, ok := want[l.Scope+"/"+l.Name]; !ok || l.Remaining != w {
			t.Fatalf("limit %+v", l)
		}
	}
	if spent := e.spent(clientKey, "org acme", "month"); spent != 3*e.settledCostEach(body) {
		t.Fatalf("org spent %s", spent)
	}
}

func (e *budgetEnv) settledCostEach(body string) pricing.Micros {
	price, _ := e.gws[0].prices.Lookup("gpt-test")
	return price.Cost(pricing.Usage{pricing.Input: int64(fakeopenai.CountPromptTokens([]byte(body))), pricing.Output: 5})
}

// TestBudgetConfigErrors: each mistake in budgets, levels and prices is
// located and explained.
func TestBudgetConfigErrors(t *testing.T) {
	doc := `
upstream: {base_url: http://127.0.0.1:1/v1}
prices:
  bad: {input: -1, output: 1e3}
  fine: {input: 0.000001, output: 100000.5}
default_price: {input: 2.1234567}
tiers:
  t: {budgets: [{usd: 0, per: fortnight}, {usd: 5, per: day, timezone: Mars/Olympus}, {usd: 5, per: day}]}
orgs:
  acme: {org: other}
teams:
  research: {org: nope}
keys:
  - {name: a, hash: ` + sluice.HashKey("a") + `, tier: t, team: nobody, client: c}
  - {name: b, hash: ` + sluice.HashKey("b") + `, tier: t, client: c, budgets: [{usd: 2, per: year}]}
`
	_, err := Parse("g.yaml", []byte(doc))
	var ye *yamlconf.Error
	if !errors.As(err, &ye) || !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("%v", err)
	}
	msg := err.Error()
	for _, want := range []string{
		"prices.bad.input", "prices.fine.output", "default_price",
		"tiers.t.budgets[0].usd", "tiers.t.budgets[0].per", "tiers.t.budgets[1].timezone", "tiers.t.budgets[2]: same window",
		"orgs.acme.org", "teams.research.org: unknown org", "keys[0].team: unknown team", "keys[1].team", "keys[1].budgets",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("no %q in:\n%s", want, msg)
		}
	}
	// Amounts are read exactly, never through a float.
	cfg, err := Parse("g.yaml", []byte(`
upstream: {base_url: http://127.0.0.1:1/v1}
prices: {m: {input: 0.075, cached_input: "0.0375", output: 0.3}}
tiers: {t: {budgets: [{usd: 1234567.89, per: day}]}}
`))
	if err == nil {
		t.Fatalf("a budget above the maximum was accepted: %+v", cfg.Tiers)
	}
	cfg, err = Parse("g.yaml", []byte(`
upstream: {base_url: http://127.0.0.1:1/v1}
prices: {m: {input: 0.075, cached_input: "0.0375", output: 0.3}}
tiers: {t: {budgets: [{usd: 0.29, per: day}]}}
`))
	if err != nil {
		t.Fatal(err)
	}
	usd, _ := cfg.Tiers["t"].Budgets[0].USD.Micros()
	if p, err := cfg.Prices["m"].Price(); err != nil || p != (pricing.Price{75_000, 37_500, 300_000, 300_000}) || usd != 290_000 {
		t.Fatalf("price %v %v, budget %d", p, err, usd)
	}
}

// calendarReset: a monthly budget in America/New_York resets at local
// midnight on the first of the month, to the millisecond, and not at
// midnight UTC five hours earlier; while spent, Retry-After is the time to
// the local reset.
func calendarReset(t *testing.T, st sluice.Store, clk *clock.Fake) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, CompletionTokens: 20})
	e := newBudgetEnv(t, `
upstream: {base_url: %[1]s, api_key_env: UP}
store: {timeout: 5s}
prices: {gpt-test: {input: 1000, output: 1000}}
tiers: {t: {budgets: [{usd: 0.05, per: month, timezone: America/New_York}]}}
keys: [{name: one, hash: %[2]s, tier: t, client: `+uniqueName(t)+`}]
`, up, st)
	ny, _ := time.LoadLocation("America/New_York")
	clk.Set(time.Date(2027, 1, 31, 18, 59, 0, 0, ny)) // 23:59 UTC
	body := `{"model":"gpt-test","prompt":"x","max_tokens":20}`
	spend := func() *http.Response {
		for range 10 {
			res := e.do(0, "POST", "/v1/completions", clientKey, body)
			if res.StatusCode != 200 {
				return res
			}
			e.settle()
		}
		t.Fatal("a $0.05 budget was never spent")
		return nil
	}
	localMidnight := time.Date(2027, 2, 1, 0, 0, 0, 0, ny)
	res := spend()
	if res.StatusCode != 429 || code(t, res) != "insufficient_quota" {
		t.Fatalf("status %d", res.StatusCode)
	}
	if ra := res.Header.Get("Retry-After"); ra != strconv.FormatInt(int64(localMidnight.Sub(clk.Time())/time.Second), 10) {
		t.Fatalf("Retry-After %s, want the time to local midnight %s", ra, localMidnight.Sub(clk.Time()))
	}
	// Past midnight UTC: still spent.
	clk.Set(time.Date(2027, 2, 1, 0, 1, 0, 0, time.UTC))
	if res := e.do(0, "POST", "/v1/completions", clientKey, body); res.StatusCode != 429 {
		t.Fatalf("reset at the UTC boundary: %d", res.StatusCode)
	}
	clk.Set(localMidnight.Add(-time.Millisecond))
	if res := e.do(0, "POST", "/v1/completions", clientKey, body); res.StatusCode != 429 || res.Header.Get("Retry-After") != "1" {
		t.Fatalf("1ms before the local reset: %d %s", res.StatusCode, res.Header.Get("Retry-After"))
	}
	clk.Set(localMidnight)
	if res := e.do(0, "POST", "/v1/completions", clientKey, body); res.StatusCode != 200 {
		t.Fatalf("at the local reset: %d", res.StatusCode)
	}
	e.settle()
}

func TestBudgetCalendarResetMemory(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	st, _ := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	t.Cleanup(func() { _ = st.Close() })
	calendarReset(t, st, clk)
}

func TestBudgetCalendarResetRedis(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	st, err := redisstore.New(context.Background(), redisstore.Options{URL: redistest.Standalone(t).URL(), Clock: clk, DisableDenyCache: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	calendarReset(t, st, clk)
}

// TestBudgetAnthropicMessages: a budget on /v1/messages is charged what
// Anthropic bills, cache writes at 1.25 and reads at 0.1 times the input
// price, and refuses in Anthropic's error shape with x-should-retry: false.
func TestBudgetAnthropicMessages(t *testing.T) {
	up := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey, InputTokens: 100, CacheCreationInputTokens: 8, CacheReadInputTokens: 40, OutputTokens: 6})
	st := fakeClockStore(t)
	e := newBudgetEnv(t, `
upstream: {base_url: %[1]s, api: anthropic, api_key_env: UP}
store: {timeout: 5s}
tiers: {t: {budgets: [{usd: 0.001, per: day}]}}
keys: [{name: one, hash: %[2]s, tier: t}]
`, up, st)
	body := `{"model":"claude-sonnet-4-5-20250929","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`
	post := func() *http.Response {
		req, _ := http.NewRequest(http.MethodPost, e.urls[0]+"/v1/messages", strings.NewReader(body))
		req.Header.Set("x-api-key", clientKey)
		req.Header.Set("anthropic-version", "2023-06-01")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { res.Body.Close() })
		return res
	}
	if res := post(); res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	// Sonnet 4.5: 100 input × $3 + 8 cache writes × $3.75 + 40 cache reads
	// × $0.30 + 6 output × $15 per million = 432 micro-dollars.
	if s := e.settle(); s.Cost != 432 {
		t.Fatalf("settled %+v", s)
	}
	res := post()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != 429 || res.Header.Get("x-should-retry") != "false" || res.Header.Get("Retry-After") == "" ||
		!strings.Contains(string(b), `"type":"error"`) || !strings.Contains(string(b), "exceeded your current quota") {
		t.Fatalf("refusal %d %v %s", res.StatusCode, res.Header, b)
	}
}

// TestBudgetDefaultCapForwarded: a request without max_tokens that a
// budget applies to reserves default_max_tokens per choice and the gateway
// forwards that cap, so an upstream that would otherwise generate 4000
// tokens stops at the reservation and the settled cost never exceeds the
// reserved one; a null or escape-spelt cap cannot shadow it. Without a
// budget the body goes upstream unchanged.
func TestBudgetDefaultCapForwarded(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, CompletionTokens: 4000})
	st := fakeClockStore(t)
	e := newBudgetEnv(t, `
upstream: {base_url: %[1]s, api_key_env: UP}
store: {timeout: 5s}
default_max_tokens: 100
prices: {gpt-test: {input: 2.50, output: 10}}
tiers:
  t: {budgets: [{usd: 5, per: day}]}
  free: {rpm: 1000}
keys: [{name: one, hash: %[2]s, tier: t}, {name: two, hash: %[3]s, tier: free}]
`, up, st)
	for _, c := range []struct {
		path, body, field string
		cap               int64
	}{
		{"/v1/chat/completions", `{"model":"gpt-test","messages":[{"role":"user","content":"<essay>"}]}`, "max_completion_tokens", 100},
		{"/v1/chat/completions", `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":null,"max_completion_tokens":null}`, "max_completion_tokens", 100},
		{"/v1/chat/completions", `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max\u005fcompletion_tokens":null}`, "max_completion_tokens", 100},
		{"/v1/completions", `{"model":"gpt-test","prompt":"hi","n":3}`, "max_tokens", 100},
		{"/v1/completions", `{"model":"gpt-test","prompt":"hi","stream":true}`, "max_tokens", 100},
		{"/v1/responses", `{"model":"gpt-test","input":"hi"}`, "max_output_tokens", 100},
	} {
		before := len(up.Requests())
		res := e.do(0, "POST", c.path, clientKey, c.body)
		_, _ = io.Copy(io.Discard, res.Body)
		if res.StatusCode != 200 {
			t.Fatalf("%s %s: status %d", c.path, c.body, res.StatusCode)
		}
		s := e.settle()
		if !s.UsageReported || s.CompletionTokens != c.cap || s.Cost > s.ReservedCost || s.Cost <= 0 {
			t.Errorf("%s %s: settled %+v", c.path, c.body, s)
		}
		reqs := up.Requests()
		var sent map[string]any
		if len(reqs) != before+1 || json.Unmarshal(reqs[before].Body, &sent) != nil {
			t.Fatalf("%s: upstream saw %d requests", c.path, len(reqs)-before)
		}
		if got, _ := sent[c.field].(float64); int64(got) != c.cap {
			t.Errorf("%s %s: forwarded %s", c.path, c.body, reqs[before].Body)
		}
		if strings.Contains(c.body, "<essay>") && !strings.Contains(string(reqs[before].Body), "<essay>") {
			t.Errorf("body re-encoded with HTML escapes: %s", reqs[before].Body)
		}
	}
	// No budget applies: the body is forwarded as sent.
	body := `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}`
	res := e.do(0, "POST", "/v1/chat/completions", clientKey2, body)
	_, _ = io.Copy(io.Discard, res.Body)
	if s := e.settle(); res.StatusCode != 200 || s.CompletionTokens != 4000 {
		t.Fatalf("status %d, settled %+v", res.StatusCode, s)
	}
	if reqs := up.Requests(); string(reqs[len(reqs)-1].Body) != body {
		t.Fatalf("forwarded %s", reqs[len(reqs)-1].Body)
	}
}

// TestDefaultCapFitsLevelTokens: default_max_tokens shrinks to fit a
// team's or org's token burst as it does a tier's, instead of making a
// request that sets no max_tokens too large for a limit it fits.
func TestDefaultCapFitsLevelTokens(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, CompletionTokens: 4000})
	st := fakeClockStore(t)
	e := newBudgetEnv(t, `
upstream: {base_url: %[1]s, api_key_env: UP}
store: {timeout: 5s}
default_max_tokens: 1024
prices: {gpt-test: {input: 2.50, output: 10}}
tiers: {t: {tpm: 100000}}
orgs: {acme: {tpm: 300}}
teams: {research: {org: acme, tpm: 500, budgets: [{usd: 1, per: day}]}}
keys: [{name: one, hash: %[2]s, tier: t, team: research}]
`, up, st)
	res := e.do(0, "POST", "/v1/chat/completions", clientKey, `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}`)
	_, _ = io.Copy(io.Discard, res.Body)
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	s := e.settle()
	if s.Reserved > 300 || s.Reserved < 290 || s.CompletionTokens != s.Reserved-promptEstimate(t, `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}`) {
		t.Fatalf("settled %+v", s)
	}
}

// TestBudgetRedisPausedAtSettlement: Redis stalls (SIGSTOP) for 2 s while
// a request is upstream, so its settlement's first attempts time out. The
// settlement is retried and applies once Redis resumes: the budget is
// charged the request's cost, exactly, and its concurrency slot (the tier
// allows 1) is free again rather than held for lease_ttl. Requests after
// it spend the rest, and the window never exceeds the budget.
func TestBudgetRedisPausedAtSettlement(t *testing.T) {
	srv := redistest.NewStandalone(t)
	fake := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, PromptTokens: 5, CompletionTokens: 4000})
	var freezeNext atomic.Bool
	thawed := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if freezeNext.CompareAndSwap(true, false) {
			if err := srv.Freeze(); err != nil {
				t.Error(err)
			}
			// The stall is the fault under test: 2 s, then the server resumes.
			time.AfterFunc(2*time.Second, func() {
				if err := srv.Thaw(); err != nil {
					t.Error(err)
				}
				close(thawed)
			})
		}
		req, _ := http.NewRequest(r.Method, fake.URL()+r.URL.Path, r.Body)
		req.Header = r.Header.Clone()
		res, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Error(err)
			return
		}
		defer res.Body.Close()
		w.WriteHeader(res.StatusCode)
		_, _ = io.Copy(w, res.Body)
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() { _ = srv.Thaw() })
	// A store timeout well under the 2 s stall, so that the settlement's
	// first attempts time out; not so short that a call on a loaded host
	// after the thaw does (300 ms gave a 503 at load 14 under -race).
	st, err := redisstore.New(context.Background(), redisstore.Options{URL: srv.URL(), DisableDenyCache: true, Timeout: 700 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	e := newBudgetEnv(t, `
upstream: {base_url: %[1]s, api_key_env: UP}
store: {timeout: 700ms}
prices: {gpt-test: {input: 2.50, output: 10}}
tiers: {t: {concurrency: 1, budgets: [{usd: 1, per: month}]}}
keys: [{name: one, hash: %[2]s, tier: t}]
`, urlOf(up.URL), st)
	body := `{"model":"gpt-test","messages":[{"role":"user","content":"write a long essay about the history of rate limiting"}],"max_tokens":4000}`
	price, _ := e.gws[0].prices.Lookup("gpt-test")
	maxCost := price.Cost(pricing.Usage{pricing.Input: promptEstimate(t, body), pricing.Output: 4000})
	each := price.Cost(pricing.Usage{pricing.Input: 5, pricing.Output: 4000})
	if each >= maxCost {
		t.Fatalf("cost %s, max %s", each, maxCost)
	}

	freezeNext.Store(true)
	res := e.do(0, "POST", "/v1/chat/completions", clientKey, body)
	_, _ = io.Copy(io.Discard, res.Body)
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	// The settlement is retried while Redis is stalled and applies once it
	// resumes: the request is charged its cost, and its concurrency slot is
	// free again (not held for lease_ttl).
	if s := e.settle(); s.Err != nil || s.Cost != each {
		t.Fatalf("settlement through the stall %+v", s)
	}
	<-thawed
	if spent := e.spent(clientKey, "key", "month"); spent != each {
		t.Fatalf("after the stalled settlement spent %s: want the cost %s", spent, each)
	}
	admitted := 1
	for range 40 {
		res := e.do(0, "POST", "/v1/chat/completions", clientKey, body)
		_, _ = io.Copy(io.Discard, res.Body)
		if res.StatusCode == 429 {
			break
		}
		if res.StatusCode != 200 {
			t.Fatalf("status %d", res.StatusCode)
		}
		if s := e.settle(); s.Err != nil || s.Cost != each {
			t.Fatalf("settlement %+v", s)
		}
		admitted++
	}
	final := e.spent(clientKey, "key", "month")
	if final != pricing.Micros(admitted)*each || final > pricing.Dollar || final+maxCost <= pricing.Dollar {
		t.Fatalf("spent %s after %d requests of %s (max %s) on a $1 budget", final, admitted, each, maxCost)
	}
}

// urlOf is a base URL as newBudgetEnv's upstream.
type urlOf string

func (u urlOf) URL() string { return string(u) }

// TestExcessChargedAfterCircuitCloses: a request whose usage exceeds its
// reservation settles; its refund (the reservation's lease) applies, and
// then Redis stalls (SIGSTOP) and the guard's circuit opens before the
// excess charge is sent. The charge was never sent, so settlement retries
// it, and it lands once Redis is back. Before, the excess was dropped: the
// key used it for free.
func TestExcessChargedAfterCircuitCloses(t *testing.T) {
	srv := redistest.NewStandalone(t)
	fake := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, PromptTokens: 100_000, CompletionTokens: 5})
	rs, err := redisstore.New(context.Background(), redisstore.Options{URL: srv.URL(), DisableDenyCache: true, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rs.Close() })
	g, err := guard.New(rs, guard.Options{Policy: guard.FailClosed, Timeout: 300 * time.Millisecond, ProbeInterval: 20 * time.Millisecond, MaxProbeFailures: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	t.Cleanup(func() { _ = srv.Thaw() })
	st := &stallBeforeCharge{Store: g, stall: func() {
		if err := srv.Freeze(); err != nil {
			t.Error(err)
		}
		if !redistest.PollUntil(time.Now().Add(10*time.Second), func() bool { return g.Stats().Open != 0 }) {
			t.Error("the circuit did not open within 10s of stalling Redis")
			return
		}
	}}
	e := newBudgetEnv(t, `
upstream: {base_url: %[1]s, api_key_env: UP}
store: {timeout: 300ms}
prices: {gpt-test: {input: 2.50, output: 10}}
tiers: {t: {budgets: [{usd: 5, per: day}]}}
keys: [{name: one, hash: %[2]s, tier: t}]
`, fake, st)
	body := `{"model":"gpt-test","prompt":"x","max_tokens":5}`
	price, _ := e.gws[0].prices.Lookup("gpt-test")
	reserved := price.Cost(pricing.Usage{pricing.Input: promptEstimate(t, body), pricing.Output: 5})
	cost := price.Cost(pricing.Usage{pricing.Input: 100_000, pricing.Output: 5})

	res := e.do(0, "POST", "/v1/completions", clientKey, body)
	_, _ = io.Copy(io.Discard, res.Body)
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	// The first charge met the open circuit when a retry is counted.
	if !redistest.PollUntil(time.Now().Add(10*time.Second), func() bool { return testutil.ToFloat64(e.gws[0].metrics.settleRetries) != 0 }) {
		t.Fatal("no charge retried within 10s")
	}
	if err := srv.Thaw(); err != nil {
		t.Fatal(err)
	}
	if s := e.settle(); s.Err != nil || s.Cost != cost {
		t.Fatalf("settlement %+v, want cost %s and no error", s, cost)
	}
	if got := e.spent(clientKey, "key", "day"); got != cost {
		t.Fatalf("spent %s after the stall: want the cost %s (reserved %s, then the excess)", got, cost, reserved)
	}
}

// stallBeforeCharge runs stall once, before the first OpCharge batch
// reaches Store: the fault lands between a settlement's refund and its
// charge.
type stallBeforeCharge struct {
	sluice.Store
	once  sync.Once
	stall func()
}

func (s *stallBeforeCharge) ApplyAll(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	if op == sluice.OpCharge {
		s.once.Do(s.stall)
	}
	return s.Store.ApplyAll(ctx, op, reqs)
}
