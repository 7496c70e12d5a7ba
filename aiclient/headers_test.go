package aiclient

import (
	"net/http"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func TestParseRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    http.Header
		want time.Duration
		ok   bool
	}{
		{"ms", hdr("retry-after-ms", "1500"), 1500 * time.Millisecond, true},
		{"ms wins over seconds", hdr("retry-after-ms", "250", "Retry-After", "9"), 250 * time.Millisecond, true},
		{"fractional ms", hdr("retry-after-ms", "0.5"), 500 * time.Microsecond, true},
		{"seconds", hdr("Retry-After", "3"), 3 * time.Second, true},
		{"fractional seconds", hdr("Retry-After", "1.25"), 1250 * time.Millisecond, true},
		{"http date", hdr("Retry-After", t0.Add(7*time.Second).Format(http.TimeFormat)), 7 * time.Second, true},
		{"date in the past", hdr("Retry-After", t0.Add(-time.Hour).Format(http.TimeFormat)), 0, true},
		{"negative", hdr("Retry-After", "-5"), 0, true},
		{"huge", hdr("Retry-After", "1e300"), maxHint, true},
		{"bad ms falls back", hdr("retry-after-ms", "soon", "Retry-After", "2"), 2 * time.Second, true},
		{"garbage", hdr("Retry-After", "soon"), 0, false},
		{"NaN", hdr("Retry-After", "NaN"), 0, false},
		{"absent", hdr(), 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseRetryAfter(tc.h, t0)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("ParseRetryAfter = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestParseResetDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"6m0s":     6 * time.Minute,
		"1s":       time.Second,
		"20ms":     20 * time.Millisecond,
		"1h2m3.5s": time.Hour + 2*time.Minute + 3500*time.Millisecond,
		"17":       17 * time.Second,
		"0.5":      500 * time.Millisecond,
		"-1s":      0,
		"-1d":      0,
		"1d":       24 * time.Hour,
		"2d3h":     24 * time.Hour, // clamped to maxHint
		"9999999h": maxHint,
	} {
		got, ok := ParseResetDuration(in)
		if !ok || got != want {
			t.Errorf("ParseResetDuration(%q) = %v, %v; want %v", in, got, ok, want)
		}
	}
	for _, bad := range []string{"", "soon", "1x", "d", "-", "1s2"} {
		if got, ok := ParseResetDuration(bad); ok {
			t.Errorf("ParseResetDuration(%q) = %v, true; want not ok", bad, got)
		}
	}
}

func TestParseShouldRetry(t *testing.T) {
	for in, want := range map[string][2]bool{"true": {true, true}, "FALSE": {false, true}, "maybe": {false, false}, "": {false, false}} {
		r, ok := ParseShouldRetry(hdr("x-should-retry", in))
		if [2]bool{r, ok} != want {
			t.Errorf("ParseShouldRetry(%q) = %v, %v; want %v", in, r, ok, want)
		}
	}
}

func TestParseRateLimit(t *testing.T) {
	for _, tc := range []struct {
		name     string
		h        http.Header
		req, tok Window
	}{
		{
			name: "openai",
			h: hdr("x-ratelimit-limit-requests", "60", "x-ratelimit-remaining-requests", "59", "x-ratelimit-reset-requests", "1s",
				"x-ratelimit-limit-tokens", "150000", "x-ratelimit-remaining-tokens", "149984", "x-ratelimit-reset-tokens", "6m0s"),
			req: Window{Known: true, Limit: 60, Remaining: 59, Reset: time.Second, Linear: true},
			tok: Window{Known: true, Limit: 150000, Remaining: 149984, Reset: 6 * time.Minute, Linear: true},
		},
		{
			name: "anthropic",
			h: hdr("anthropic-ratelimit-requests-limit", "50", "anthropic-ratelimit-requests-remaining", "0",
				"anthropic-ratelimit-requests-reset", t0.Add(1200*time.Millisecond).Format(time.RFC3339Nano),
				"anthropic-ratelimit-input-tokens-limit", "40000", "anthropic-ratelimit-input-tokens-remaining", "1000",
				"anthropic-ratelimit-input-tokens-reset", t0.Add(30*time.Second).Format(time.RFC3339)),
			req: Window{Known: true, Limit: 50, Remaining: 0, Reset: 1200 * time.Millisecond, Linear: true},
			tok: Window{Known: true, Limit: 40000, Remaining: 1000, Reset: 30 * time.Second, Linear: true},
		},
		{
			name: "ietf structured, most constrained policy",
			h:    hdr("RateLimit", `"burst";r=50;t=1, "daily";r=3;t=3600`, "RateLimit-Policy", `"burst";q=100;w=1, "daily";q=1000;w=86400`),
			req:  Window{Known: true, Limit: 1000, Remaining: 3, Reset: time.Hour, Interval: 86400 * time.Second / 1000},
		},
		{
			name: "ietf draft 3 single field",
			h:    hdr("RateLimit", "limit=10, remaining=2, reset=4"),
			req:  Window{Known: true, Limit: 10, Remaining: 2, Reset: 4 * time.Second},
		},
		{
			name: "ietf older fields",
			h:    hdr("RateLimit-Limit", "100;w=60", "RateLimit-Remaining", "7", "RateLimit-Reset", "30"),
			req:  Window{Known: true, Limit: 100, Remaining: 7, Reset: 30 * time.Second},
		},
		{
			name: "x-ratelimit with unix reset",
			h:    hdr("X-RateLimit-Limit", "10", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1767323065"),
			req:  Window{Known: true, Limit: 10, Remaining: 0, Reset: time.Unix(1767323065, 0).Sub(t0)},
		},
		{
			name: "sluice httplimit headers",
			h:    hdr("X-RateLimit-Limit", "30", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "10"),
			req:  Window{Known: true, Limit: 30, Remaining: 0, Reset: 10 * time.Second},
		},
		{
			name: "garbage is ignored",
			h:    hdr("x-ratelimit-remaining-requests", "lots", "RateLimit", `"p";r=;t=x`),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ParseRateLimit(tc.h, t0)
			if got.Requests != tc.req || got.Tokens != tc.tok {
				t.Fatalf("ParseRateLimit:\n got  %+v\n want %+v", got, RateLimitInfo{Requests: tc.req, Tokens: tc.tok})
			}
		})
	}
}

func TestWindowWaitFor(t *testing.T) {
	lin := Window{Known: true, Limit: 10, Remaining: 0, Reset: 6 * time.Second, Linear: true}
	if got := lin.WaitFor(1); got != 600*time.Millisecond {
		t.Errorf("linear WaitFor(1) = %v, want 600ms", got)
	}
	if got := lin.WaitFor(5); got != 3*time.Second {
		t.Errorf("linear WaitFor(5) = %v, want 3s", got)
	}
	win := Window{Known: true, Limit: 10, Remaining: 0, Reset: 6 * time.Second}
	if got := win.WaitFor(1); got != 6*time.Second {
		t.Errorf("window WaitFor(1) = %v, want 6s", got)
	}
	if got := (Window{Known: true, Limit: 10, Remaining: 3, Reset: time.Second}).WaitFor(2); got != 0 {
		t.Errorf("WaitFor with room = %v, want 0", got)
	}
	if got := (Window{}).WaitFor(1); got != 0 {
		t.Errorf("unknown WaitFor = %v, want 0", got)
	}
}

func checkHint(t *testing.T, what string, d time.Duration) {
	t.Helper()
	if d < 0 || d > maxHint {
		t.Fatalf("%s = %v, outside [0, %v]", what, d, maxHint)
	}
}

// FuzzParseHeaders feeds arbitrary values to every header this package
// reads. The parsers must not panic and must keep durations in [0, 24h].
func FuzzParseHeaders(f *testing.F) {
	for _, s := range []string{
		"1500", "6m0s", "1d2h", "-1", "NaN", "Inf", "1e400", `"p";r=3;t=10`, `"a";r=1, "b";r=0;t=5`,
		"limit=10, remaining=3, reset=4", "Wed, 21 Oct 2015 07:28:00 GMT", "2026-01-02T03:04:06Z",
		`"x\";r=1", "y";r=-4;t=-9`, "100;w=60", ",,,;;;==", "9223372036854775807", "1767323065",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		h := http.Header{}
		for _, k := range []string{
			"Retry-After", "Retry-After-Ms", "X-Should-Retry", "Ratelimit", "Ratelimit-Policy",
			"Ratelimit-Limit", "Ratelimit-Remaining", "Ratelimit-Reset",
			"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset",
			"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests",
			"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens",
			"Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset",
			"Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset",
		} {
			h.Set(k, v)
		}
		d, _ := ParseRetryAfter(h, t0)
		checkHint(t, "ParseRetryAfter", d)
		d, _ = ParseResetDuration(v)
		checkHint(t, "ParseResetDuration", d)
		ParseShouldRetry(h)
		info := ParseRateLimit(h, t0)
		for _, w := range []Window{info.Requests, info.Tokens} {
			checkHint(t, "Reset", w.Reset)
			if w.Remaining < 0 || w.Limit < 0 {
				t.Fatalf("negative count in %+v", w)
			}
			for _, cost := range []int64{1, 1000, 1 << 40} {
				checkHint(t, "WaitFor", w.WaitFor(cost))
			}
		}
		var p pacer
		p.observe(info, t0.UnixNano(), 0, 100, d, true)
		if w, _, _ := p.reserve(t0.UnixNano(), 100); w < 0 || w > maxHint {
			t.Fatalf("pacer wait %v", w)
		}
	})
}
