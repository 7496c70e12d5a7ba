package aiclient

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/memstore"
)

// fakeTime is a fake clock with a Sleep that advances it and records
// every wait, so that tests of waiting take no wall time.
type fakeTime struct {
	clk    *clock.Fake
	mu     sync.Mutex
	sleeps []time.Duration
}

func newFakeTime() *fakeTime { return &fakeTime{clk: clock.NewFake(t0)} }

// limiter returns a Limiter of l on a memory store on f's clock, sleeping
// on f.
func (f *fakeTime) limiter(t *testing.T, l sluice.Limit) *sluice.Limiter {
	t.Helper()
	store, err := memstore.New(memstore.Options{Clock: f.clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	lim, err := sluice.NewLimiter(sluice.Options{Store: store, Limit: l, Sleep: f.sleep})
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

func (f *fakeTime) sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	f.mu.Lock()
	f.sleeps = append(f.sleeps, d)
	f.mu.Unlock()
	f.clk.Advance(d)
	return nil
}

func (f *fakeTime) slept() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.sleeps...)
}

func newClient(t *testing.T, baseURL string, ft *fakeTime, mod func(*Options)) *Client {
	t.Helper()
	opts := Options{BaseURL: baseURL, APIKey: "sk-test", Rand: func() float64 { return 0.5 }}
	if ft != nil {
		opts.Clock, opts.Sleep = ft.clk, ft.sleep
	}
	if mod != nil {
		mod(&opts)
	}
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func userReq(text string) *ChatRequest {
	return &ChatRequest{Model: "gpt-4o-mini", Messages: []Message{{Role: "user", Content: text}}}
}

func TestChatSuccess(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: "sk-test"})
	c := newClient(t, up.BaseURL(), nil, nil)
	res, err := c.Chat(context.Background(), userReq("hello there"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Attempts != 1 || res.Response.Text() != "tok tok tok tok tok tok tok tok " {
		t.Fatalf("attempts %d, text %q", res.Attempts, res.Response.Text())
	}
	if u := res.Response.Usage; u.CompletionTokens != 8 || u.Total() != u.PromptTokens+8 {
		t.Fatalf("usage %+v", u)
	}
	if got := up.Requests()[0].Path; got != "/v1/chat/completions" {
		t.Fatalf("path %q", got)
	}
}

// TestRetryAfterMs: a 429 with retry-after-ms: 1500 is retried no sooner
// than 1.5 s later, on the fake clock.
func TestRetryAfterMs(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	up.Enqueue(fakeopenai.Fault{Status: 429, RetryAfterMS: "1500", RetryAfter: "1"})
	ft := newFakeTime()
	for _, r := range []float64{0, 0.999} {
		c := newClient(t, up.BaseURL(), ft, func(o *Options) { o.Rand = func() float64 { return r } })
		start := ft.clk.Now()
		var retries []time.Duration
		res, err := c.ChatWith(context.Background(), userReq("hi"), CallOptions{OnRetry: func(_ int, _ error, d time.Duration) { retries = append(retries, d) }})
		if err != nil {
			t.Fatal(err)
		}
		elapsed := time.Duration(ft.clk.Now() - start)
		if r == 0 && (res.Attempts != 2 || len(retries) != 1) {
			t.Fatalf("attempts %d, retries %v", res.Attempts, retries)
		}
		if r == 0 && (elapsed < 1500*time.Millisecond || elapsed > 1500*time.Millisecond+c.opts.BaseDelay/2) {
			t.Fatalf("retried after %v of fake time, want 1.5s (+ jitter)", elapsed)
		}
		up.Enqueue(fakeopenai.Fault{Status: 429, RetryAfterMS: "1500"})
	}
}

// TestRetryAfterMsWallClock measures the same at the fake upstream, with
// real time.
func TestRetryAfterMsWallClock(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	up.Enqueue(fakeopenai.Fault{Status: 429, RetryAfterMS: "1500"})
	c := newClient(t, up.BaseURL(), nil, nil)
	if _, err := c.Chat(context.Background(), userReq("hi")); err != nil {
		t.Fatal(err)
	}
	reqs := up.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want 2", len(reqs))
	}
	if gap := reqs[1].Time.Sub(reqs[0].Time); gap < 1500*time.Millisecond {
		t.Fatalf("retried after %v, want >= 1.5s", gap)
	}
}

