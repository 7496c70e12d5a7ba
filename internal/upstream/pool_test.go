package upstream

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/yamlconf"
	"github.com/sluice-io/sluice/memstore"
)

func testPool(t *testing.T, defs []Def, routes map[string][]Target, r Routing) (*Pool, *clock.Fake) {
	t.Helper()
	doc := yamlconf.New(nil, "")
	if r.Margin == nil {
		r.Margin = new(float64) // exact limits
	}
	Check(doc, defs, routes, &r)
	if err := doc.Err(); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	st, err := memstore.New(memstore.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Options{Upstreams: defs, Routes: routes, Routing: r, Store: st, Getenv: func(string) string { return "sk-test" }, Now: clk.Time, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	return p, clk
}

func twoUpstreams() ([]Def, map[string][]Target) {
	return []Def{
		{Name: "a", Kind: OpenAI, BaseURL: "http://a.example/v1", KeyEnv: "A", Models: map[string]Limits{"m-a": {RPM: 10, TPM: 1000}}},
		{Name: "b", Kind: OpenAI, BaseURL: "http://b.example/v1", KeyEnv: "B", Models: map[string]Limits{"m-b": {RPM: 5, TPM: 1000}}},
	}, map[string][]Target{"m": {{Upstream: "a", Model: "m-a"}, {Upstream: "b", Model: "m-b"}}}
}

// TestAcquireNeverPastLimits: the pool admits exactly the pooled request
// limits, each upstream to its own, then answers honestly when the first
// has room: a period after the first admission's slot ended, as a log
// frees it.
func TestAcquireNeverPastLimits(t *testing.T) {
	defs, routes := twoUpstreams()
	p, clk := testPool(t, defs, routes, Routing{})
	r := p.Route("m", "")
	per := map[string]int{}
	var wait time.Duration
	for range 20 {
		g, w, err := p.Acquire(context.Background(), r, false, 10, 10, nil)
		if err != nil {
			t.Fatal(err)
		}
		if g == nil {
			if wait = w; w <= time.Minute || w > time.Minute+p.slot() {
				t.Fatalf("wait %s, want the minute until the first admission's slot slides out", wait)
			}
			continue
		}
		per[g.Target.Up.Name]++
	}
	if per["a"] != 10 || per["b"] != 5 {
		t.Fatalf("admitted %v, want a 10, b 5", per)
	}
	clk.Advance(time.Minute)
	if g, _, _ := p.Acquire(context.Background(), r, false, 10, 10, nil); g != nil {
		t.Fatalf("admitted on %s a minute on, before the slot's end: a bucket's refill, which a windowed provider refuses", g.Target.Up.Name)
	}
	clk.Advance(wait - time.Minute)
	g, _, _ := p.Acquire(context.Background(), r, false, 10, 10, nil)
	if g == nil {
		t.Fatal("nothing back when the wait said")
	}
}

// TestNoWindowOverLimit: under random arrivals and reservations, no
// upstream is sent more than its request or token limit in any window of
// one period, wherever the window starts: what a provider counting in
// fixed or sliding windows would refuse, and so, a fortiori, one counting
// in a continuously refilled bucket.
func TestNoWindowOverLimit(t *testing.T) {
	defs, routes := twoUpstreams()
	defs[0].Models["m-a"] = Limits{RPM: 30, TPM: 3000}
	defs[1].Models["m-b"] = Limits{RPM: 20, TPM: 5000}
	p, clk := testPool(t, defs, routes, Routing{})
	r := p.Route("m", "")
	rng := rand.New(rand.NewPCG(1, 2))
	type sent struct {
		at  time.Time
		tok int64
	}
	log := map[string][]sent{}
	for range 4000 {
		clk.Advance(time.Duration(rng.IntN(200)) * time.Millisecond)
		in, out := int64(rng.IntN(100)), int64(rng.IntN(200))
		g, _, err := p.Acquire(context.Background(), r, false, in, out, nil)
		if err != nil {
			t.Fatal(err)
		}
		if g == nil {
			continue
		}
		log[g.Target.Up.Name] = append(log[g.Target.Up.Name], sent{clk.Time(), in + out})
		if rng.IntN(2) == 0 { // used less than reserved: nothing comes back
			_, _ = g.Settle(context.Background(), in/2, out/2, false)
		}
	}
	for _, d := range defs {
		lim := d.Models["m-"+d.Name]
		xs := log[d.Name]
		if len(xs) < int(3*lim.RPM) {
			t.Fatalf("%s sent only %d", d.Name, len(xs))
		}
		for i := range xs {
			var n, tok int64
			for j := i; j < len(xs) && xs[j].at.Sub(xs[i].at) < time.Minute; j++ {
				n++
				tok += xs[j].tok
			}
			if n > lim.RPM || tok > lim.TPM {
				t.Fatalf("%s: %d requests and %d tokens in the minute from %s, limits %d and %d", d.Name, n, tok, xs[i].at, lim.RPM, lim.TPM)
			}
		}
	}
}

// TestCapacityPolicySpreads: the default policy sends to the upstream with
// the most room relative to its limit, so both fill evenly.
func TestCapacityPolicySpreads(t *testing.T) {
	defs, routes := twoUpstreams()
	defs[0].Models["m-a"] = Limits{RPM: 100}
	defs[1].Models["m-b"] = Limits{RPM: 100}
	p, _ := testPool(t, defs, routes, Routing{})
	per := map[string]int{}
	for range 40 {
		g, _, _ := p.Acquire(context.Background(), p.Route("m", ""), false, 1, 1, nil)
		per[g.Target.Up.Name]++
	}
	if per["a"] != 20 || per["b"] != 20 {
		t.Fatalf("spread %v", per)
	}
}

// TestSettleOnce: a grant keeps its reservation, as the provider does,
// is charged once for usage beyond it, and settles once.
func TestSettleOnce(t *testing.T) {
	defs, routes := twoUpstreams()
	routes["m"] = routes["m"][:1]
	defs = defs[:1]
	p, _ := testPool(t, defs, routes, Routing{})
	r := p.Route("m", "")
	g, _, _ := p.Acquire(context.Background(), r, false, 100, 400, nil)
	if ok, err := g.Settle(context.Background(), 100, 100, false); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, _ := g.Settle(context.Background(), 100, 900, false); ok {
		t.Fatal("settled twice")
	}
	// 500 of 1000 kept, though 200 were used.
	if g2, _, _ := p.Acquire(context.Background(), r, false, 501, 0, nil); g2 != nil {
		t.Fatal("a reservation came back")
	}
	g2, _, _ := p.Acquire(context.Background(), r, false, 100, 100, nil)
	if g2 == nil {
		t.Fatal("500 left, 200 refused")
	}
	if _, err := g2.Settle(context.Background(), 100, 200, false); err != nil { // 100 more than reserved
		t.Fatal(err)
	}
	if g3, _, _ := p.Acquire(context.Background(), r, false, 201, 0, nil); g3 != nil {
		t.Fatal("usage past the reservation not charged")
	}
	if g3, _, _ := p.Acquire(context.Background(), r, false, 200, 0, nil); g3 == nil {
		t.Fatal("charged more than the usage past the reservation")
	}
}

// TestCooldownAndLearning: a 429 with Retry-After cools the target for
// that long; a reported limit below the declared one is learned, and a
// reported remaining below the store's tightens it.
func TestCooldownAndLearning(t *testing.T) {
	defs, routes := twoUpstreams()
	routes["m"] = routes["m"][:1]
	defs = defs[:1]
	defs[0].Models["m-a"] = Limits{RPM: 600, TPM: 1000} // an interval of 100ms
	p, clk := testPool(t, defs, routes, Routing{})
	r := p.Route("m", "")
	g, _, _ := p.Acquire(context.Background(), r, false, 1, 1, nil)
	p.Observe(context.Background(), g, 429, http.Header{"Retry-After": {"3"}}, time.Millisecond)
	if g2, wait, _ := p.Acquire(context.Background(), r, false, 1, 1, nil); g2 != nil || wait != 3*time.Second {
		t.Fatalf("cooled: grant %v wait %s", g2, wait)
	}
	clk.Advance(3 * time.Second)
	g, _, _ = p.Acquire(context.Background(), r, false, 1, 1, nil)
	if g == nil {
		t.Fatal("cooldown did not lapse")
	}
	h := http.Header{"X-Ratelimit-Limit-Requests": {"4"}, "X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Limit-Tokens": {"5000"}}
	p.Observe(context.Background(), g, 200, h, time.Millisecond)
	if l := g.Target.Limits(); l.RPM != 4 || l.TPM != 1000 {
		t.Fatalf("learned %+v: want rpm 4 and the declared tpm kept", l)
	}
	p.Wait() // the tightening runs in the background
	defer func() {
		p.Observe(context.Background(), g, 200, http.Header{"X-Ratelimit-Limit-Requests": {"5000"}}, time.Millisecond)
		if l := g.Target.Limits(); l.RPM != 600 {
			t.Fatalf("a provider limit above the declared one: rpm %d, want the declared 600", l.RPM)
		}
	}()
	if g2, _, _ := p.Acquire(context.Background(), r, false, 1, 1, nil); g2 != nil {
		t.Fatal("remaining 0 reported, yet admitted")
	}
}

func TestRewrite(t *testing.T) {
	defs := []Def{
		{Name: "az", Kind: Azure, BaseURL: "https://res.openai.azure.com", KeyEnv: "K", Models: map[string]Limits{"dep-1": {}}},
		{Name: "an", Kind: Anthropic, BaseURL: "https://api.anthropic.com/v1", KeyEnv: "K", Models: map[string]Limits{"claude-x-2025": {}}},
		{Name: "oa", Kind: OpenAI, BaseURL: "https://api.openai.com/v1/", KeyEnv: "K", Models: map[string]Limits{"gpt-x-2024": {}}},
	}
	routes := map[string][]Target{"gpt-x": {{Upstream: "az", Model: "dep-1"}, {Upstream: "oa", Model: "gpt-x-2024"}}, "claude-x": {{Upstream: "an", Model: "claude-x-2025"}}}
	p, _ := testPool(t, defs, routes, Routing{})
	body := []byte(`{"messages":[{"role":"user","content":"\"model\": \"no\""}], "model" : "gpt-x","n":1}`)
	cases := []struct {
		t          *TargetState
		in, url    string
		header     string
		body, skip string
	}{
		{p.Route("gpt-x", "").Targets[0], "/v1/chat/completions", "https://res.openai.azure.com/openai/deployments/dep-1/chat/completions?api-version=" + DefaultAzureAPIVersion, "Api-Key", string(body), "Authorization"},
		{p.Route("gpt-x", "").Targets[1], "/v1/chat/completions", "https://api.openai.com/v1/chat/completions", "Authorization", strings.Replace(string(body), `"gpt-x"`, `"gpt-x-2024"`, 1), "Api-Key"},
		{p.Route("claude-x", "").Targets[0], "/v1/messages", "https://api.anthropic.com/v1/messages", "X-Api-Key", strings.Replace(string(body), `"gpt-x"`, `"claude-x-2025"`, 1), "Authorization"},
	}
	for _, c := range cases {
		out := &http.Request{URL: &url.URL{Path: c.in}, Header: http.Header{"Authorization": {"Bearer client-key"}, "Api-Key": {"client"}}}
		got := c.t.Rewrite(out, c.in, body, "gpt-x")
		if out.URL.String() != c.url || string(got) != c.body || out.Header.Get(c.skip) != "" || !strings.Contains(out.Header.Get(c.header), "sk-test") {
			t.Errorf("%s: url %s header %v body %s", c.t.Up.Name, out.URL, out.Header, got)
		}
	}
}

// TestObserveConcurrent runs Observe and Acquire together (-race).
func TestObserveConcurrent(t *testing.T) {
	defs, routes := twoUpstreams()
	p, _ := testPool(t, defs, routes, Routing{Policy: PolicyLatency})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				if g, _, _ := p.Acquire(context.Background(), p.Route("m", ""), false, 1, 1, nil); g != nil {
					p.Observe(context.Background(), g, 200, http.Header{"X-Ratelimit-Remaining-Requests": {"3"}}, time.Millisecond)
					_, _ = g.Settle(context.Background(), 1, 1, false)
				}
			}
		})
	}
	wg.Wait()
}

