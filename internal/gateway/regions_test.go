package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/pricing"
	"github.com/sluice-io/sluice/internal/regiontest"
	"github.com/sluice-io/sluice/internal/yamlconf"
	"github.com/sluice-io/sluice/region"
)

// parseInRegions parses a gateway section as serve's config loader does
// when its store has regions (Config.Regions set before the check).
func parseInRegions(name string, data []byte, regions []string) (*Config, error) {
	var c Config
	doc, err := yamlconf.Decode(ErrInvalidConfig, name, data, &c)
	if err != nil {
		return nil, err
	}
	c.Regions = regions
	c.Check(doc)
	if err := doc.Err(); err != nil {
		return nil, err
	}
	return &c, nil
}

// A tier, team or org with scope global needs regions, a known home and
// no concurrency; its limits' and budgets' store keys carry the mark of
// its home, its concurrency's never.
func TestGlobalScopeConfig(t *testing.T) {
	regions := []string{"us", "eu", "ap"}
	head := "upstream: {base_url: http://127.0.0.1:1/v1}\nprices: {m: {input: 1, output: 1}}\n"
	bad := head + `tiers:
  a: {rpm: 10, scope: global, home: mars}
  b: {rpm: 10, concurrency: 2, scope: global}
  c: {rpm: 10, home: eu}
  d: {rpm: 10, scope: planet}
  e: {rpm: 10, models: {m: {concurrency: 1}}, scope: global}
teams:
  t: {concurrency: 3, scope: global}
`
	_, err := parseInRegions("g.yaml", []byte(bad), regions)
	var ye *yamlconf.Error
	if !errors.As(err, &ye) {
		t.Fatalf("%v", err)
	}
	for _, want := range []string{
		`tiers.a.home: unknown region "mars"`,
		"tiers.b.concurrency: tiers.b cannot be global: requests in flight are held",
		"tiers.c.home: only a tier, team or org with scope: global has a home",
		`tiers.d.scope: unknown scope "planet"`,
		"tiers.e.models.m.concurrency: tiers.e cannot be global",
		"teams.t.concurrency: teams.t cannot be global",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("no %q in:\n%v", want, err)
		}
	}
	if _, err := Parse("g.yaml", []byte(head+"tiers: {a: {rpm: 10, scope: global}}\n")); err == nil || !strings.Contains(err.Error(), "tiers.a.scope: scope global needs serve's store.region and store.regions") {
		t.Fatalf("global without regions: %v", err)
	}

	good := head + fmt.Sprintf(`tiers:
  g: {rpm: 10, tpm: 1000, concurrency: 0, budgets: [{usd: 1, per: day}], scope: global, home: eu}
  r: {rpm: 10, concurrency: 2}
orgs:
  o: {budgets: [{usd: 5, per: month}], scope: global}
teams:
  t: {org: o, rpm: 100}
keys:
  - {name: one, hash: %s, tier: g, team: t, client: c1}
  - {name: two, hash: %s, tier: r, client: c2}
`, sluice.HashKey(clientKey), sluice.HashKey(clientKey2))
	cfg, err := parseInRegions("g.yaml", []byte(good), regions)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := New(Options{Config: cfg, Store: fakeClockStore(t), Getenv: func(string) string { return upstreamKey }, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	marked := func(key, home string) bool {
		h, ok := region.KeyScope(key)
		return ok && h == home
	}
	one := gw.keys[sluice.HashKey(clientKey)]
	for i, s := range one.tier.specs {
		if global := s.alg != sluice.Concurrency; marked(one.specKeys[i], "eu") != global {
			t.Errorf("tier g's %s: key %q", s.name, one.specKeys[i])
		}
	}
	for i, s := range one.levels.specs {
		var want bool // the team's rpm is regional
		switch s.scope() {
		case "key": // the tier's budget
			want = marked(one.levels.keys[i], "eu")
		case "org o":
			want = marked(one.levels.keys[i], "")
		default:
			want = !strings.HasPrefix(one.levels.keys[i], "@")
		}
		if !want {
			t.Errorf("%s %s: key %q", s.scope(), s.name, one.levels.keys[i])
		}
	}
	two := gw.keys[sluice.HashKey(clientKey2)]
	for _, k := range two.specKeys {
		if strings.HasPrefix(k, "@") {
			t.Errorf("regional tier r: key %q", k)
		}
	}
}

// regionGateways starts a gateway in each of w's regions, on its
// region.Store, from doc (hardStopDoc's arguments filled in: up, the two
// client keys). Each settlement is sent on settled, which holds n.
func regionGateways(t *testing.T, w *regiontest.World, doc string, up *fakeopenai.Server, n int) (urls []string, stores map[string]*region.Store, settled chan Settlement) {
	t.Helper()
	urls, stores, settled, _ = regionGatewaysTuned(t, w, doc, up, n, nil)
	return urls, stores, settled
}

// regionGatewaysTuned is regionGateways, with tune (when set) changing
// each region's store options, and the gateways returned, by region.
func regionGatewaysTuned(t *testing.T, w *regiontest.World, doc string, up *fakeopenai.Server, n int, tune func(r string, o *region.Options)) (urls []string, stores map[string]*region.Store, settled chan Settlement, gws map[string]*Gateway) {
	t.Helper()
	settled = make(chan Settlement, n)
	stores, gws = map[string]*region.Store{}, map[string]*Gateway{}
	for _, r := range regiontest.Regions {
		cfg, err := parseInRegions("test.yaml", []byte(fmt.Sprintf(doc, up.URL()+"/v1", sluice.HashKey(clientKey), sluice.HashKey(clientKey2))), append([]string{r}, othersOf(r)...))
		if err != nil {
			t.Fatal(err)
		}
		var opts func(*region.Options)
		if tune != nil {
			opts = func(o *region.Options) { tune(r, o) }
		}
		stores[r] = w.Store(t, r, opts)
		gw, err := New(Options{Config: cfg, Store: stores[r], Registerer: prometheus.NewRegistry(),
			Getenv:    func(string) string { return upstreamKey },
			OnSettled: func(s Settlement) { settled <- s },
			Logger:    slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
		if err != nil {
			t.Fatal(err)
		}
		gws[r] = gw
		srv := httptest.NewServer(gw)
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	return urls, stores, settled, gws
}

// An org's $1.00 monthly budget with scope global (home eu), spent by two
// keys through three gateways at once, one in each region (eu, us, ap,
// each its own redis-server, linked by 40, 80 and 150 ms each way: the
// region package's harness): the priced usage of every request the
// gateways let through ends at ≤ $1.00, every region having spent some of
// it; each request's other limits (its tier's, its team's) are regional
// and decided in the same all-or-nothing batch.
func TestGlobalBudgetAcrossRegions(t *testing.T) {
	w := regiontest.NewWorld(t)
	org := uniqueName(t)
	// The upstream reports the full 4000 completion tokens: each request
	// costs $0.04001, about what it reserves.
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, PromptTokens: 5, CachedTokens: 2, CompletionTokens: 4000})
	doc := strings.Replace(hardStopDoc, "%[4]s", org, -1)
	doc = strings.Replace(doc, "timezone: Europe/Berlin}]}", "timezone: Europe/Berlin}], scope: global, home: eu}", 1)
	if !strings.Contains(doc, "scope: global") {
		t.Fatal("the org's budget was not made global")
	}
	urls, stores, settled := regionGateways(t, w, doc, up, 1000)
	body := `{"model":"gpt-test","messages":[{"role":"user","content":"write a long essay about the history of rate limiting in distributed systems"}],"max_tokens":4000}`
	var wg sync.WaitGroup
	var ok, refused atomic.Int64
	byRegion := make([]atomic.Int64, len(urls))
	// 90 requests, 30 through each region's gateway: $3.60 of demand,
	// which three regional budgets of $1 would let through $3. Each
	// region's clients start one every 40 ms: all at once, the home
	// region's gateway, deciding at its own Redis, takes the whole budget
	// before a fetch from another region arrives (docs/regions.md,
	// "Fairness between regions").
	for i := range 90 {
		key := []string{clientKey, clientKey2}[i%2]
		r := i % len(urls)
		if r == 0 && i > 0 {
			time.Sleep(40 * time.Millisecond) // the clients' pace, not a synchronisation
		}
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, urls[r]+"/v1/chat/completions", strings.NewReader(body))
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
				byRegion[r].Add(1)
				// The org's budget decided by eu's own Redis at home,
				// elsewhere by the region's share.
				if want := map[bool]string{true: "home", false: "share"}[r == 0]; res.Header.Get(DecidedByHeader) != want {
					t.Errorf("%s: %s: %q, want %q", regiontest.Regions[r], DecidedByHeader, res.Header.Get(DecidedByHeader), want)
				}
			case 429:
				refused.Add(1)
				if !strings.Contains(string(b), `"code":"insufficient_quota"`) {
					t.Errorf("refusal: %s", b)
				}
			default:
				t.Errorf("status %d: %s", res.StatusCode, b)
			}
		})
	}
	wg.Wait()
	var spent pricing.Micros
	for range ok.Load() {
		s := <-settled
		spent += s.Cost
	}
	t.Logf("admitted %d (eu %d, us %d, ap %d), refused %d: spent %s of the global $1.00", ok.Load(), byRegion[0].Load(), byRegion[1].Load(), byRegion[2].Load(), refused.Load(), spent)
	if spent > pricing.Dollar {
		t.Fatalf("spent %s of a global $1.00 budget from three regions", spent)
	}
	if int64(up.Count()) != ok.Load() {
		t.Fatalf("upstream served %d, gateways admitted %d", up.Count(), ok.Load())
	}
	// Use: two regions or more spent some (ap, 150 ms from the home, is
	// served its cold key's first fetch, about 300 ms in, when eu and us
	// have spent a third or more: measured 1 request of 24); together at
	// least half of the budget (a share fetched and not spent when the
	// demand stopped is charged at home and held: less, never more).
	spenders := 0
	for i := range regiontest.Regions {
		if byRegion[i].Load() > 0 {
			spenders++
		}
	}
	if spenders < 2 {
		t.Errorf("%d regions spent the budget", spenders)
	}
	if spent < pricing.Dollar/2 {
		t.Fatalf("spent only %s of $1.00", spent)
	}
	// us (40 ms from the home) decides from its share; ap's first fetch
	// (two 150 ms legs, more on a loaded host) can land after eu and us
	// spent the budget (once under a loaded -race run), so ap is logged
	// (TestGlobalBudgetRefundsAcrossRegions paces its clients and holds ap
	// to fetching capacity from the home).
	t.Logf("ap: %+v", stores["ap"].Stats())
	for _, r := range []string{"us"} {
		if st := stores[r].Stats(); st.Share == 0 {
			t.Fatalf("%s: no decision from its share: %+v", r, st)
		}
	}
	// /v1/status says which tier answers each global budget in the
	// region asked; regional limits and budgets say nothing.
	for i, want := range []string{"home", "share"} {
		req, _ := http.NewRequest(http.MethodGet, urls[i]+"/v1/status", nil)
		req.Header.Set("Authorization", "Bearer "+clientKey)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var st Status
		err = json.NewDecoder(res.Body).Decode(&st)
		res.Body.Close()
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("status %d: %v", res.StatusCode, err)
		}
		for _, b := range st.Budgets {
			if by := map[bool]string{true: want, false: ""}[b.Scope == "org "+org]; b.DecidedBy != by {
				t.Errorf("%s: budget %+v: decided_by %q, want %q", regiontest.Regions[i], b, b.DecidedBy, by)
			}
		}
		for _, l := range st.Limits {
			if l.DecidedBy != "" {
				t.Errorf("%s: regional limit %+v", regiontest.Regions[i], l)
			}
		}
	}
}

