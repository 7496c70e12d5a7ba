package aiclient

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/fakeopenai"
)

// TestIssue12DisagreeingHeaders is the response of issue 12: a 429 whose
// OpenAI triple mixes the per-minute limit (20, 0 left) with the daily
// reset (1h0m23s), which infers 3 minutes a request, and whose
// retry-after-ms says 1767. The retry comes after 1767ms, and the call
// after it is not held back for minutes either.
func TestIssue12DisagreeingHeaders(t *testing.T) {
	mixed := hdr("x-ratelimit-limit-requests", "20", "x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "1h0m23s")
	up := fakeopenai.New(t, fakeopenai.Options{})
	up.Enqueue(fakeopenai.Fault{Status: 429, RetryAfterMS: "1767", Header: mixed})
	ft := newFakeTime()
	c := newClient(t, up.BaseURL(), ft, func(o *Options) { o.Rand = func() float64 { return 0 } })
	if _, err := c.Chat(context.Background(), userReq("hi")); err != nil {
		t.Fatal(err)
	}
	if got := ft.slept(); len(got) != 1 || got[0] != 1767*time.Millisecond {
		t.Fatalf("sleeps %v, want [1.767s]", got)
	}
}

// TestPacerBindingConstraint: of several IETF policies the one that binds
// decides, at its stated rate: rpm spent (3s a request) outweighs rpd
// (plenty left) and tpm (enough left); when tpm lacks tokens, it decides.
func TestPacerBindingConstraint(t *testing.T) {
	policy := `"rpm";q=20;w=60;sluice-burst=5, "rpd";q=1000;w=86400;sluice-burst=1000, "tpm";q=10000;sluice-qu="tokens";w=60;sluice-burst=2000`
	for _, c := range []struct {
		name   string
		rl     string
		tokens int64
		want   time.Duration
	}{
		{"rpm spent", `"rpm";r=0;t=3, "tpm";r=1500;t=1, "rpd";r=995;t=87`, 100, 3 * time.Second},
		{"rpm has room", `"rpm";r=2;t=3, "tpm";r=1500;t=1, "rpd";r=995;t=87`, 100, 0},
		{"tpm short", `"rpm";r=2;t=3, "tpm";r=100;t=1, "rpd";r=995;t=87`, 600, 500 * 6 * time.Millisecond},
		{"rpd spent", `"rpd";r=0;t=87, "rpm";r=2;t=3, "tpm";r=1500;t=1`, 100, 86400 * time.Second / 1000},
	} {
		t.Run(c.name, func(t *testing.T) {
			var p pacer
			now := t0.UnixNano()
			p.observe(ParseRateLimit(hdr("RateLimit-Policy", policy, "RateLimit", c.rl), t0), now, 0, c.tokens, 0, false)
			if got, _, _ := p.reserve(now, c.tokens); got != c.want {
				t.Fatalf("wait %v, want %v", got, c.want)
			}
			if got, _, _ := p.reserve(now+int64(c.want), c.tokens); got != 0 {
				t.Fatalf("after the wait: %v more", got)
			}
		})
	}
}

// TestPacerPrefersStatedRate: sluice's gateway says rpm 500 with a burst
// of 50 in both dialects; OpenAI's triple alone would infer 12ms a request
// (6s to refill 500), the IETF policy states 120ms. The stated rate paces.
func TestPacerPrefersStatedRate(t *testing.T) {
	h := hdr("x-ratelimit-limit-requests", "500", "x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "6s",
		"RateLimit-Policy", `"rpm";q=500;w=60;sluice-burst=50`, "RateLimit", `"rpm";r=0;t=1`)
	var p pacer
	now := t0.UnixNano()
	p.observe(ParseRateLimit(h, t0), now, 0, 0, 0, false)
	for i := range 3 {
		at := now + int64(i+1)*int64(120*time.Millisecond)
		if got, _, _ := p.reserve(at-1, 0); got != 1 {
			t.Fatalf("request %d: wait %v at 1ns early, want 1ns", i, got)
		}
		if got, _, _ := p.reserve(at, 0); got != 0 {
			t.Fatalf("request %d: wait %v, want 0", i, got)
		}
	}
}

// TestPacerHintThenRate: after a hint shorter than the headers imply, the
// first request goes at the hint and the next ones follow at the limit's
// rate, not all at once.
func TestPacerHintThenRate(t *testing.T) {
	h := hdr("RateLimit-Policy", `"rpm";q=60;w=60`, "RateLimit", `"rpm";r=0;t=1`)
	var p pacer
	now := t0.UnixNano()
	hint := 200 * time.Millisecond // the server knows better: a unit is nearly back
	p.observe(ParseRateLimit(h, t0), now, 0, 0, hint, true)
	if got, _, _ := p.reserve(now, 0); got != hint {
		t.Fatalf("first wait %v, want the hint %v", got, hint)
	}
	if got, _, _ := p.reserve(now+int64(hint), 0); got != 0 {
		t.Fatalf("at the hint: %v", got)
	}
	if got, _, _ := p.reserve(now+int64(hint), 0); got != time.Second {
		t.Fatalf("second caller waits %v, want 1s (the rate)", got)
	}
	// A hint longer than the headers imply does not shorten anything;
	// the 429 hold (holdUntil) covers it.
	var q pacer
	q.observe(ParseRateLimit(h, t0), now, 0, 0, time.Hour, true)
	if got, _, _ := q.reserve(now, 0); got != time.Second {
		t.Fatalf("long hint: wait %v, want 1s", got)
	}
}

// TestPacerCountsInFlight: with several calls in flight, a response
// describes the server before the launches that followed its own; those
// are counted down from it, and a response older than the one followed is
// ignored.
func TestPacerCountsInFlight(t *testing.T) {
	h := func(r int) http.Header {
		return hdr("RateLimit-Policy", `"rpm";q=60;w=60;sluice-burst=3`, "RateLimit", fmt.Sprintf(`"rpm";r=%d;t=1`, r))
	}
	var p pacer
	now := t0.UnixNano()
	_, a, _ := p.reserve(now, 0)
	_, b, _ := p.reserve(now, 0)
	_, c, _ := p.reserve(now, 0)
	// a's answer: 2 left after a; b and c are still on their way.
	p.observe(ParseRateLimit(h(2), t0), now, a, 0, 0, false)
	if got, _, _ := p.reserve(now, 0); got != time.Second {
		t.Fatalf("wait %v, want 1s: b and c use up what a's answer left", got)
	}
	// c's answer, then b's (older) arrives late: b's is ignored.
	p.observe(ParseRateLimit(h(0), t0), now, c, 0, 0, false)
	p.observe(ParseRateLimit(h(1), t0), now, b, 0, 0, false)
	if got, _, _ := p.reserve(now, 0); got != time.Second {
		t.Fatalf("wait %v, want 1s from c's answer", got)
	}
}
