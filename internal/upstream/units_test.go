package upstream

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
)

// TestUnitsPerKind: an OpenAI or Azure target reserves the larger of the
// rate limiter's estimate and the gateway's count, an Anthropic target
// the count.
func TestUnitsPerKind(t *testing.T) {
	defs, routes := twoUpstreams()
	p, _ := testPool(t, defs, routes, Routing{})
	ctx := context.Background()
	for _, u := range []Units{{In: 100, RateIn: 250, Out: 10}, {In: 300, RateIn: 250, Out: 10}} {
		g, _, err := p.AcquireUnits(ctx, p.Route("m", ""), false, u, nil, "")
		if err != nil || g == nil {
			t.Fatal(g, err)
		}
		if in, out := g.Reserved(); in != max(u.In, u.RateIn) || out != 10 {
			t.Fatalf("%+v: reserved %d+%d", u, in, out)
		}
	}
	ap, ar, _ := anthropicPool(t, Limits{ITPM: 10_000})
	g, _, err := ap.AcquireUnits(ctx, ar, true, Units{In: 100, RateIn: 250, Out: 10}, nil, "")
	if err != nil || g == nil {
		t.Fatal(g, err)
	}
	if in, _ := g.Reserved(); in != 100 {
		t.Fatalf("anthropic reserved %d, want its count 100", in)
	}
}

// TestJudge: a provider 429 naming a count above the reservation is the
// request's (OpenAI's wording); one larger than the limit too; a request
// limit's, or one whose count the reservation covered, is the traffic's.
// Without a count, a refusal with at least the reservation reported left
// is the request's (Anthropic names no count).
func TestJudge(t *testing.T) {
	ctx := context.Background()
	body := func(typ, msg string) []byte {
		return []byte(`{"error":{"message":"` + msg + `","type":"` + typ + `","param":null,"code":"rate_limit_exceeded"}}`)
	}
	for _, c := range []struct {
		name string
		body []byte
		h    http.Header
		want Refusal
	}{
		{"undercount", body("tokens", "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 1000, Used 700, Requested 400. Please try again in 6s."), nil, RefusalUndercount},
		{"covered", body("tokens", "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 1000, Used 900, Requested 110. Please try again in 1s."), nil, RefusalGeneral},
		{"too large", body("tokens", "Request too large for gpt-4o in organization org-x on tokens per min (TPM): Limit 1000, Requested 1,500. The input or output tokens must be reduced in order to run successfully."), nil, RefusalTooLarge},
		{"requests", body("requests", "Rate limit reached for gpt-4o in organization org-x on requests per min (RPM): Limit 10, Used 10, Requested 1."), nil, RefusalGeneral},
		{"room left", []byte(`{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed the rate limit for your organization of 1,000 input tokens per minute."}}`),
			http.Header{"X-Ratelimit-Remaining-Tokens": {"500"}}, RefusalUndercount},
		{"no room", []byte(`{"type":"error","error":{"type":"rate_limit_error","message":"over"}}`),
			http.Header{"X-Ratelimit-Remaining-Tokens": {"50"}}, RefusalGeneral},
		{"no output room", []byte(`{"type":"error","error":{"type":"rate_limit_error","message":"over"}}`),
			http.Header{"Anthropic-Ratelimit-Input-Tokens-Remaining": {"5000"}, "Anthropic-Ratelimit-Output-Tokens-Remaining": {"5"}}, RefusalGeneral},
		{"input over", []byte(`{"type":"error","error":{"type":"rate_limit_error","message":"over"}}`),
			http.Header{"Anthropic-Ratelimit-Input-Tokens-Remaining": {"5000"}, "Anthropic-Ratelimit-Output-Tokens-Remaining": {"500"}}, RefusalUndercount},
		{"garbage", []byte(`<html>`), nil, RefusalGeneral},
	} {
		defs, routes := twoUpstreams()
		p, _ := testPool(t, defs, routes, Routing{})
		g, _, err := p.AcquireUnits(ctx, p.Route("m", ""), false, Units{In: 100, Out: 10}, nil, "")
		if err != nil || g == nil {
			t.Fatal(g, err)
		}
		if got := p.Judge(ctx, g, c.h, c.body); got != c.want || g.Refused() != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
		p.Observe(ctx, g, http.StatusTooManyRequests, c.h, time.Millisecond)
		if cooled := g.Target.coolUntil.Load() > 0; cooled != (c.want == RefusalGeneral) {
			t.Errorf("%s: cooled %v", c.name, cooled)
		}
	}
}

