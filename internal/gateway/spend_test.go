package gateway

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/fakeopenai"
)

// TestSpend: Spend lists every budget once, by level and name: keys that
// share a client are one row naming both keys; a team's and an org's
// budget once however many clients share them; the spend settled on the
// client, its team and its org; most spent first; bounded by maxClients.
func TestSpend(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, PromptTokens: 5, CompletionTokens: 10})
	e := newBudgetEnv(t, `
upstream: {base_url: %[1]s, api_key_env: UP}
prices: {gpt-test: {input: 1000, output: 1000}}
tiers: {t: {budgets: [{usd: 5, per: day}]}}
orgs: {acme: {budgets: [{usd: 10, per: month}]}}
teams: {research: {org: acme, budgets: [{usd: 1, per: week}]}}
keys:
  - {name: one, hash: %[2]s, tier: t, team: research, client: shared}
  - {name: two, hash: %[3]s, tier: t, team: research, client: shared}
`, up, fakeClockStore(t))
	if res := e.do(0, "POST", "/v1/completions", clientKey2, `{"model":"gpt-test","prompt":"x","max_tokens":10}`); res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	e.settle()
	rep, err := e.gws[0].Spend(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rep.Rows {
		got = append(got, fmt.Sprintf("%s %s: %s of %s per %s", r.Level, r.Name, r.SpentUSD, r.LimitUSD, r.Window))
	}
	// 15 tokens at $1000 per million: $0.015 on each level.
	want := []string{
		"team research: 0.015000 of 1.000000 per week",
		"key one, two: 0.015000 of 5.000000 per day",
		"org acme: 0.015000 of 10.000000 per month",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") || rep.Clients != 1 || rep.Peeked != 1 {
		t.Fatalf("spend (%d clients, %d peeked):\n%s\nwant\n%s", rep.Clients, rep.Peeked, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if rep, err := e.gws[0].Spend(context.Background(), 0); err != nil || len(rep.Rows) != 0 || rep.Clients != 1 || rep.Peeked != 0 {
		t.Fatalf("bounded to 0 clients: %+v %v", rep, err)
	}
}
