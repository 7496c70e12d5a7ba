package upstream

import (
	"context"
	"testing"
	"time"
)

// anthropicPool is one Anthropic upstream model of l, exact (no margin).
func anthropicPool(t *testing.T, l Limits) (*Pool, *Route, func(time.Duration)) {
	t.Helper()
	defs := []Def{{Name: "an", Kind: Anthropic, BaseURL: "http://an.example/v1", KeyEnv: "A", Models: map[string]Limits{"claude-x": l}}}
	p, clk := testPool(t, defs, map[string][]Target{"claude": {{Upstream: "an", Model: "claude-x"}}}, Routing{})
	return p, p.Route("claude", ""), func(d time.Duration) { clk.Advance(d) }
}

// TestSettleGivesBackToItsOwnSlot: Anthropic gives a request's unused
// output tokens back when it ends; so does the pool, from the request's
// own admission, not from the newest one: a request admitted later keeps
// counting for its whole minute.
func TestSettleGivesBackToItsOwnSlot(t *testing.T) {
	p, r, advance := anthropicPool(t, Limits{OTPM: 2000})
	ctx := context.Background()
	acquire := func(out int64) *Grant {
		g, _, err := p.Acquire(ctx, r, true, 0, out, nil)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	a := acquire(1000)
	advance(30 * time.Second)
	b := acquire(1000)
	if a == nil || b == nil {
		t.Fatal("refused within the limit")
	}
	advance(time.Second)
	if ok, err := a.Settle(ctx, 0, 10, false); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if acquire(990) == nil {
		t.Fatal("the 990 output tokens a did not use did not come back")
	}
	// a's minute is over, b's is not: b's 1000 and the 990 still count.
	advance(30 * time.Second)
	if g := acquire(11); g != nil {
		t.Fatal("b's tokens were given back in a's place: 11 admitted past the limit")
	}
	if acquire(10) == nil {
		t.Fatal("a's 10 used tokens still count past its minute")
	}
}

// TestSettleUnsentGivesBack: a request no upstream received gives its
// request and tokens back (TestSettleOnce: one sent to an OpenAI upstream
// keeps its reservation, as OpenAI counts max_tokens).
func TestSettleUnsentGivesBack(t *testing.T) {
	defs, routes := twoUpstreams()
	routes["m"] = routes["m"][:1]
	defs = defs[:1]
	defs[0].Models["m-a"] = Limits{RPM: 1, TPM: 1000}
	p, _ := testPool(t, defs, routes, Routing{})
	r := p.Route("m", "")
	ctx := context.Background()
	g, _, _ := p.Acquire(ctx, r, false, 100, 900, nil)
	if g2, _, _ := p.Acquire(ctx, r, false, 1, 0, nil); g2 != nil {
		t.Fatal("admitted past rpm 1")
	}
	if ok, err := g.Settle(ctx, 0, 0, true); !ok || err != nil {
		t.Fatal(ok, err)
	}
	g, _, _ = p.Acquire(ctx, r, false, 100, 900, nil)
	if g == nil {
		t.Fatal("an unsent request's rpm and tokens did not come back")
	}
}
