package aiclient

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
)

// TestRedirectToAnotherOriginRefused: an upstream that redirects the call
// to another origin (here another port of the same host, which net/http
// treats as the same domain) gets neither the API key, in either API's
// header, nor the prompt; the call fails at once with ErrRedirect, not
// retried.
func TestRedirectToAnotherOriginRefused(t *testing.T) {
	var mu sync.Mutex
	var leaked []string
	thief := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		leaked = append(leaked, r.Header.Get("Authorization")+"|"+r.Header.Get("X-Api-Key")+"|"+r.Header.Get("Api-Key")+"|"+string(body))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"role":"assistant","content":"stolen"}}]}`)
	}))
	t.Cleanup(thief.Close)
	for _, api := range []string{APIOpenAI, APIAnthropic} {
		for _, status := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect, http.StatusFound} {
			srv, n := errorServer(t, status, hdr("Location", thief.URL+"/v1/chat/completions"), ``)
			c := newClient(t, srv.URL, newFakeTime(), func(o *Options) {
				o.API = api
				o.Header = http.Header{"Api-Key": {"sk-azure-secret"}}
			})
			res, err := c.Chat(context.Background(), userReq("secret prompt"))
			if !errors.Is(err, ErrRedirect) {
				t.Errorf("%s %d: err = %v, want ErrRedirect", api, status, err)
			}
			if res.Attempts != 1 || *n != 1 {
				t.Errorf("%s %d: attempts %d, upstream %d; want 1 (not retried)", api, status, res.Attempts, *n)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(leaked) > 0 {
		t.Fatalf("the other origin received %d requests, such as %q", len(leaked), leaked[0])
	}
}

// TestRedirectSameOriginFollowed: a redirect within the base URL's origin
// (a moved path) is followed as before, key included.
func TestRedirectSameOriginFollowed(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/old/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/new/chat/completions", http.StatusPermanentRedirect)
	})
	var auth string
	mux.HandleFunc("/new/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		auth = r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"role":"assistant","content":"moved"}}]}`)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c := newClient(t, srv.URL+"/old", newFakeTime(), func(o *Options) { o.HTTPClient = &http.Client{} })
	res, err := c.Chat(context.Background(), userReq("hi"))
	if err != nil || res.Response.Text() != "moved" || auth != "Bearer sk-test" {
		t.Fatalf("err %v, auth %q", err, auth)
	}
}