// TestRatioLearnedFleetWide: the provider's counts teach the ratio of its
// count to the base reservation, both ways, in the shared store: another
// replica on the same store reserves by it too, and it is forgotten a
// period after its samples.
func TestRatioLearnedFleetWide(t *testing.T) {
	defs, routes := twoUpstreams()
	routes["m"] = routes["m"][:1]
	defs = defs[:1]
	defs[0].Models["m-a"] = Limits{TPM: 1_000_000}
	p, clk := testPool(t, defs, routes, Routing{})
	ctx := context.Background()
	acquire := func(p *Pool) *Grant {
		g, _, err := p.AcquireUnits(ctx, p.Route("m", ""), false, Units{In: 100, RateIn: 80, Out: 10}, nil, "")
		if err != nil || g == nil {
			t.Fatal(g, err)
		}
		return g
	}
	// The provider counts 130 of input where 100 was reserved: a 429
	// names it (Requested 140 with the 10 of max_tokens).
	body := []byte(`{"error":{"message":"Rate limit reached for m-a in organization org-x on tokens per min (TPM): Limit 1000000, Used 999990, Requested 140.","type":"tokens","code":"rate_limit_exceeded"}}`)
	for range 3 {
		if k := p.Judge(ctx, acquire(p), nil, body); k != RefusalUndercount {
			t.Fatalf("judged %v", k)
		}
	}
	if in, _ := acquire(p).Reserved(); in != 130 {
		t.Fatalf("after the provider's counts: %d reserved, want 130 (ratio %.3f)", in, p.Targets()[0].Ratio())
	}
	// Another replica on the same store.
	q, err := New(Options{Upstreams: defs, Routes: routes, Routing: p.routing, Store: p.store, Getenv: func(string) string { return "k" }, Now: clk.Time})
	if err != nil {
		t.Fatal(err)
	}
	q.refreshRatio(ctx, q.Targets()[0], clk.Time())
	q.Wait()
	if in, _ := acquire(q).Reserved(); in != 130 {
		t.Fatalf("another replica reserves %d, want the fleet's 130", in)
	}
	// A period later, the provider counts less than reserved: 70 of 100.
	clk.Advance(2 * time.Minute)
	for range 3 {
		p.sample(ctx, p.Targets()[0], 70, 100, true)
	}
	g := acquire(p)
	if in, _ := g.Reserved(); in != 70 {
		t.Fatalf("after lower counts: %d reserved, want 70 (ratio %.3f)", in, p.Targets()[0].Ratio())
	}
	// The usage's 100 prompt tokens (the tokenizer's) are not what the
	// provider's limit counted: the input is not charged past the 70.
	tg := p.Targets()[0]
	before, _ := p.store.Apply(ctx, sluice.OpPeek, p.logReq(tg, limTPM, tg.limit(limTPM), 0))
	if _, err := g.Settle(ctx, 100, 10, false); err != nil {
		t.Fatal(err)
	}
	after, _ := p.store.Apply(ctx, sluice.OpPeek, p.logReq(tg, limTPM, tg.limit(limTPM), 0))
	if after.Remaining != before.Remaining {
		t.Fatalf("settling charged the tpm log %d more", before.Remaining-after.Remaining)
	}
	// Nothing more for a period: the samples leave the window.
	clk.Advance(2 * time.Minute)
	p.syncRatio(ctx, p.Targets()[0], true)
	if r := p.Targets()[0].Ratio(); r != 1 {
		t.Fatalf("ratio %.3f a period after the last sample, want 1", r)
	}
}
