package upstream

import (
	"context"
	"net/http"
	"testing"
	"time"
)

var headerNow = time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC)

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// TestCooldownOfHostileRetryAfter: every Retry-After and retry-after-ms a
// provider (or anything between it and us) may send gives a cooldown in
// (0, MaxCooldown]; a bad one never discards a valid one beside it.
// OpenAI sends retry-after-ms and Retry-After on a 429; Anthropic sends
// Retry-After in seconds; RFC 9110 §10.2.3 allows an HTTP-date.
func TestCooldownOfHostileRetryAfter(t *testing.T) {
	for _, c := range []struct {
		name string
		h    http.Header
		want time.Duration
	}{
		{"none", hdr(), DefaultCooldown},
		{"seconds", hdr("Retry-After", "5"), 5 * time.Second},
		{"fraction", hdr("Retry-After", "0.5"), 500 * time.Millisecond},
		{"ms", hdr("retry-after-ms", "1500"), 1500 * time.Millisecond},
		{"ms preferred", hdr("retry-after-ms", "250", "Retry-After", "1"), 250 * time.Millisecond},
		{"date", hdr("Retry-After", headerNow.Add(30*time.Second).Format(http.TimeFormat)), 30 * time.Second},
		{"date far", hdr("Retry-After", "Fri, 31 Dec 9999 23:59:59 GMT"), MaxCooldown},
		{"date past", hdr("Retry-After", "Wed, 21 Oct 2015 07:28:00 GMT"), DefaultCooldown},
		{"1e10", hdr("Retry-After", "1e10"), MaxCooldown},
		{"9999999999", hdr("Retry-After", "9999999999"), MaxCooldown},
		{"1e400", hdr("Retry-After", "1e400"), MaxCooldown},
		{"int64 max", hdr("Retry-After", "9223372036854775807"), MaxCooldown},
		{"ms 1e10", hdr("retry-after-ms", "1e10"), MaxCooldown},
		{"Inf", hdr("Retry-After", "Inf"), DefaultCooldown},
		{"+Inf", hdr("Retry-After", "+Inf"), DefaultCooldown},
		{"NaN", hdr("Retry-After", "NaN"), DefaultCooldown},
		{"negative", hdr("Retry-After", "-5"), DefaultCooldown},
		{"zero", hdr("Retry-After", "0"), DefaultCooldown},
		{"garbage", hdr("Retry-After", "soon"), DefaultCooldown},
		{"too long", hdr("Retry-After", "1"+string(make([]byte, 100))), DefaultCooldown},
		{"ms Inf keeps seconds", hdr("retry-after-ms", "Inf", "Retry-After", "5"), 5 * time.Second},
		{"ms NaN keeps seconds", hdr("retry-after-ms", "NaN", "Retry-After", "5"), 5 * time.Second},
		{"ms negative keeps seconds", hdr("retry-after-ms", "-1", "Retry-After", "5"), 5 * time.Second},
		{"ms garbage keeps date", hdr("retry-after-ms", "x", "Retry-After", headerNow.Add(7*time.Second).Format(http.TimeFormat)), 7 * time.Second},
		{"ms huge yields to seconds", hdr("retry-after-ms", "1e300", "Retry-After", "5"), 5 * time.Second},
		{"seconds huge yields to ms", hdr("retry-after-ms", "300", "Retry-After", "1e10"), 300 * time.Millisecond},
		{"seconds Inf keeps ms", hdr("retry-after-ms", "300", "Retry-After", "Inf"), 300 * time.Millisecond},
		// OpenAI: reset durations (https://platform.openai.com/docs/guides/rate-limits#rate-limits-in-headers).
		{"openai reset", hdr("X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "6m0s"), 6 * time.Minute},
		{"openai reset ms", hdr("X-Ratelimit-Remaining-Tokens", "0", "X-Ratelimit-Reset-Tokens", "20ms"), 20 * time.Millisecond},
		{"openai reset of a limit with room", hdr("X-Ratelimit-Remaining-Requests", "3", "X-Ratelimit-Reset-Requests", "6m0s"), DefaultCooldown},
		{"openai reset huge", hdr("X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "9999999h"), MaxCooldown},
		{"openai reset negative", hdr("X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "-1s"), DefaultCooldown},
		{"openai reset garbage", hdr("X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "1x"), DefaultCooldown},
		{"reset under Retry-After", hdr("Retry-After", "2", "X-Ratelimit-Remaining-Requests", "0", "X-Ratelimit-Reset-Requests", "6m0s"), 2 * time.Second},
		// Anthropic: RFC 3339 resets (https://docs.anthropic.com/en/api/rate-limits#response-headers).
		{"anthropic reset", hdr("Anthropic-Ratelimit-Input-Tokens-Remaining", "0", "Anthropic-Ratelimit-Input-Tokens-Reset", headerNow.Add(12*time.Second).Format(time.RFC3339)), 12 * time.Second},
		{"anthropic reset far", hdr("Anthropic-Ratelimit-Requests-Remaining", "0", "Anthropic-Ratelimit-Requests-Reset", "9999-12-31T23:59:59Z"), MaxCooldown},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := cooldownOf(c.h, readHeaders(c.h, headerNow), headerNow); got != c.want {
				t.Fatalf("cooldown %v, want %v", got, c.want)
			}
		})
	}
}

// TestReadHeadersBounded: counts are decimal integers capped at
// MaxHeaderCount; anything else is no value and leaves the other headers.
func TestReadHeadersBounded(t *testing.T) {
	h := hdr(
		"X-Ratelimit-Limit-Requests", "99999999999999999999999",
		"X-Ratelimit-Remaining-Requests", "-3",
		"X-Ratelimit-Limit-Tokens", "1e10",
		"X-Ratelimit-Remaining-Tokens", "1234",
		"Anthropic-Ratelimit-Output-Tokens-Limit", " 8000 ",
		"Anthropic-Ratelimit-Output-Tokens-Remaining", "NaN",
		"X-Ratelimit-Reset-Tokens", "1m30.5s",
	)
	r := readHeaders(h, headerNow)
	if want := [4]int64{MaxHeaderCount, -1, -1, 8000}; r.limit != want {
		t.Errorf("limits %v, want %v", r.limit, want)
	}
	if want := [4]int64{-1, 1234, -1, -1}; r.remaining != want {
		t.Errorf("remaining %v, want %v", r.remaining, want)
	}
	if r.reset[limTPM] != 90*time.Second+500*time.Millisecond {
		t.Errorf("token reset %v, want 1m30.5s", r.reset[limTPM])
	}
}

// TestHostileRetryAfterCools: a 429 with Retry-After: 1e10 (which
// overflowed the conversion and cooled nothing) cools the upstream model
// for MaxCooldown on the fleet: the next 16 requests go elsewhere, and
// after MaxCooldown it is back.
func TestHostileRetryAfterCools(t *testing.T) {
	defs, routes := twoUpstreams()
	defs[0].Models["m-a"] = Limits{RPM: 1000}
	defs[1].Models["m-b"] = Limits{RPM: 1000}
	p, clk := testPool(t, defs, routes, Routing{})
	ctx := context.Background()
	r := p.Route("m", "")
	for _, h := range []http.Header{
		hdr("Retry-After", "1e10"),
		hdr("Retry-After", "9999999999"),
		hdr("retry-after-ms", "Inf", "Retry-After", "Inf"),
	} {
		g, _, err := p.Acquire(ctx, r, false, 1, 1, nil)
		if err != nil || g == nil {
			t.Fatal("no grant", err)
		}
		cooled := g.Target
		p.Observe(ctx, g, http.StatusTooManyRequests, h, time.Millisecond)
		_, _ = g.Settle(ctx, 0, 0, false)
		for i := range 16 {
			g, _, err := p.Acquire(ctx, r, false, 1, 1, nil)
			if err != nil || g == nil {
				t.Fatal("no grant", err)
			}
			if g.Target == cooled {
				t.Fatalf("%v: request %d went to the upstream that asked to wait", h, i)
			}
			_, _ = g.Settle(ctx, 0, 0, true)
		}
		clk.Advance(MaxCooldown + time.Second)
	}
}

// FuzzCooldownOf: whatever the headers, the cooldown is in
// (0, MaxCooldown], and a valid Retry-After of whole seconds within the
// cap is honoured whatever retry-after-ms says unless that is valid too.
func FuzzCooldownOf(f *testing.F) {
	for _, s := range [][3]string{
		{"", "5", ""}, {"Inf", "5", ""}, {"1e10", "", ""}, {"", "9999999999", ""}, {"NaN", "-1", "6m0s"},
		{"-0", "0x1p10", "20ms"}, {"1e-300", "Wed, 21 Oct 2015 07:28:00 GMT", "9999-12-31T23:59:59Z"},
		{"", "Fri, 31 Dec 9999 23:59:59 GMT", "1s"}, {"4.9e-324", "1_0", "1h1h1h1h1h1h1h1h"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, ms, ra, reset string) {
		h := hdr("Retry-After-Ms", ms, "Retry-After", ra, "X-Ratelimit-Reset-Requests", reset,
			"X-Ratelimit-Remaining-Requests", "0", "Anthropic-Ratelimit-Tokens-Remaining", ms)
		rl := readHeaders(h, headerNow)
		for i := range 4 {
			if rl.limit[i] < -1 || rl.limit[i] > MaxHeaderCount || rl.remaining[i] < -1 || rl.remaining[i] > MaxHeaderCount {
				t.Fatalf("unbounded count %v %v", rl.limit, rl.remaining)
			}
			if rl.reset[i] < 0 || rl.reset[i] > MaxCooldown {
				t.Fatalf("unbounded reset %v", rl.reset)
			}
		}
		d := cooldownOf(h, rl, headerNow)
		if d <= 0 || d > MaxCooldown {
			t.Fatalf("cooldown %v out of (0, %v]", d, MaxCooldown)
		}
		if r := readRetry(h, headerNow); r.ms == 0 && r.seconds > 0 && d != r.seconds {
			t.Fatalf("valid Retry-After %v discarded for %v", r.seconds, d)
		}
	})
}
