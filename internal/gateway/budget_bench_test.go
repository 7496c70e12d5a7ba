package gateway

import (
	"fmt"
	"testing"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/memstore"
)

// BenchmarkBudgetAdmission measures a whole request through ServeHTTP
// (canned upstream, memory store) for a key with its tier's limits only
// (the baseline) and for one that is also charged a dollar budget of its
// own and its team's and org's limits and budgets: pricing, three more
// budgets and three more rate limits in the same ApplyAll, and their
// settlement.
func BenchmarkBudgetAdmission(b *testing.B) {
	resp := []byte(`{"id":"x","object":"chat.completion","model":"gpt-test","choices":[{"index":0,"message":{"role":"assistant","content":"tok tok "},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14,"prompt_tokens_details":{"cached_tokens":4}}}`)
	big := Limits{RPM: 1 << 30, TPM: 1 << 36}
	huge := []BudgetConfig{{USD: "1000000", Per: "month", Timezone: "Europe/Berlin"}}
	for _, c := range []struct {
		name   string
		levels bool
	}{{"baseline=tier", false}, {"budgets+team+org", true}} {
		b.Run(c.name, func(b *testing.B) {
			st, err := memstore.New(memstore.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			cfg := &Config{
				Upstream: UpstreamConfig{BaseURL: "http://upstream.invalid/v1"},
				Models:   []string{"gpt-test"},
				Prices:   map[string]PriceConfig{"gpt-test": {Input: "2.50", CachedInput: "1.25", Output: "10"}},
				Tiers:    map[string]TierConfig{"big": Tier(Limits{RPM: 1 << 30, TPM: 1 << 36, Concurrency: 1 << 20})},
			}
			if c.levels {
				cfg.Orgs = map[string]LevelConfig{"acme": {Limits: big, Budgets: huge}}
				cfg.Teams = map[string]LevelConfig{"research": {Org: "acme", Limits: big, Budgets: huge}}
			}
			var keys []string
			for i := range 64 {
				keys = append(keys, fmt.Sprintf("sk-budget-%d", i))
				k := KeyConfig{Name: "b", Hash: sluice.HashKey(keys[i]), Tier: "big"}
				if c.levels {
					k.Team, k.Budgets = "research", huge
				}
				cfg.Keys = append(cfg.Keys, k)
			}
			gw, err := New(Options{Config: cfg, Store: st, Transport: cannedUpstream{body: resp}})
			if err != nil {
				b.Fatal(err)
			}
			defer gw.Close()
			serveParallel(b, gw, keys)
		})
	}
}