// TestSticky: one affinity key goes to one upstream while it has room,
// then to the others; different keys spread.
func TestSticky(t *testing.T) {
	defs, routes := twoUpstreams()
	defs[0].Models["m-a"] = Limits{RPM: 5}
	defs[1].Models["m-b"] = Limits{RPM: 5}
	p, _ := testPool(t, defs, routes, Routing{})
	r := p.Route("m", "")
	first, _, _ := p.AcquireSticky(context.Background(), r, false, 1, 1, nil, "conversation-1")
	for range 4 {
		g, _, _ := p.AcquireSticky(context.Background(), r, false, 1, 1, nil, "conversation-1")
		if g.Target != first.Target {
			t.Fatalf("moved to %s while %s had room", g.Target.Up.Name, first.Target.Up.Name)
		}
	}
	g, _, _ := p.AcquireSticky(context.Background(), r, false, 1, 1, nil, "conversation-1")
	if g == nil || g.Target == first.Target {
		t.Fatal("a full upstream kept its conversation")
	}
	seen := map[string]bool{}
	for i := range 8 {
		p2, _ := testPool(t, defs, routes, Routing{})
		g, _, _ := p2.AcquireSticky(context.Background(), p2.Route("m", ""), false, 1, 1, nil, fmt.Sprint("c", i))
		seen[g.Target.Up.Name] = true
	}
	if len(seen) != 2 {
		t.Fatalf("8 keys all on %v", seen)
	}
}

// TestMarginByCeiling: the margin keeps back rate × margin rounded up, so
// that a small limit keeps a margin at all (2% of 30 is 1, which
// truncation made 0), and a product whole but for floating point's error
// keeps exactly that.
func TestMarginByCeiling(t *testing.T) {
	for _, c := range []struct {
		rate int64
		m    float64
		want int64
	}{
		{30, 0.02, 29}, {49, 0.02, 48}, {50, 0.02, 49}, {51, 0.02, 49}, {100, 0.07, 93}, {1, 0.02, 1},
		{1000, 0, 1000}, {3, 0.49, 1}, {1 << 40, 0.02, 1<<40 - 21990232556},
	} {
		m := c.m
		p := &Pool{routing: Routing{Margin: &m}, period: time.Minute}
		if got := p.limitOf(c.rate).Rate; got != c.want {
			t.Errorf("limit %d margin %v: store rate %d, want %d", c.rate, c.m, got, c.want)
		}
	}
}
