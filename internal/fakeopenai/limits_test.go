package fakeopenai

import (
	"testing"
	"time"

	"github.com/sluice-io/sluice/clock"
)

// TestOwnLimits: the server admits its RPM and TPM buckets' worth, then
// answers 429 with OpenAI's headers, and refills continuously. A request
// counts 10 tokens: "hi" is 1 (2 characters / 4, rounded up), the message
// 4, and the completion 5 (no max_tokens), whatever PromptTokens says.
func TestOwnLimits(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	s := New(t, Options{RPM: 3, TPM: 100, Period: time.Second, Now: clk.Time, PromptTokens: 10, CompletionTokens: 5})
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	for i := range 3 {
		res := post(t, s.URL()+"/v1/chat/completions", "k", body)
		if res.StatusCode != 200 || res.Header.Get("x-ratelimit-remaining-requests") != []string{"2", "1", "0"}[i] ||
			res.Header.Get("x-ratelimit-limit-tokens") != "100" || res.Header.Get("x-ratelimit-remaining-tokens") != []string{"90", "80", "70"}[i] {
			t.Fatalf("request %d: status %d headers %v", i, res.StatusCode, res.Header)
		}
	}
	res := post(t, s.URL()+"/v1/chat/completions", "k", body)
	if res.StatusCode != 429 || res.Header.Get("Retry-After") != "1" || res.Header.Get("retry-after-ms") != "334" {
		t.Fatalf("over the limit: status %d headers %v", res.StatusCode, res.Header)
	}
	clk.Advance(time.Second / 3)
	clk.Advance(time.Millisecond)
	if res := post(t, s.URL()+"/v1/chat/completions", "k", body); res.StatusCode != 200 {
		t.Fatalf("after a third of the period: %d", res.StatusCode)
	}
	if s.Limited() != 1 || len(s.Accepted()) != 4 {
		t.Fatalf("limited %d accepted %d", s.Limited(), len(s.Accepted()))
	}
	// Tokens bind too: 15 per second, 10 a request.
	s2 := New(t, Options{RPM: 100, TPM: 15, Period: time.Second, Now: clk.Time, PromptTokens: 10, CompletionTokens: 5})
	if res := post(t, s2.URL()+"/v1/chat/completions", "k", body); res.StatusCode != 200 {
		t.Fatalf("first: %d", res.StatusCode)
	}
	if res := post(t, s2.URL()+"/v1/chat/completions", "k", body); res.StatusCode != 429 || res.Header.Get("retry-after-ms") != "334" {
		t.Fatalf("second: %d %v", res.StatusCode, res.Header)
	}
}

// TestWindows: Sliding frees a request a period after it arrived, Fixed at
// the window's end; both count max_tokens as OpenAI does (25 a request:
// 5 of prompt, 20 of max_tokens).
func TestWindows(t *testing.T) {
	body := `{"model":"m","max_tokens":20,"messages":[{"role":"user","content":"hi"}]}`
	for _, c := range []struct {
		w    Window
		back time.Duration // after the third request, when one fits again
	}{{Sliding, time.Second}, {Fixed, 500 * time.Millisecond}} {
		start := time.Unix(1_700_000_000, 0).Add(500 * time.Millisecond) // mid-window
		clk := clock.NewFake(start)
		s := New(t, Options{RPM: 3, TPM: 1000, Window: c.w, Period: time.Second, Now: clk.Time, PromptTokens: 10, CompletionTokens: 5})
		for i := range 3 {
			res := post(t, s.URL()+"/v1/chat/completions", "k", body)
			if res.StatusCode != 200 || res.Header.Get("x-ratelimit-remaining-tokens") != []string{"975", "950", "925"}[i] {
				t.Fatalf("window %d request %d: %d %v", c.w, i, res.StatusCode, res.Header)
			}
			clk.Advance(50 * time.Millisecond)
		}
		clk.Set(start.Add(c.back - time.Millisecond))
		if res := post(t, s.URL()+"/v1/chat/completions", "k", body); res.StatusCode != 429 {
			t.Fatalf("window %d: admitted before %s", c.w, c.back)
		}
		clk.Set(start.Add(c.back))
		if res := post(t, s.URL()+"/v1/chat/completions", "k", body); res.StatusCode != 200 {
			t.Fatalf("window %d: refused at %s: %d", c.w, c.back, res.StatusCode)
		}
	}
}