func TestRetryAfterSecondsAndDate(t *testing.T) {
	ft := newFakeTime()
	up := fakeopenai.New(t, fakeopenai.Options{})
	up.Enqueue(
		fakeopenai.Fault{Status: 503, RetryAfter: "3"},
		fakeopenai.Fault{Status: 429, RetryAfter: ft.clk.Time().Add(3*time.Second + 10*time.Second).UTC().Format(http.TimeFormat)},
	)
	c := newClient(t, up.BaseURL(), ft, func(o *Options) { o.Rand = func() float64 { return 0 } })
	res, err := c.Chat(context.Background(), userReq("hi"))
	if err != nil {
		t.Fatal(err)
	}
	// 3s, then the date 13s after the start, which is 10s after the retry.
	got := ft.slept()
	if res.Attempts != 3 || len(got) != 2 || got[0] != 3*time.Second || got[1] != 10*time.Second {
		t.Fatalf("attempts %d, sleeps %v; want 3 attempts after [3s 10s]", res.Attempts, got)
	}
}

func TestRetriesServerErrorsAndTimeouts(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	up.Enqueue(
		fakeopenai.Fault{Status: 500},
		fakeopenai.Fault{Status: 408},
		fakeopenai.Fault{Status: 409},
		fakeopenai.Fault{Delay: time.Minute}, // times out
		fakeopenai.Fault{Status: 429},        // no hint: full jitter
	)
	ft := newFakeTime()
	c := newClient(t, up.BaseURL(), ft, func(o *Options) { o.AttemptTimeout = 200 * time.Millisecond })
	var retries int
	res, err := c.ChatWith(context.Background(), userReq("hi"), CallOptions{OnRetry: func(int, error, time.Duration) { retries++ }})
	if err != nil {
		t.Fatal(err)
	}
	if res.Attempts != 6 || retries != 5 || up.Count() != 6 {
		t.Fatalf("attempts %d, retries %d, upstream %d; want 6, 5, 6", res.Attempts, retries, up.Count())
	}
	// Full jitter with rand 0.5: half of 500ms, 1s, 2s, 4s, 8s.
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second}
	got := ft.slept()
	if len(got) != len(want) {
		t.Fatalf("sleeps %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("sleeps %v, want %v", got, want)
		}
	}
}

func TestMaxRetries(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{Default: fakeopenai.Fault{Status: 502}})
	c := newClient(t, up.BaseURL(), newFakeTime(), func(o *Options) { o.MaxRetries = 3 })
	res, err := c.Chat(context.Background(), userReq("hi"))
	var apiErr *APIError
	if !errors.Is(err, ErrRetriesExhausted) || !errors.As(err, &apiErr) || apiErr.StatusCode != 502 {
		t.Fatalf("err = %v", err)
	}
	if res.Attempts != 4 || up.Count() != 4 {
		t.Fatalf("attempts %d, upstream %d; want 4", res.Attempts, up.Count())
	}
	c = newClient(t, up.BaseURL(), newFakeTime(), func(o *Options) { o.MaxRetries = NoRetries })
	if res, _ := c.Chat(context.Background(), userReq("hi")); res.Attempts != 1 {
		t.Fatalf("NoRetries: %d attempts", res.Attempts)
	}
}

// errorServer answers every request with status, headers and body, and
// counts the requests.
func errorServer(t *testing.T, status int, h http.Header, body string) (*httptest.Server, *int) {
	var mu sync.Mutex
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		mu.Unlock()
		for k, v := range h {
			w.Header()[k] = v
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func TestNoRetryWhenHopeless(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		h      http.Header
		body   string
		is     error
	}{
		{"insufficient quota", 429, hdr("Retry-After", "1"), `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}`, ErrInsufficientQuota},
		{"request too large", 429, hdr("retry-after-ms", "20"), `{"error":{"message":"Request too large for gpt-4o on tokens per min (TPM): Limit 10000, Requested 12000.","type":"tokens","code":"rate_limit_exceeded"}}`, ErrRequestTooLarge},
		{"413", 413, nil, `too big`, ErrRequestTooLarge},
		{"context length", 400, nil, `{"error":{"message":"too long","code":"context_length_exceeded"}}`, ErrRequestTooLarge},
		{"quota overrides x-should-retry", 429, hdr("x-should-retry", "true"), `{"error":{"type":"insufficient_quota"}}`, ErrInsufficientQuota},
		{"x-should-retry false", 500, hdr("x-should-retry", "false"), `{"error":{"message":"no"}}`, nil},
		{"400", 400, nil, `{"error":{"message":"bad"}}`, nil},
		{"401", 401, nil, `{"error":{"message":"key"}}`, nil},
		{"error body with status 200", 200, nil, `{"error":{"message":"model not found","code":"model_not_found"}}`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, n := errorServer(t, tc.status, tc.h, tc.body)
			c := newClient(t, srv.URL, newFakeTime(), nil)
			res, err := c.Chat(context.Background(), userReq("hi"))
			var apiErr *APIError
			if !errors.As(err, &apiErr) || apiErr.StatusCode != tc.status {
				t.Fatalf("err = %v, want an APIError %d", err, tc.status)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("err = %v, want %v", err, tc.is)
			}
			if res.Attempts != 1 || *n != 1 {
				t.Fatalf("attempts %d, upstream %d; want 1", res.Attempts, *n)
			}
		})
	}
}

