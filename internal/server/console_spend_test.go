package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/gateway"
)

const (
	aliceKey = "sk-gw-alice-0001"
	bobKey   = "sk-gw-bob-0002"
)

// gatewayService runs a service whose config has a gateway: section, with
// the gateway as `sluice serve` runs it (cmd/sluice's gatewayComponent:
// the service's store, its spend given to the console), in front of a
// fake OpenAI. It returns the service and the gateway's URL.
func gatewayService(t *testing.T) (*svc, string) {
	t.Helper()
	up := fakeopenai.New(t, fakeopenai.Options{})
	return gatewayServiceWith(t, svcOptions{config: consoleConfig + fmt.Sprintf(`gateway:
  listen: 127.0.0.1:0
  upstream: {base_url: %s/v1, allow_no_key: true}
  prices: {gpt-test: {input: 1000, output: 1000}}
  tiers: {t: {rpm: 1000, budgets: [{usd: 5, per: day}]}}
  orgs: {acme: {budgets: [{usd: 10, per: month}]}}
  teams: {research: {org: acme, budgets: [{usd: 2, per: week}]}}
  keys:
    - {name: alice, hash: %s, tier: t, team: research}
    - {name: bob, hash: %s, tier: t}
`, up.URL(), sluice.HashKey(aliceKey), sluice.HashKey(bobKey))})
}

// gatewayServiceWith runs o's service and the gateway of its config,
// wired to the console as cmd/sluice's gatewayComponent wires it (spend,
// outcomes, look-up), and returns the service and the gateway's URL.
func gatewayServiceWith(t *testing.T, o svcOptions) (*svc, string) {
	t.Helper()
	addr := make(chan net.Addr, 1)
	o.components = append(o.components, func(d Deps) (Component, error) {
		gw, err := gateway.New(gateway.Options{Config: d.Config().File.Gateway, Store: d.Store, Logger: d.Logger, OnOutcome: d.GatewayOutcome, OnSettled: d.GatewaySettled})
		if err != nil {
			return nil, err
		}
		d.SetGatewaySpend(func(ctx context.Context) (any, error) { return gw.Spend(ctx, 100) })
		d.SetGatewayLookup(gw.LookUp)
		return &gateway.Server{Gateway: gw, Addr: "127.0.0.1:0", OnListen: func(a net.Addr) { addr <- a }}, nil
	})
	s := startService(t, o)
	select {
	case a := <-addr:
		return s, "http://" + a.String()
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway did not listen")
		return nil, ""
	}
}

// spendRows answers the console's spend view as "level name: spent of
// limit per window".
func spendRows(t *testing.T, s *svc) []string {
	t.Helper()
	a := s.do(t, "GET", "/ui/api/spend", "", bearer...)
	if a.status != 200 {
		t.Fatalf("spend: %d %s", a.status, a.raw)
	}
	var rep gateway.SpendReport
	if err := json.Unmarshal([]byte(a.raw), &rep); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rep.Rows {
		out = append(out, fmt.Sprintf("%s %s: %s of %s per %s", r.Level, r.Name, r.SpentUSD, r.LimitUSD, r.Window))
	}
	return out
}

// TestConsoleGatewaySpend: with a gateway in the process, the console's
// spend view (admin token) lists every budget of its keys, teams and orgs
// with what its window spent, most spent first: a request by alice (team
// research, org acme) spends on her key's, her team's and her org's
// budgets, not on bob's. No key or key hash is in the answer.
func TestConsoleGatewaySpend(t *testing.T) {
	s, gw := gatewayService(t)
	if a := s.do(t, "GET", "/ui/api/spend", ""); a.status != 401 {
		t.Fatalf("without the token: %d %s", a.status, a.raw)
	}
	req, _ := http.NewRequest("POST", gw+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":10}`))
	req.Header.Set("Authorization", "Bearer "+aliceKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("a request through the gateway: %d", res.StatusCode)
	}
	// Settled after the answer: wait for the spend to show.
	var rows []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if rows = spendRows(t, s); len(rows) == 4 && !strings.HasPrefix(rows[0], "team research: 0.000000") && !strings.Contains(rows[0], ": 0.000000 of") {
			break
		}
	}
	if len(rows) != 4 {
		t.Fatalf("spend rows: %q", rows)
	}
	spent := map[string]bool{}
	for _, r := range rows {
		name, rest, _ := strings.Cut(r, ": ")
		spent[name] = !strings.HasPrefix(rest, "0.000000 ")
	}
	want := map[string]bool{"key alice": true, "team research": true, "org acme": true, "key bob": false}
	if fmt.Sprint(spent) != fmt.Sprint(want) {
		t.Errorf("spent: %v, want %v (rows %q)", spent, want, rows)
	}
	if !strings.HasPrefix(rows[0], "team research: ") || !strings.HasSuffix(rows[0], " of 2.000000 per week") {
		t.Errorf("most spent first: the team's $2 budget, got %q", rows[0])
	}
	a := s.do(t, "GET", "/ui/api/spend", "", bearer...)
	for _, secret := range []string{aliceKey, bobKey, sluice.HashKey(aliceKey), sluice.HashKey(aliceKey)[:16]} {
		if strings.Contains(a.raw, secret) {
			t.Fatalf("the spend view shows a key or its hash: %s", a.raw)
		}
	}
}

// TestConsoleSpendWithoutGateway: without a gateway in the process the
// spend view answers 404, saying why.
func TestConsoleSpendWithoutGateway(t *testing.T) {
	s := startService(t, svcOptions{config: consoleConfig})
	if a := s.do(t, "GET", "/ui/api/spend", "", bearer...); a.status != 404 || !strings.Contains(a.raw, "gateway") {
		t.Fatalf("%d %s", a.status, a.raw)
	}
}
