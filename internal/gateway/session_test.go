package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/pricing"
	"github.com/sluice-io/sluice/internal/redistest"
)

// sessionDoc: a $1.00 budget per session, a $100 monthly budget per key,
// and an MCP server whose every tool call costs $0.02.
const sessionDoc = `
upstream: {base_url: %[1]s, api_key_env: UP}
store: {timeout: 5s}
prices:
  gpt-test: {input: 2.50, output: 10}
tiers:
  t: {rpm: 100000, budgets: [{usd: 100, per: month}], session: {usd: 1.00, ttl: 1h}}
keys:
  - {name: one, hash: %[2]s, tier: t, client: CLIENT1}
  - {name: two, hash: %[3]s, tier: t, client: CLIENT2}
mcp_servers:
  - {name: tools, url: "MCPURL", tools: {"*": {cost_usd: "0.02"}}}
`

// countingMCP is an MCP server of the 2025-03-26 protocol at its
// simplest: every POST answered with one JSON result.
func countingMCP(t *testing.T) (string, *atomic.Int64) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"ok"}]}}`))
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &n
}

// sessionSpent is what session sid of key has spent of its dollar budget.
func (e *budgetEnv) sessionSpent(key, sid string) pricing.Micros {
	e.t.Helper()
	cl := e.gws[0].keys[sluice.HashKey(key)]
	s := cl.tier.session[0]
	d, err := e.stores[0].Apply(context.Background(), sluice.OpPeek, sluice.Request{Key: sessionPrefix(cl, sid) + s.suffix, Algorithm: s.alg, Limit: s.limit})
	if err != nil {
		e.t.Fatal(err)
	}
	return pricing.Micros(s.limit.Rate - d.Remaining)
}

// sessionHardStop: 200 requests at once on one $1.00 session, LLM calls
// and MCP tool calls mixed, through every gateway: the session spends at
// most $1.00 (the upstream reports no more than each reservation, so no
// settlement charges past it), exactly what was served, and the key's own
// budget is charged that and nothing beyond.
func sessionHardStop(t *testing.T, stores ...sluice.Store) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, PromptTokens: 5, CompletionTokens: 1000})
	mcpURL, toolCalls := countingMCP(t)
	e := newBudgetEnv(t, uniqueClients(t, strings.Replace(sessionDoc, "MCPURL", mcpURL, 1)), up, stores...)
	body := `{"model":"gpt-test","messages":[{"role":"user","content":"plan the next step"}],"max_tokens":1000}`
	price, _ := e.gws[0].prices.Lookup("gpt-test")
	each := price.Cost(pricing.OpenAIUsage(5, 0, 1000, 0))
	var wg sync.WaitGroup
	var llmOK, toolOK, refused atomic.Int64
	for i := range 200 {
		gw := e.urls[i%len(e.urls)]
		wg.Go(func() {
			var req *http.Request
			if i%2 == 0 {
				req, _ = http.NewRequest(http.MethodPost, gw+"/v1/chat/completions", strings.NewReader(body))
			} else {
				req, _ = http.NewRequest(http.MethodPost, gw+"/mcp/tools", strings.NewReader(
					fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"search"}}`, i)))
				req.Header.Set("Accept", "application/json, text/event-stream")
			}
			req.Header.Set("Authorization", "Bearer "+clientKey)
			req.Header.Set(SessionHeader, "run-42")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			switch {
			case i%2 == 0 && res.StatusCode == 200:
				llmOK.Add(1)
			case i%2 == 0 && res.StatusCode == 429 && strings.Contains(string(b), "insufficient_quota"):
				refused.Add(1)
			case i%2 == 1 && res.StatusCode == 200 && strings.Contains(string(b), `"result"`):
				toolOK.Add(1)
			case i%2 == 1 && res.StatusCode == 200 && strings.Contains(string(b), `-32029`):
				refused.Add(1)
			default:
				t.Errorf("request %d: status %d: %s", i, res.StatusCode, b)
			}
		})
	}
	wg.Wait()
	var settled pricing.Micros
	for range llmOK.Load() {
		settled += e.settle().Cost
	}
	tools := pricing.Micros(toolOK.Load()) * 20000
	spent := e.sessionSpent(clientKey, "run-42")
	if spent > pricing.Dollar {
		t.Fatalf("the $1.00 session spent %s", spent)
	}
	if spent != settled+tools || toolCalls.Load() != toolOK.Load() || int64(up.Count()) != llmOK.Load() {
		t.Fatalf("session spent %s; served %d LLM calls (%s settled, each %s) and %d tool calls (%s); upstream saw %d, MCP server %d",
			spent, llmOK.Load(), settled, each, toolOK.Load(), tools, up.Count(), toolCalls.Load())
	}
	if refused.Load() == 0 || spent < pricing.Dollar-2*each {
		t.Fatalf("refused %d, spent %s: the session should be used up", refused.Load(), spent)
	}
	if key := e.spent(clientKey, "key", "month"); key != spent {
		t.Fatalf("the key's monthly budget was charged %s, the session %s", key, spent)
	}
	// GET /v1/status with the session names it and shows what it spent.
	req, _ := http.NewRequest(http.MethodGet, e.urls[0]+"/v1/status", nil)
	req.Header.Set("Authorization", "Bearer "+clientKey)
	req.Header.Set(SessionHeader, "run-42")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var st Status
	if err := json.NewDecoder(res.Body).Decode(&st); err != nil || st.Session != "run-42" {
		t.Fatalf("status: %v %+v", err, st)
	}
	res.Body.Close()
	found := false
	for _, b := range st.Budgets {
		if b.Scope == "session" {
			found = b.SpentUSD == spent.String() && b.LimitUSD == "1.000000"
		}
	}
	if !found {
		t.Fatalf("status budgets %+v: no session row spent %s", st.Budgets, spent)
	}
	// The console's look-up of the key with its session shows the same.
	cs, err := e.gws[1].LookUp(context.Background(), "gw_key:one session:run-42")
	if err != nil || cs.Session != "run-42" {
		t.Fatalf("console look-up: %v %+v", err, cs)
	}
	found = false
	for _, b := range cs.Budgets {
		found = found || (b.Scope == "session" && b.SpentUSD == spent.String())
	}
	if !found {
		t.Fatalf("console look-up budgets %+v: no session row spent %s", cs.Budgets, spent)
	}
	if _, err := e.gws[1].LookUp(context.Background(), "gw_key:one session:a b"); !errors.Is(err, ErrNoKey) {
		t.Fatalf("a bad session id: %v", err)
	}
	// Another session of the same key starts fresh.
	if res := e.doSession(0, clientKey, "run-43", body); res.StatusCode != 200 {
		t.Fatalf("a new session: %d", res.StatusCode)
	}
}