func TestXShouldRetryTrue(t *testing.T) {
	srv, n := errorServer(t, 400, hdr("x-should-retry", "true"), `{"error":{"message":"try again"}}`)
	c := newClient(t, srv.URL, newFakeTime(), func(o *Options) { o.MaxRetries = 2 })
	res, err := c.Chat(context.Background(), userReq("hi"))
	if !errors.Is(err, ErrRetriesExhausted) || res.Attempts != 3 || *n != 3 {
		t.Fatalf("err %v, attempts %d, upstream %d", err, res.Attempts, *n)
	}
}

func TestRetryAfterTooLong(t *testing.T) {
	srv, n := errorServer(t, 429, hdr("Retry-After", "3600"), `{}`)
	c := newClient(t, srv.URL, newFakeTime(), nil)
	if _, err := c.Chat(context.Background(), userReq("hi")); !errors.Is(err, ErrRetryTooLong) || *n != 1 {
		t.Fatalf("err %v, upstream %d", err, *n)
	}
}

// signalServer blocks every request until the test ends, and reports each
// arrival on a channel.
func signalServer(t *testing.T) (*httptest.Server, chan struct{}) {
	arrived := make(chan struct{}, 16)
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-done:
		}
	}))
	t.Cleanup(func() { close(done); srv.Close() })
	return srv, arrived
}

func TestCancelStopsInFlight(t *testing.T) {
	srv, arrived := signalServer(t)
	c := newClient(t, srv.URL, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Chat(ctx, userReq("hi"))
		errc <- err
	}()
	<-arrived
	start := time.Now()
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("took %v to stop", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Chat did not return after cancel")
	}
}

func TestCancelStopsBackoff(t *testing.T) {
	srv, n := errorServer(t, 429, hdr("Retry-After", "120"), `{}`)
	c := newClient(t, srv.URL, nil, nil) // real timer sleep
	ctx, cancel := context.WithCancel(context.Background())
	_, err := c.ChatWith(ctx, userReq("hi"), CallOptions{OnRetry: func(int, error, time.Duration) { cancel() }})
	if !errors.Is(err, context.Canceled) || *n != 1 {
		t.Fatalf("err %v, upstream %d", err, *n)
	}
}

func TestStopKeepsInFlightButLaunchesNothing(t *testing.T) {
	srv, n := errorServer(t, 503, nil, `{}`)
	c := newClient(t, srv.URL, nil, nil)
	stop := make(chan struct{})
	_, err := c.ChatWith(context.Background(), userReq("hi"), CallOptions{Stop: stop, OnRetry: func(int, error, time.Duration) { close(stop) }})
	if !errors.Is(err, ErrStopped) || *n != 1 {
		t.Fatalf("err %v, upstream %d; want ErrStopped after 1", err, *n)
	}
	// Stopped before the first attempt: nothing is sent.
	if _, err := c.ChatWith(context.Background(), userReq("hi"), CallOptions{Stop: stop}); !errors.Is(err, ErrStopped) || *n != 1 {
		t.Fatalf("err %v, upstream %d", err, *n)
	}
}