// othersOf are the World's regions but r.
func othersOf(r string) []string {
	var out []string
	for _, o := range regiontest.Regions {
		if o != r {
			out = append(out, o)
		}
	}
	return out
}

// A tier's rpm with scope global (home eu), through three gateways, one in
// each region of the World: admitted over the regions together ≤ burst +
// rate·t + 1 from the first request, whatever region the requests reach;
// us and ap answer from their shares (Sluice-Decided-By: share).
func TestGlobalRPMAcrossRegions(t *testing.T) {
	w := regiontest.NewWorld(t)
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey})
	client := uniqueName(t) // fresh keys in the regions' Redis
	var urls []string
	stores := map[string]*region.Store{}
	for _, r := range regiontest.Regions {
		doc := fmt.Sprintf(`upstream: {base_url: %s/v1, api_key_env: UP}
store: {timeout: 5s}
tiers:
  t: {rpm: 600, rpm_burst: 20, scope: global, home: eu}
keys:
  - {name: one, hash: %s, tier: t, client: %s}
`, up.URL(), sluice.HashKey(clientKey), client)
		cfg, err := parseInRegions("test.yaml", []byte(doc), append([]string{r}, othersOf(r)...))
		if err != nil {
			t.Fatal(err)
		}
		stores[r] = w.Store(t, r, nil)
		gw, err := New(Options{Config: cfg, Store: stores[r], Registerer: prometheus.NewRegistry(), Getenv: func(string) string { return upstreamKey },
			Logger: slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(gw)
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	// Each region's client sends a request every 25 ms for 2 s: 120/s
	// over the three, twelve times the tier's 10/s.
	const run = 2 * time.Second
	var admitted atomic.Int64
	by := make([]atomic.Int64, len(urls))
	var wg sync.WaitGroup
	start := time.Now()
	for i := range urls {
		wg.Go(func() {
			tick := time.NewTicker(25 * time.Millisecond) // the offered load, not a synchronisation
			defer tick.Stop()
			for ; time.Since(start) < run; <-tick.C {
				req, _ := http.NewRequest(http.MethodPost, urls[i]+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`))
				req.Header.Set("Authorization", "Bearer "+clientKey)
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				switch res.StatusCode {
				case 200:
					admitted.Add(1)
					by[i].Add(1)
					if want := map[bool]string{true: "home", false: "share"}[i == 0]; res.Header.Get(DecidedByHeader) != want {
						t.Errorf("%s: %s %q, want %q", regiontest.Regions[i], DecidedByHeader, res.Header.Get(DecidedByHeader), want)
					}
				case 429:
				default:
					t.Errorf("status %d", res.StatusCode)
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	bound := 20 + 10*el.Seconds() + 1
	t.Logf("admitted %d in %s (eu %d, us %d, ap %d), bound %.0f", admitted.Load(), el.Round(time.Millisecond), by[0].Load(), by[1].Load(), by[2].Load(), bound)
	if float64(admitted.Load()) > bound {
		t.Fatalf("admitted %d over three regions, over the global rpm's %.0f", admitted.Load(), bound)
	}
	// A loose floor on use (the region package holds the tight ones).
	if float64(admitted.Load()) < 0.5*(20+10*run.Seconds()) {
		t.Fatalf("admitted only %d", admitted.Load())
	}
	for _, r := range []string{"us", "ap"} {
		if st := stores[r].Stats(); st.Home != 0 {
			t.Fatalf("%s decided at home: %+v", r, st)
		}
	}
}

// A gateway in ap cut off from eu, the home of its tier's global rpm,
// with no share of it yet: the failure policy answers (fail_closed: 429),
// and the response says so (Sluice-Decided-By: policy); its regional
// limits are not in question.
func TestGlobalPartitionDecidedByPolicy(t *testing.T) {
	w := regiontest.NewWorld(t)
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey})
	doc := fmt.Sprintf(`upstream: {base_url: %s/v1, api_key_env: UP}
store: {timeout: 5s}
tiers:
  t: {rpm: 600, scope: global, home: eu}
keys:
  - {name: one, hash: %s, tier: t, client: %s}
`, up.URL(), sluice.HashKey(clientKey), uniqueName(t))
	cfg, err := parseInRegions("test.yaml", []byte(doc), []string{"ap", "eu", "us"})
	if err != nil {
		t.Fatal(err)
	}
	st := w.Store(t, "ap", func(o *region.Options) {
		o.FetchTimeout = 300 * time.Millisecond // a partition is found out in 300 ms, not the default 2 s
	})
	gw, err := New(Options{Config: cfg, Store: st, Registerer: prometheus.NewRegistry(), Getenv: func(string) string { return upstreamKey },
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	w.Links[[2]string{"ap", "eu"}].Partition()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`))
	req.Header.Set("Authorization", "Bearer "+clientKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusTooManyRequests || res.Header.Get(DecidedByHeader) != "policy" {
		t.Fatalf("cut off from the home: %d %s %q: %s", res.StatusCode, DecidedByHeader, res.Header.Get(DecidedByHeader), b)
	}
	if up.Count() != 0 {
		t.Fatalf("the upstream served %d", up.Count())
	}
}

// An org's $1.00 monthly budget (Europe/Berlin calendar) with scope
// global, home eu, spent from the three regions at once by requests that
// reserve ten times what they spend: max_tokens 2000 priced ($0.02), of
// which the upstream produces 200 ($0.002 and the prompt's 5 tokens). Each
// request's unused reservation is refunded naming its charge's window (the
// budget decision's ResetAfter, less the time since): at home to the
// home's window, elsewhere to the region's share of the same window. The
// priced usage ends at ≤ $1.00, and at ≥ $0.90: what is left is less
// than a reservation in each region's share and at home ($0.06 at most;
// measured $0.94-0.96 spent). With the far
// regions' refunds dropped (as before they named their window), each
// request there took $0.02 of the budget for $0.002 of use, and the
// budget was drained by reservations: measured $0.50-0.54 spent (us 23-25
// requests, ap 1), against $0.94-0.96 with the refunds (us 222-311, ap
// 1-70).
func TestGlobalBudgetRefundsAcrossRegions(t *testing.T) {
	w := regiontest.NewWorld(t)
	org := uniqueName(t)
	// The fake produces 200 completion tokens and reports 5 prompt
	// tokens, 2 of them cached, as OpenAI's usage object does.
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, PromptTokens: 5, CachedTokens: 2, CompletionTokens: 200})
	doc := strings.Replace(hardStopDoc, "%[4]s", org, -1)
	doc = strings.Replace(doc, "timezone: Europe/Berlin}]}", "timezone: Europe/Berlin}], scope: global, home: eu}", 1)
	if !strings.Contains(doc, "scope: global") {
		t.Fatal("the org's budget was not made global")
	}
	urls, stores, settled := regionGateways(t, w, doc, up, 4000)
	body := `{"model":"gpt-test","messages":[{"role":"user","content":"write a short note about rate limiting"}],"max_tokens":2000}`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	byRegion := make([]atomic.Int64, len(urls))
	var ok atomic.Int64
	// Three clients per region, each a request every 10 ms at most: the
	// regions offer alike, so the far regions' reservations weigh on the
	// budget as much as the home's. A client stops once refused for a
	// second on end (the budget is spent): a region whose last fetch came
	// back short refuses at once while its next fetch, a round trip away
	// (300 ms from ap), may still bring what the home had left.
	for r := range urls {
		for k := range 3 {
			key := []string{clientKey, clientKey2}[k%2]
			wg.Go(func() {
				tick := time.NewTicker(10 * time.Millisecond) // the clients' pace, not a synchronisation
				defer tick.Stop()
				var refusedSince time.Time // zero while admitted
				for refusedSince.IsZero() || time.Since(refusedSince) < time.Second {
					select {
					case <-ctx.Done():
						return
					case <-tick.C:
					}
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, urls[r]+"/v1/chat/completions", strings.NewReader(body))
					req.Header.Set("Authorization", "Bearer "+key)
					res, err := http.DefaultClient.Do(req)
					if err != nil {
						if ctx.Err() == nil {
							t.Error(err)
						}
						return
					}
					b, _ := io.ReadAll(res.Body)
					res.Body.Close()
					switch res.StatusCode {
					case 200:
						refusedSince = time.Time{}
						ok.Add(1)
						byRegion[r].Add(1)
					case 429:
						if refusedSince.IsZero() {
							refusedSince = time.Now()
						}
						if !strings.Contains(string(b), `"code":"insufficient_quota"`) {
							t.Errorf("refusal: %s", b)
							return
						}
					default:
						t.Errorf("status %d: %s", res.StatusCode, b)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	var spent pricing.Micros
	for range ok.Load() {
		s := <-settled
		spent += s.Cost
	}
	t.Logf("admitted %d (eu %d, us %d, ap %d): spent %s of the global $1.00", ok.Load(), byRegion[0].Load(), byRegion[1].Load(), byRegion[2].Load(), spent)
	if spent > pricing.Dollar {
		t.Fatalf("spent %s of a global $1.00 budget from three regions", spent)
	}
	if ctx.Err() != nil {
		t.Fatalf("the clients did not spend the budget in 30s: %d requests", ok.Load())
	}
	// us (40 ms from the home) decides from its share. ap (150 ms) is
	// served by the home, but a loaded host can delay its first fetch
	// until what the home has left is under one request's reservation
	// ($0.019 of $0.02 once, in a make test run): its fetches are held to
	// being answered with capacity, and its share decisions are logged.
	t.Logf("ap: %+v", stores["ap"].Stats())
	if st := stores["us"].Stats(); st.Share == 0 {
		t.Fatalf("us: no decision from its share: %+v", st)
	}
	if st := stores["ap"].Stats(); st.Share == 0 && st.Fetched == 0 {
		t.Fatalf("ap: no decision from its share and no capacity fetched: %+v", st)
	}
	if spent < pricing.Dollar*9/10 {
		t.Fatalf("spent only %s of $1.00: the budget was drained by reservations, not by spend", spent)
	}
}
