package aiclient

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeanthropic"
)

func anthClient(t *testing.T, up *fakeanthropic.Server, ft *fakeTime, mod func(*Options)) *Client {
	t.Helper()
	return newClient(t, up.URL()+"/v1", ft, func(o *Options) {
		o.API = APIAnthropic
		if mod != nil {
			mod(o)
		}
	})
}

// TestAnthropicChat: API "anthropic" sends a Messages body (system apart,
// max_tokens always) with x-api-key and anthropic-version, and reads the
// answer's text and usage, cache tokens included.
func TestAnthropicChat(t *testing.T) {
	up := fakeanthropic.New(t, fakeanthropic.Options{APIKey: "sk-test", OutputTokens: 5, CacheReadInputTokens: 30, CacheCreationInputTokens: 4})
	c := anthClient(t, up, nil, func(o *Options) { o.DefaultCompletionTokens = 77 })
	req := &ChatRequest{Model: "claude-test", Messages: []Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "one two three"}},
		Params: map[string]json.RawMessage{"temperature": json.RawMessage("0.5"), "system": json.RawMessage(`"smuggled"`)}}
	res, err := c.Chat(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	r := res.Response
	if r.Text() != "tok tok tok tok tok " || r.Choices[0].FinishReason != "end_turn" || r.Choices[0].Message.Role != "assistant" {
		t.Fatalf("response %+v", r)
	}
	u := r.Usage
	// input: system 2 words, message 3 + 3 words (the fake's count).
	if u.PromptTokens != 8 || u.CompletionTokens != 5 || u.CacheReadInputTokens != 30 || u.CacheCreationInputTokens != 4 {
		t.Fatalf("usage %+v", u)
	}
	if got := u.Total(); got != 8+5+5+3 { // 4 writes at 1.25, 30 reads at 0.1
		t.Fatalf("total %d", got)
	}
	got := up.Requests()[0]
	if got.Path != "/v1/messages" || got.Header.Get("X-Api-Key") != "sk-test" || got.Header.Get("Authorization") != "" ||
		got.Header.Get("Anthropic-Version") != AnthropicVersion {
		t.Fatalf("request %s %v", got.Path, got.Header)
	}
	var body struct {
		Model       string            `json:"model"`
		MaxTokens   int64             `json:"max_tokens"`
		System      string            `json:"system"`
		Temperature float64           `json:"temperature"`
		Messages    []json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(got.Body, &body); err != nil {
		t.Fatal(err)
	}
	if body.MaxTokens != 77 || body.System != "be brief" || body.Temperature != 0.5 || len(body.Messages) != 1 ||
		string(body.Messages[0]) != `{"role":"user","content":"one two three"}` {
		t.Fatalf("body %s", got.Body)
	}
}

// TestAnthropicRetries: a 429 is retried after its retry-after and a 529
// overloaded_error with backoff; a 400 is not retried.
func TestAnthropicRetries(t *testing.T) {
	up := fakeanthropic.New(t, fakeanthropic.Options{})
	up.Enqueue(fakeanthropic.Fault{Status: 429, RetryAfter: "2"}, fakeanthropic.Fault{Status: 529})
	ft := newFakeTime()
	c := anthClient(t, up, ft, nil)
	res, err := c.Chat(context.Background(), &ChatRequest{Model: "m", Messages: []Message{{Role: "user", Content: "hi"}}})
	if err != nil || res.Attempts != 3 {
		t.Fatalf("attempts %d, %v", res.Attempts, err)
	}
	if s := ft.slept(); len(s) < 2 || s[0] < 2*time.Second || s[0] > 2*time.Second+c.opts.BaseDelay/2 {
		t.Fatalf("sleeps %v, want 2s (+ jitter) first", s)
	}
	up.Enqueue(fakeanthropic.Fault{Status: 400})
	res, err = c.Chat(context.Background(), &ChatRequest{Model: "m", Messages: []Message{{Role: "user", Content: "hi"}}})
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Type != "invalid_request_error" || res.Attempts != 1 {
		t.Fatalf("attempts %d, %v", res.Attempts, err)
	}
}

// TestAnthropicPacing: after Anthropic's headers report no requests left
// (10 per minute... full again in 6s, an RFC 3339 time), the next call
// waits before it is sent, as for OpenAI's headers.
func TestAnthropicPacing(t *testing.T) {
	reset := t0.Add(6 * time.Second).Format(time.RFC3339)
	up := fakeanthropic.New(t, fakeanthropic.Options{Default: fakeanthropic.Fault{Header: hdr(
		"anthropic-ratelimit-requests-limit", "10", "anthropic-ratelimit-requests-remaining", "0", "anthropic-ratelimit-requests-reset", reset)}})
	ft := newFakeTime()
	c := anthClient(t, up, ft, nil)
	for range 2 {
		if _, err := c.Chat(context.Background(), &ChatRequest{Model: "m", Messages: []Message{{Role: "user", Content: "hi"}}}); err != nil {
			t.Fatal(err)
		}
	}
	if got := ft.slept(); len(got) != 1 || got[0] != 600*time.Millisecond {
		t.Fatalf("sleeps %v, want [600ms]", got)
	}
}

// TestAnthropicTokensReconciled: the token limiter is settled at the
// weighted usage, cache reads and writes included.
func TestAnthropicTokensReconciled(t *testing.T) {
	ft := newFakeTime()
	tokens := ft.limiter(t, sluice.PerMinute(10000))
	up := fakeanthropic.New(t, fakeanthropic.Options{OutputTokens: 5, CacheReadInputTokens: 100, CacheCreationInputTokens: 8})
	c := anthClient(t, up, ft, func(o *Options) { o.Tokens = tokens; o.LimitKey = "tenant" })
	res, err := c.Chat(context.Background(), &ChatRequest{Model: "m", Messages: []Message{{Role: "user", Content: "one two"}}, MaxTokens: 500})
	if err != nil {
		t.Fatal(err)
	}
	d, err := tokens.Peek(context.Background(), "tenant", 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(10000 - (5 + 5 + 10 + 10)); d.Remaining != want || res.Response.Usage.Total() != 30 {
		t.Fatalf("remaining %d, want %d (usage %+v)", d.Remaining, want, res.Response.Usage)
	}
}

func TestAnthropicNewValidates(t *testing.T) {
	if _, err := New(Options{BaseURL: "http://x", API: "gemini"}); err == nil {
		t.Fatal("unknown API accepted")
	}
}