func (e *budgetEnv) doSession(i int, key, sid, body string) *http.Response {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.urls[i]+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set(SessionHeader, sid)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { res.Body.Close() })
	return res
}

func TestSessionBudgetRedisTwoGateways(t *testing.T) {
	sessionHardStop(t, redisStores(t, redistest.Standalone(t).URL())...)
}

func TestSessionBudgetRedisCluster(t *testing.T) {
	sessionHardStop(t, redisStores(t, redistest.SharedCluster(t).URL())...)
}

// TestSessionHeaderChecked: a session id that is not one (too long, odd
// characters, two of them) is refused, and a tier with required sessions
// refuses a request that names none.
func TestSessionHeaderChecked(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey})
	doc := strings.Replace(sessionDoc, "ttl: 1h}", "ttl: 1h, required: true}", 1)
	e := newBudgetEnv(t, uniqueClients(t, strings.Replace(doc, "MCPURL", "http://127.0.0.1:9", 1)), up, fakeClockStore(t))
	body := `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":10}`
	for _, tc := range []struct {
		sid  []string
		code string
	}{
		{nil, "session_required"},
		{[]string{strings.Repeat("a", 129)}, "invalid_session"},
		{[]string{"a b"}, "invalid_session"},
		{[]string{"a", "b"}, "invalid_session"},
	} {
		req, _ := http.NewRequest(http.MethodPost, e.urls[0]+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+clientKey)
		for _, s := range tc.sid {
			req.Header.Add(SessionHeader, s)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 400 || !strings.Contains(string(b), tc.code) {
			t.Errorf("session %q: %d %s, want 400 %s", tc.sid, res.StatusCode, b, tc.code)
		}
	}
	if up.Count() != 0 {
		t.Fatalf("%d refused requests reached the upstream", up.Count())
	}
	if res := e.doSession(0, clientKey, "ok-1", body); res.StatusCode != 200 {
		t.Fatalf("a named session: %d", res.StatusCode)
	}
}

// uniqueClients names doc's clients CLIENT1 and CLIENT2 uniquely for this
// test and run: tests share a Redis and a fixed fake clock, so a budget's
// window is the same for all of them.
func uniqueClients(t *testing.T, doc string) string {
	n := uniqueName(t)
	return strings.NewReplacer("CLIENT1", n+"a", "CLIENT2", n+"b").Replace(doc)
}