// TestAbsurdUsageBounded: a server that reports a usage no request can
// have (a broken proxy summing every call, a unit mix-up) puts the shared
// token limiter at most one burst beyond the request's estimate into debt.
// Before, 1e12 tokens locked every process sharing the key out for 190
// years, and 1e15 overflowed the limiter's state, which wiped the key's
// debt. The usage is still reported as the server sent it.
func TestAbsurdUsageBounded(t *testing.T) {
	for _, usage := range []string{
		`{"prompt_tokens":5,"completion_tokens":5,"total_tokens":1000000000000}`,
		`{"prompt_tokens":5,"completion_tokens":5,"total_tokens":1000000000000000}`,
		`{"prompt_tokens":4611686018427387904,"completion_tokens":1}`,
	} {
		ft := newFakeTime()
		tokens := ft.limiter(t, sluice.PerMinute(10000))
		srv, _ := errorServer(t, 200, nil, `{"choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":`+usage+`}`)
		c := newClient(t, srv.URL, ft, func(o *Options) { o.Tokens = tokens; o.LimitKey = "tenant" })
		res, err := c.Chat(context.Background(), &ChatRequest{Model: "m", Messages: []Message{{Role: "user", Content: "hello"}}, MaxTokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		if res.Response.Usage.Total() < 1e12 {
			t.Fatalf("usage %+v: the server's figures should be reported as sent", res.Response.Usage)
		}
		d, err := tokens.Peek(context.Background(), "tenant", 0)
		if err != nil {
			t.Fatal(err)
		}
		// Debt bound: the estimate beyond what was charged, plus one burst
		// (10000 tokens, a minute at this rate).
		if maxWait := time.Duration(res.EstimatedTokens+10000) * time.Minute / 10000; d.ResetAfter <= 0 || d.ResetAfter > maxWait {
			t.Errorf("usage %s: the token limiter is full again after %s, want in (0, %s]", usage, d.ResetAfter, maxWait)
		}
	}
}

// TestEmptySuccessIsAFailure: a 2xx whose body has no completion at all
// (no choices; for Anthropic, no content) is retried like an unreadable
// body and ends as an error, rather than as an empty answer that a batch
// would record as done and never ask again.
func TestEmptySuccessIsAFailure(t *testing.T) {
	for _, tc := range []struct{ api, body string }{
		{APIOpenAI, `{}`},
		{APIOpenAI, `{"id":"x","object":"chat.completion","choices":[]}`},
		{APIOpenAI, `{"object":"list","data":[]}`},
		{APIOpenAI, `null`},
		{APIAnthropic, `{}`},
		{APIAnthropic, `{"id":"msg_1","model":"claude","usage":{"input_tokens":3}}`},
	} {
		srv, n := errorServer(t, 200, nil, tc.body)
		c := newClient(t, srv.URL, newFakeTime(), func(o *Options) { o.API = tc.api; o.MaxRetries = 2 })
		res, err := c.Chat(context.Background(), userReq("hi"))
		if !errors.Is(err, ErrRetriesExhausted) || res.Response != nil || *n != 3 {
			t.Errorf("%s %s: err %v, response %v, upstream %d; want retries exhausted after 3", tc.api, tc.body, err, res.Response, *n)
		}
	}
	// An empty text is an answer: Anthropic's content [] and OpenAI's null
	// content (a refusal, a tool call) stay successes.
	for _, tc := range []struct{ api, body string }{
		{APIOpenAI, `{"choices":[{"index":0,"message":{"role":"assistant","content":null},"finish_reason":"content_filter"}]}`},
		{APIAnthropic, `{"type":"message","content":[],"stop_reason":"end_turn"}`},
	} {
		srv, _ := errorServer(t, 200, nil, tc.body)
		c := newClient(t, srv.URL, newFakeTime(), func(o *Options) { o.API = tc.api })
		if _, err := c.Chat(context.Background(), userReq("hi")); err != nil {
			t.Errorf("%s %s: %v", tc.api, tc.body, err)
		}
	}
}

// TestHeaderWaitBeyondMaxRetryAfterFails: a 200 whose rate-limit headers
// say nothing is left until a reset a day away (x-ratelimit-limit-requests
// 0, reset "1000000h"; or an IETF policy with r=0) made every later call
// sleep a day, silently. A wait the headers imply beyond MaxRetryAfter now
// ends the call with ErrRetryTooLong, nothing sent, as a Retry-After that
// long does; a shorter one is still waited.
func TestHeaderWaitBeyondMaxRetryAfterFails(t *testing.T) {
	for _, h := range []http.Header{
		hdr("x-ratelimit-limit-requests", "0", "x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "1000000h"),
		hdr("x-ratelimit-limit-requests", "-5", "x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "99999999999999999999999s"),
		hdr("x-ratelimit-limit-tokens", "1", "x-ratelimit-remaining-tokens", "0", "x-ratelimit-reset-tokens", "20h"),
		hdr("RateLimit", `"day";r=0;t=86400`, "RateLimit-Policy", `"day";q=100;w=86400`),
	} {
		srv, n := errorServer(t, 200, h, `{"choices":[{"message":{"role":"assistant","content":"hi"}}]}`)
		ft := newFakeTime()
		c := newClient(t, srv.URL, ft, nil)
		if _, err := c.Chat(context.Background(), userReq("hi")); err != nil {
			t.Fatal(err)
		}
		res, err := c.Chat(context.Background(), userReq("hi"))
		if !errors.Is(err, ErrRetryTooLong) || res.Attempts != 0 || *n != 1 {
			t.Errorf("%v: err %v, attempts %d, upstream %d; want ErrRetryTooLong before sending", h, err, res.Attempts, *n)
		}
		if got := ft.slept(); len(got) > 0 {
			t.Errorf("%v: slept %v", h, got)
		}
	}
	srv, n := errorServer(t, 200, hdr("x-ratelimit-limit-requests", "0", "x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "4m"), `{"choices":[{"message":{"role":"assistant","content":"hi"}}]}`)
	ft := newFakeTime()
	c := newClient(t, srv.URL, ft, nil)
	for range 2 {
		if _, err := c.Chat(context.Background(), userReq("hi")); err != nil {
			t.Fatal(err)
		}
	}
	if got := ft.slept(); *n != 2 || len(got) != 1 || got[0] != 4*time.Minute {
		t.Fatalf("4m reset: upstream %d, slept %v; want one 4m wait", *n, got)
	}
}

// TestRetryAfterTooLongHoldsTheClient: a 429 asking for an hour (a daily
// quota spent) fails its call with ErrRetryTooLong; before, every other
// call of the client was still sent and got its own 429 (a batch sent one
// request per prompt left, within seconds, to a server that had said to
// come back in an hour). Now the calls until then fail the same way,
// unsent, and after the hour they go out again.
func TestRetryAfterTooLongHoldsTheClient(t *testing.T) {
	srv, n := errorServer(t, 429, hdr("Retry-After", "3600"), `{"error":{"message":"daily limit","type":"requests","code":"rate_limit_exceeded"}}`)
	ft := newFakeTime()
	c := newClient(t, srv.URL, ft, nil)
	if _, err := c.Chat(context.Background(), userReq("hi")); !errors.Is(err, ErrRetryTooLong) || *n != 1 {
		t.Fatalf("first: err %v, upstream %d", err, *n)
	}
	for range 3 {
		res, err := c.Chat(context.Background(), userReq("hi"))
		if !errors.Is(err, ErrRetryTooLong) || res.Attempts != 0 || *n != 1 {
			t.Fatalf("within the hour: err %v, attempts %d, upstream %d; want ErrRetryTooLong, unsent", err, res.Attempts, *n)
		}
	}
	ft.clk.Advance(time.Hour)
	if _, err := c.Chat(context.Background(), userReq("hi")); !errors.Is(err, ErrRetryTooLong) || *n != 2 {
		t.Fatalf("after the hour: err %v, upstream %d; want it sent again", err, *n)
	}
	if got := ft.slept(); len(got) > 0 {
		t.Fatalf("slept %v", got)
	}
}

// TestHeaderFloodBounded: a RateLimit field of 100,000 items (some 800 KB,
// well under net/http's 10 MB of response headers) cost a map per item,
// and a full-size one half a second of CPU and hundreds of MB per
// response. Only the first items, past the policies kept, are read now.
func TestHeaderFloodBounded(t *testing.T) {
	h := http.Header{
		"Ratelimit":        {strings.Repeat(`"p";r=1,`, 100_000)},
		"Ratelimit-Policy": {strings.Repeat(`"p";q=1;w=1,`, 100_000)},
	}
	now := time.Now()
	var info RateLimitInfo
	allocs := testing.AllocsPerRun(1, func() { info = ParseRateLimit(h, now) })
	if len(info.Policies) != maxPolicies || !info.Requests.Known {
		t.Fatalf("policies %d, requests %+v", len(info.Policies), info.Requests)
	}
	if allocs > 5000 {
		t.Fatalf("%v allocations for one response's headers", allocs)
	}
}

// TestHugeMaxTokensStillWaits: a request with max_tokens near the int64
// limit (a JSONL line's "max_tokens": 9223372036854775807) overflowed its
// estimate to a negative number, which skipped the wait on the token
// limiter: every such call went out however spent the shared budget was.
func TestHugeMaxTokensStillWaits(t *testing.T) {
	ft := newFakeTime()
	tokens := ft.limiter(t, sluice.PerMinute(10000))
	if _, err := tokens.Charge(context.Background(), "tenant", 10000); err != nil { // spent
		t.Fatal(err)
	}
	srv, _ := errorServer(t, 200, nil, `{"choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":5,"total_tokens":10}}`)
	c := newClient(t, srv.URL, ft, func(o *Options) { o.Tokens = tokens; o.LimitKey = "tenant" })
	res, err := c.Chat(context.Background(), &ChatRequest{Model: "m", Messages: []Message{{Role: "user", Content: "hello"}}, MaxTokens: math.MaxInt64})
	if err != nil {
		t.Fatal(err)
	}
	if res.EstimatedTokens <= 0 || len(ft.slept()) == 0 {
		t.Fatalf("estimate %d, slept %v: the call did not wait for the spent token limit", res.EstimatedTokens, ft.slept())
	}
}

// TestToolCallsKept: a response's tool calls and refusal, which the
// message's text does not carry, are kept (they were dropped, and a batch
// recorded an empty answer as done).
func TestToolCallsKept(t *testing.T) {
	for _, tc := range []struct{ api, body, want string }{
		{APIOpenAI, `{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`, `[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]`},
		{APIAnthropic, `{"type":"message","content":[{"type":"text","text":"let me check"},{"type":"tool_use","id":"t1","name":"f","input":{"q":1}}],"stop_reason":"tool_use"}`, `[{"type":"tool_use","id":"t1","name":"f","input":{"q":1}}]`},
	} {
		srv, _ := errorServer(t, 200, nil, tc.body)
		c := newClient(t, srv.URL, newFakeTime(), func(o *Options) { o.API = tc.api })
		res, err := c.Chat(context.Background(), userReq("hi"))
		if err != nil {
			t.Fatal(err)
		}
		if got := string(res.Response.Choices[0].Message.ToolCalls); got != tc.want {
			t.Errorf("%s: tool calls %s, want %s", tc.api, got, tc.want)
		}
	}
	srv, _ := errorServer(t, 200, nil, `{"choices":[{"message":{"role":"assistant","content":null,"refusal":"no"}}]}`)
	res, err := newClient(t, srv.URL, newFakeTime(), nil).Chat(context.Background(), userReq("hi"))
	if err != nil || res.Response.Choices[0].Message.Refusal != "no" {
		t.Fatalf("refusal: %v %+v", err, res)
	}
}