// TestLimiterPaces: with 2 requests/s and a burst of 1, five calls take
// 2 s of (fake) time; the limiter waits rather than fails.
func TestLimiterPaces(t *testing.T) {
	ft := newFakeTime()
	reqs := ft.limiter(t, sluice.Limit{Rate: 2, Period: time.Second, Burst: 1})
	up := fakeopenai.New(t, fakeopenai.Options{})
	c := newClient(t, up.BaseURL(), ft, func(o *Options) { o.Requests = reqs })
	start := ft.clk.Now()
	for range 5 {
		if _, err := c.Chat(context.Background(), userReq("hi")); err != nil {
			t.Fatal(err)
		}
	}
	if got := time.Duration(ft.clk.Now() - start); got != 2*time.Second {
		t.Fatalf("5 calls at 2/s burst 1 took %v of fake time, want 2s", got)
	}
	if up.Count() != 5 {
		t.Fatalf("upstream saw %d", up.Count())
	}
}

// TestTokensReconciled: the estimate is charged before the call, and the
// limiter ends up charged with exactly the usage the server reported.
func TestTokensReconciled(t *testing.T) {
	ft := newFakeTime()
	tokens := ft.limiter(t, sluice.PerMinute(10000))
	up := fakeopenai.New(t, fakeopenai.Options{CompletionTokens: 5})
	c := newClient(t, up.BaseURL(), ft, func(o *Options) { o.Tokens = tokens; o.LimitKey = "tenant" })
	remaining := func() int64 {
		d, err := tokens.Peek(context.Background(), "tenant", 0)
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}
	var used int64
	for _, req := range []*ChatRequest{
		{Model: "m", Messages: []Message{{Role: "user", Content: "one two three"}}, MaxTokens: 1000}, // estimate above usage: refund
		{Model: "m", Messages: []Message{{Role: "user", Content: "x"}}, MaxTokens: 1},                // estimate below usage: charge
	} {
		res, err := c.Chat(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		used += res.Response.Usage.Total()
		if got := remaining(); got != 10000-used {
			t.Fatalf("after usage %d (estimate %d): remaining %d, want %d", res.Response.Usage.Total(), res.EstimatedTokens, got, 10000-used)
		}
	}
	// A failed attempt gives its estimate back.
	up.Enqueue(fakeopenai.Fault{Status: 400})
	if _, err := c.Chat(context.Background(), userReq("hi")); err == nil {
		t.Fatal("want an error")
	}
	if got := remaining(); got != 10000-used {
		t.Fatalf("after a 400: remaining %d, want %d", got, 10000-used)
	}
}

// TestPacerSlowsBeforeRejection: after the server reports no requests left
// (OpenAI headers, 10 per 6s, linear refill), the next call waits 600ms
// before it is sent.
func TestPacerSlowsBeforeRejection(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{Default: fakeopenai.Fault{Header: hdr(
		"x-ratelimit-limit-requests", "10", "x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "6s")}})
	ft := newFakeTime()
	c := newClient(t, up.BaseURL(), ft, nil)
	for range 2 {
		if _, err := c.Chat(context.Background(), userReq("hi")); err != nil {
			t.Fatal(err)
		}
	}
	if got := ft.slept(); len(got) != 1 || got[0] != 600*time.Millisecond {
		t.Fatalf("sleeps %v, want [600ms]", got)
	}
}

func TestNewValidates(t *testing.T) {
	for _, u := range []string{"", "api.openai.com", "ftp://x", "http://"} {
		if _, err := New(Options{BaseURL: u}); err == nil {
			t.Errorf("New(%q) succeeded", u)
		}
	}
}

// TestNoUsageKeepsEstimate: an OpenAI-compatible server that reports no
// usage leaves the estimate charged rather than refunding it all.
func TestNoUsageKeepsEstimate(t *testing.T) {
	ft := newFakeTime()
	tokens := ft.limiter(t, sluice.PerMinute(10000))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
	}))
	t.Cleanup(srv.Close)
	c := newClient(t, srv.URL+"/v1/", ft, func(o *Options) { o.Tokens = tokens; o.LimitKey = "tenant" })
	res, err := c.Chat(context.Background(), &ChatRequest{Model: "m", Messages: []Message{{Role: "user", Content: "hello"}}, MaxTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	d, err := tokens.Peek(context.Background(), "tenant", 0)
	if err != nil {
		t.Fatal(err)
	}
	if d.Remaining != 10000-res.EstimatedTokens {
		t.Fatalf("remaining %d, want %d: the estimate of a call without usage was refunded", d.Remaining, 10000-res.EstimatedTokens)
	}
}
