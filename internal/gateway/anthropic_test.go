package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/aitoken"
	"github.com/sluice-io/sluice/internal/fakeanthropic"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/redisstore"
)

// anthEnv is a gateway in front of a fake Anthropic upstream, over real
// sockets.
type anthEnv struct {
	t       *testing.T
	up      *fakeanthropic.Server
	gw      *Gateway
	srv     *httptest.Server
	store   sluice.Store
	cfg     *Config
	client  string
	settled chan Settlement
}

// newAnthEnv starts a gateway (upstream.api: anthropic) whose one key has
// tier "t" with limits l, on store st (a memory store on a fake clock
// that only the test moves when st is nil).
func newAnthEnv(t *testing.T, l Limits, up *fakeanthropic.Server, st sluice.Store, client string) *anthEnv {
	t.Helper()
	if st == nil {
		clk := clock.NewFake(time.Unix(1_700_000_000, 0))
		ms, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ms.Close() })
		st = ms
	}
	cfg := &Config{
		Upstream: UpstreamConfig{BaseURL: up.URL() + "/v1", API: APIAnthropic},
		Models:   []string{"claude-test"},
		Store:    StoreConfig{Timeout: 5 * time.Second},
		Tiers:    map[string]TierConfig{"t": Tier(l)},
		Keys:     []KeyConfig{{Name: "test", Hash: sluice.HashKey(clientKey), Tier: "t", Client: client}},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	e := &anthEnv{t: t, up: up, store: st, cfg: cfg, client: cfg.Keys[0].Client, settled: make(chan Settlement, 1000)}
	e.gw, e.srv, _ = startGateway(t, cfg, st, func(k string) string { return map[string]string{DefaultAnthropicKeyEnv: upstreamKey}[k] }, func(s Settlement) { e.settled <- s })
	return e
}

func (e *anthEnv) post(ctx context.Context, path, key, body string) *http.Response {
	e.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("x-api-key", key)
	}
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("content-type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { res.Body.Close() })
	return res
}

func (e *anthEnv) settle() Settlement {
	e.t.Helper()
	select {
	case s := <-e.settled:
		return s
	case <-time.After(10 * time.Second):
		e.t.Fatal("no settlement within 10s")
	}
	return Settlement{}
}

func (e *anthEnv) tpmRemaining() int64 {
	e.t.Helper()
	tc := e.cfg.Tiers["t"]
	d, err := e.store.Apply(context.Background(), sluice.OpPeek, sluice.Request{Key: "{gw:" + e.client + "}:tpm",
		Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: tc.TPM, Period: time.Minute, Burst: tc.TPMBurst}})
	if err != nil {
		e.t.Fatal(err)
	}
	return d.Remaining
}

// anthError is Anthropic's error body.
type anthError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func decodeAnthError(t *testing.T, res *http.Response) anthError {
	t.Helper()
	var ae anthError
	b, _ := io.ReadAll(res.Body)
	if err := json.Unmarshal(b, &ae); err != nil || ae.Type != "error" || ae.Error.Type == "" || ae.Error.Message == "" {
		t.Fatalf("not an Anthropic error body (%v): %s", err, b)
	}
	return ae
}

const messagesBody = `{"model":"claude-test","max_tokens":50,"messages":[{"role":"user","content":"hello there"}]}`

func anthSDK(e *anthEnv, retries int, opts ...option.RequestOption) anthropic.Client {
	return anthropic.NewClient(append([]option.RequestOption{option.WithBaseURL(e.srv.URL), option.WithAPIKey(clientKey), option.WithMaxRetries(retries)}, opts...)...)
}

// answerLog records when the SDK received each answer and its
// retry-after-ms.
type answerLog struct {
	next http.RoundTripper
	mu   sync.Mutex
	at   []time.Time
	wait []string
}

func (l *answerLog) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := l.next.RoundTrip(req)
	if err == nil {
		l.mu.Lock()
		l.at, l.wait = append(l.at, time.Now()), append(l.wait, res.Header.Get("retry-after-ms"))
		l.mu.Unlock()
	}
	return res, err
}

func messageParams(maxTokens int64) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model: "claude-test", MaxTokens: maxTokens,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello from the official SDK"))},
	}
}

// TestAnthropicSDK: the official SDK's JSON, streaming and count_tokens
// calls go through the gateway to an Anthropic upstream with the gateway's
// key as x-api-key, and each settles at exactly the usage the SDK saw.
func TestAnthropicSDK(t *testing.T) {
	up := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey, OutputTokens: 6, CacheReadInputTokens: 40, CacheCreationInputTokens: 8})
	e := newAnthEnv(t, Limits{RPM: 1000, TPM: 100000}, up, nil, "")
	client := anthSDK(e, 0)
	ctx := context.Background()

	msg, err := client.Messages.New(ctx, messageParams(20))
	if err != nil {
		t.Fatal(err)
	}
	if len(msg.Content) != 1 || msg.Content[0].Text != strings.Repeat("tok ", 6) || msg.Usage.OutputTokens != 6 {
		t.Fatalf("message %+v", msg)
	}
	u := msg.Usage
	wantPrompt := u.InputTokens + (u.CacheCreationInputTokens*5+3)/4 + (u.CacheReadInputTokens+9)/10
	s := e.settle()
	if !s.UsageReported || s.PromptTokens != wantPrompt || s.CompletionTokens != 6 || s.Actual != wantPrompt+6 ||
		s.CacheCreationTokens != 8 || s.CacheReadTokens != 40 {
		t.Fatalf("settled %+v, usage %+v (weighted input %d)", s, u, wantPrompt)
	}
	if got := e.tpmRemaining(); got != 100000-s.Actual {
		t.Fatalf("tpm remaining %d after charging %d", got, s.Actual)
	}

	stream := client.Messages.NewStreaming(ctx, messageParams(20))
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acc.Content) != 1 || acc.Content[0].Text != strings.Repeat("tok ", 6) || acc.Usage.OutputTokens != 6 {
		t.Fatalf("stream %+v", acc)
	}
	if s2 := e.settle(); s2.PromptTokens != wantPrompt || s2.CompletionTokens != 6 {
		t.Fatalf("stream settled %+v, want prompt %d completion 6", s2, wantPrompt)
	}
	if got := e.tpmRemaining(); got != 100000-2*s.Actual {
		t.Fatalf("tpm remaining %d after two requests of %d", got, s.Actual)
	}

	count, err := client.Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{Model: "claude-test",
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("count these four words"))}})
	if err != nil || count.InputTokens != 3+4 {
		t.Fatalf("count_tokens %+v, %v", count, err)
	}
	if s3 := e.settle(); s3.Actual != 0 || s3.Reserved != 0 {
		t.Fatalf("count_tokens settled %+v, want no tokens", s3)
	}
	if got := e.tpmRemaining(); got != 100000-2*s.Actual {
		t.Fatalf("count_tokens changed tpm: %d", got)
	}
	for _, r := range up.Requests() {
		if r.Header.Get("X-Api-Key") != upstreamKey || r.Header.Get("Authorization") != "" || r.Header.Get("Anthropic-Version") == "" {
			t.Fatalf("upstream request %s headers %v", r.Path, r.Header)
		}
	}
}

// TestAnthropicSDKRetriesAfterRetryAfter: at 120/min with a burst of 1 the
// second request is denied for up to 500ms with an Anthropic rate_limit_error;
// the SDK waits what our retry-after-ms says, retries and gets through.
func TestAnthropicSDKRetriesAfterRetryAfter(t *testing.T) {
	st, err := memstore.New(memstore.Options{Clock: clock.NewSystem()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	up := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey})
	e := newAnthEnv(t, Limits{RPM: 120, RPMBurst: 1, TPM: 100000}, up, st, "")
	answers := &answerLog{next: http.DefaultTransport}
	client := anthSDK(e, 2, option.WithHTTPClient(&http.Client{Transport: answers}))
	ctx := context.Background()
	if _, err := client.Messages.New(ctx, messageParams(5)); err != nil {
		t.Fatal(err)
	}
	e.settle()
	if _, err := client.Messages.New(ctx, messageParams(5)); err != nil {
		t.Fatalf("the SDK did not get through after waiting: %v", err)
	}
	e.settle()
	if got := counterValue(t, e.gw.metrics.rejections.WithLabelValues("t", "claude-test", "rpm")); got < 1 {
		t.Fatalf("no rpm rejection recorded (%v): the retry was not exercised", got)
	}
	reqs := up.Requests()
	if len(reqs) != 2 {
		t.Fatalf("upstream saw %d requests", len(reqs))
	}
	// The retry reached the upstream no earlier than our 429 asked: its
	// retry-after-ms after the SDK received it.
	answers.mu.Lock()
	at, wait := answers.at, answers.wait
	answers.mu.Unlock()
	if len(at) < 3 || wait[1] == "" {
		t.Fatalf("answers %v %q: want 200, 429 with retry-after-ms, 200", at, wait)
	}
	ms, _ := strconv.Atoi(wait[1])
	if ms < 100 || reqs[1].Time.Before(at[1].Add(time.Duration(ms)*time.Millisecond)) {
		t.Fatalf("retry reached the upstream %s after the 429, which asked for %sms", reqs[1].Time.Sub(at[1]), wait[1])
	}
	if reqs[1].Header.Get("X-Stainless-Retry-Count") == "0" {
		t.Fatalf("second upstream request was not a retry: %v", reqs[1].Header)
	}

	// Without retries the SDK reports our 429 as Anthropic's error.
	noRetry := anthSDK(e, 0)
	_, err = noRetry.Messages.New(ctx, messageParams(5))
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || !strings.Contains(apiErr.RawJSON(), `"rate_limit_error"`) {
		t.Fatalf("err %v", err)
	}
}

// TestAnthropicHeaders: an admitted request gets Anthropic's rate-limit
// headers for requests and tokens (reset an RFC 3339 time), the upstream's
// own are dropped; a limited one gets 429 rate_limit_error with
// Retry-After, and is not forwarded.
func TestAnthropicHeaders(t *testing.T) {
	up := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey, Default: fakeanthropic.Fault{Header: http.Header{
		"Anthropic-Ratelimit-Requests-Remaining": {"999999"}, "Anthropic-Ratelimit-Tokens-Limit": {"1"}}}})
	e := newAnthEnv(t, Limits{RPM: 2, TPM: 1000}, up, nil, "")
	before := time.Now().Truncate(time.Second)
	res := e.post(context.Background(), "/v1/messages", clientKey, messagesBody)
	after := time.Now()
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	h := res.Header
	if h.Get("anthropic-ratelimit-requests-limit") != "2" || h.Get("anthropic-ratelimit-requests-remaining") != "1" ||
		h.Get("anthropic-ratelimit-tokens-limit") != "1000" {
		t.Fatalf("headers %v", h)
	}
	if vs := h.Values("anthropic-ratelimit-requests-remaining"); len(vs) != 1 {
		t.Fatalf("upstream's header relayed too: %q", vs)
	}
	remaining, _ := strconv.ParseInt(h.Get("anthropic-ratelimit-tokens-remaining"), 10, 64)
	est := e.settle().Reserved
	if remaining != 1000-est {
		t.Fatalf("tokens remaining %d, reserved %d", remaining, est)
	}
	for _, f := range []string{"requests", "tokens"} {
		reset, err := time.Parse(time.RFC3339, h.Get("anthropic-ratelimit-"+f+"-reset"))
		if err != nil {
			t.Fatalf("%s reset %q: %v", f, h.Get("anthropic-ratelimit-"+f+"-reset"), err)
		}
		// Full again within a minute (both limits are per minute).
		if reset.Before(before) || reset.After(after.Add(time.Minute+time.Second)) {
			t.Fatalf("%s reset %s not within a minute of %s", f, reset, before)
		}
	}
	if h.Get("anthropic-ratelimit-input-tokens-limit") != "" {
		t.Fatal("input-tokens headers without an itpm limit")
	}
	e.post(context.Background(), "/v1/messages", clientKey, messagesBody)
	e.settle()
	res = e.post(context.Background(), "/v1/messages", clientKey, messagesBody)
	if res.StatusCode != 429 || res.Header.Get("Retry-After") == "" || res.Header.Get("anthropic-ratelimit-requests-remaining") != "0" {
		t.Fatalf("status %d headers %v", res.StatusCode, res.Header)
	}
	if ae := decodeAnthError(t, res); ae.Error.Type != "rate_limit_error" || !strings.Contains(ae.Error.Message, "requests per minute") {
		t.Fatalf("%+v", ae)
	}
	if up.Count() != 2 {
		t.Fatalf("upstream saw %d requests, want 2", up.Count())
	}
}

// TestAnthropicUpstreamErrors: an upstream 529 overloaded_error and 429
// pass through with their bodies and retry-after, and are refunded.
func TestAnthropicUpstreamErrors(t *testing.T) {
	up := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey})
	e := newAnthEnv(t, Limits{RPM: 100, TPM: 1000}, up, nil, "")
	for _, status := range []int{529, 429} {
		up.Enqueue(fakeanthropic.Fault{Status: status, RetryAfter: "7"})
		res := e.post(context.Background(), "/v1/messages", clientKey, messagesBody)
		if res.StatusCode != status || res.Header.Get("Retry-After") != "7" {
			t.Fatalf("status %d retry-after %q, want %d", res.StatusCode, res.Header.Get("Retry-After"), status)
		}
		if ae := decodeAnthError(t, res); ae.Error.Type != fakeanthropic.ErrorType(status) {
			t.Fatalf("%d: %+v", status, ae)
		}
		if s := e.settle(); s.Actual != 0 || s.Status != status {
			t.Fatalf("settled %+v", s)
		}
		if got := e.tpmRemaining(); got != 1000 {
			t.Fatalf("after upstream %d tpm remaining %d, want all refunded", status, got)
		}
	}
}

// TestAnthropicStreamSettlement: a stream settles exactly at its usage
// (message_start's input, message_delta's output); a stream the client
// leaves, the upstream cuts, or ends with an error event is charged its
// input and what was relayed.
func TestAnthropicStreamSettlement(t *testing.T) {
	up := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey, OutputTokens: 10, InputTokens: 30, CacheReadInputTokens: 100})
	e := newAnthEnv(t, Limits{TPM: 100000}, up, nil, "")
	body := `{"model":"claude-test","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"stream it"}]}`
	input := int64(30 + 10) // 30 input, 100 cache reads at 0.1
	used := int64(0)
	check := func(name string, wantCompletion int64) {
		t.Helper()
		s := e.settle()
		if !s.UsageReported || s.PromptTokens != input || s.CompletionTokens != wantCompletion || s.Actual != input+wantCompletion {
			t.Fatalf("%s: settled %+v, want %d + %d", name, s, input, wantCompletion)
		}
		used += s.Actual
		if got := e.tpmRemaining(); got != 100000-used {
			t.Fatalf("%s: tpm remaining %d, want %d", name, got, 100000-used)
		}
	}

	res := e.post(context.Background(), "/v1/messages", clientKey, body)
	events := readEvents(t, res.Body)
	want := []string{"message_start", "content_block_start", "ping"}
	for range 10 {
		want = append(want, "content_block_delta")
	}
	want = append(want, "content_block_stop", "message_delta", "message_stop")
	if strings.Join(events, ",") != strings.Join(want, ",") {
		t.Fatalf("events %v", events)
	}
	check("whole", 10)

	// The client leaves after 4 tokens.
	hold, held := make(chan struct{}), make(chan struct{})
	defer close(hold)
	up.Enqueue(fakeanthropic.Fault{HoldAfter: 4, Hold: hold, Held: held})
	ctx, cancel := context.WithCancel(context.Background())
	res = e.post(ctx, "/v1/messages", clientKey, body)
	<-held
	br := bufio.NewReader(res.Body)
	deltas := 0
	for deltas < 4 {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "event: content_block_delta") {
			deltas++
		}
	}
	cancel()
	check("client gone", 4)

	up.Enqueue(fakeanthropic.Fault{CutAfter: 3})
	res = e.post(context.Background(), "/v1/messages", clientKey, body)
	_, _ = io.Copy(io.Discard, res.Body)
	check("upstream cut", 3)

	up.Enqueue(fakeanthropic.Fault{ErrorAfter: 5})
	res = e.post(context.Background(), "/v1/messages", clientKey, body)
	if ev := readEvents(t, res.Body); ev[len(ev)-1] != "error" {
		t.Fatalf("events %v", ev)
	}
	check("error event", 5)
}

func readEvents(t *testing.T, r io.Reader) []string {
	t.Helper()
	var events []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if name, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			events = append(events, name)
		}
	}
	return events
}

// TestAnthropicReservation: the reservation is the input estimate plus
// max_tokens, weighted 1.25 when the body asks for caching, with the
// reservation lease released.
func TestAnthropicReservation(t *testing.T) {
	up := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey})
	e := newAnthEnv(t, Limits{TPM: 100000}, up, nil, "")
	plain := `{"model":"claude-test","max_tokens":100,"system":"be brief","messages":[{"role":"user","content":[{"type":"text","text":"alpha beta gamma"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + strings.Repeat("QUJD", 5000) + `"}}]}]}`
	cached := strings.Replace(plain, `"text":"alpha beta gamma"`, `"text":"alpha beta gamma","cache_control":{"type":"ephemeral"}`, 1)
	e.post(context.Background(), "/v1/messages", clientKey, plain)
	r1 := e.settle().Reserved
	// system + message overhead + text + image, plus max_tokens.
	if want := aitoken.Count("be brief") + aitoken.MessageOverhead + aitoken.Count("alpha beta gamma") + anthropicImageTokens + 100; r1 != want {
		t.Fatalf("reserved %d, want %d", r1, want)
	}
	e.post(context.Background(), "/v1/messages", clientKey, cached)
	if r2, in := e.settle().Reserved, r1-100; r2 != in+(in+3)/4+100 {
		t.Fatalf("cached reservation %d, want 1.25 x %d + 100", r2, in)
	}
}

// TestAnthropicHostileInput: what a caller can send to get past the
// reservation or the parser is refused before it reaches the upstream, in
// Anthropic's error shape, and charges nothing.
func TestAnthropicHostileInput(t *testing.T) {
	up := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey})
	e := newAnthEnv(t, Limits{RPM: 1000, TPM: 5000}, up, nil, "")
	e.cfg.MaxBodyBytes = 4096
	cases := []struct {
		name, path, key, body string
		status                int
		typ                   string
	}{
		{"over the body limit", "/v1/messages", clientKey, `{"model":"claude-test","max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("a", 5000) + `"}]}`, 413, "request_too_large"},
		{"bad json", "/v1/messages", clientKey, `{"model":"claude-test",`, 400, "invalid_request_error"},
		{"not an object", "/v1/messages", clientKey, `["model"]`, 400, "invalid_request_error"},
		{"missing model", "/v1/messages", clientKey, `{"max_tokens":10,"messages":[]}`, 400, "invalid_request_error"},
		{"missing max_tokens", "/v1/messages", clientKey, `{"model":"claude-test","messages":[]}`, 400, "invalid_request_error"},
		{"negative max_tokens", "/v1/messages", clientKey, `{"model":"claude-test","max_tokens":-1,"messages":[]}`, 400, "invalid_request_error"},
		{"max_tokens as a string", "/v1/messages", clientKey, `{"model":"claude-test","max_tokens":"9","messages":[]}`, 400, "invalid_request_error"},
		{"max_tokens past int64", "/v1/messages", clientKey, `{"model":"claude-test","max_tokens":99999999999999999999,"messages":[]}`, 400, "invalid_request_error"},
		{"huge max_tokens", "/v1/messages", clientKey, `{"model":"claude-test","max_tokens":9223372036854775807,"messages":[{"role":"user","content":"hi"}]}`, 429, "rate_limit_error"},
		{"case variant", "/v1/messages", clientKey, `{"model":"claude-test","max_tokens":1,"MAX_TOKENS":100000,"messages":[]}`, 400, "invalid_request_error"},
		{"invalid UTF-8", "/v1/messages", clientKey, "{\"model\":\"claude-test\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", 400, "invalid_request_error"},
		{"no key", "/v1/messages", "", messagesBody, 401, "authentication_error"},
		{"wrong key", "/v1/messages", "sk-wrong", messagesBody, 401, "authentication_error"},
		{"another spelling", "/v1/Messages", clientKey, messagesBody, 404, "not_found_error"},
		{"trailing slash", "/v1/messages/count_tokens/", clientKey, messagesBody, 404, "not_found_error"},
		{"batches", "/v1/messages/batches", clientKey, `{"requests":[]}`, 404, "not_found_error"},
		// Dot segments and repeated slashes, which a proxy or upstream may
		// resolve to a metered path (gateway.Server's mux redirects them; a
		// Gateway on another router sees them).
		{"dot segment", "/v1/./messages", clientKey, messagesBody, 404, "not_found_error"},
		{"double slash", "/v1//messages", clientKey, messagesBody, 404, "not_found_error"},
		{"dot-dot", "/v1/messages/count_tokens/../../messages", clientKey, messagesBody, 404, "not_found_error"},
		{"batches, dot segment", "/v1/messages/./batches", clientKey, `{"requests":[]}`, 404, "not_found_error"},
		{"batches, double slash", "/v1/messages//batches", clientKey, `{"requests":[]}`, 404, "not_found_error"},
		{"batches, other case", "/v1/Messages/Batches/", clientKey, `{"requests":[]}`, 404, "not_found_error"},
	}
	for _, tc := range cases {
		res := e.post(context.Background(), tc.path, tc.key, tc.body)
		if res.StatusCode != tc.status {
			t.Fatalf("%s: status %d, want %d", tc.name, res.StatusCode, tc.status)
		}
		if ae := decodeAnthError(t, res); ae.Error.Type != tc.typ {
			t.Fatalf("%s: %+v", tc.name, ae)
		}
		if tc.status == 429 && res.Header.Get("x-should-retry") != "false" {
			t.Fatalf("%s: a request that can never fit must not be retried", tc.name)
		}
	}
	if up.Count() != 0 {
		t.Fatalf("upstream saw %d hostile requests", up.Count())
	}
	if got := e.tpmRemaining(); got != 5000 {
		t.Fatalf("tpm remaining %d after refused requests", got)
	}
	// Authorization: Bearer works for Anthropic paths too, and wins over
	// x-api-key.
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/messages", strings.NewReader(messagesBody))
	req.Header.Set("Authorization", "Bearer "+clientKey)
	req.Header.Set("x-api-key", "sk-wrong")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("bearer key: status %d", res.StatusCode)
	}
	e.settle()
	if got := up.Requests()[0].Header.Get("X-Api-Key"); got != upstreamKey {
		t.Fatalf("upstream got x-api-key %q", got)
	}
	// A wrong bearer key is not rescued by a valid x-api-key: one key
	// decides, and it is the one metered.
	req, _ = http.NewRequest(http.MethodPost, e.srv.URL+"/v1/messages", strings.NewReader(messagesBody))
	req.Header.Set("Authorization", "Bearer sk-wrong")
	req.Header.Set("x-api-key", clientKey)
	if res, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	if ae := decodeAnthError(t, res); res.StatusCode != 401 || ae.Error.Type != "authentication_error" {
		t.Fatalf("wrong bearer, valid x-api-key: status %d %+v", res.StatusCode, ae)
	}
	res.Body.Close()
	if up.Count() != 1 {
		t.Fatalf("upstream saw %d requests", up.Count())
	}
}

// TestAnthropicInputOutputLimits: with itpm and otpm (Anthropic's ITPM and
// OTPM) a Messages request reserves its input estimate on itpm and
// max_tokens on otpm, gets anthropic-ratelimit-input-tokens-* and
// -output-tokens-* headers, and settles each at its usage: the weighted
// input on itpm, the output on otpm.
func TestAnthropicInputOutputLimits(t *testing.T) {
	up := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey, InputTokens: 30, OutputTokens: 10, CacheReadInputTokens: 100})
	e := newAnthEnv(t, Limits{ITPM: 1000, OTPM: 500}, up, nil, "")
	peek := func(name string, rate int64) int64 {
		d, err := e.store.Apply(context.Background(), sluice.OpPeek, sluice.Request{Key: "{gw:" + e.client + "}:" + name,
			Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: rate, Period: time.Minute}})
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}
	res := e.post(context.Background(), "/v1/messages", clientKey, messagesBody)
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	s := e.settle()
	est := s.Reserved - 50
	h := res.Header
	for _, c := range []struct{ field, want string }{
		{"anthropic-ratelimit-input-tokens-limit", "1000"},
		{"anthropic-ratelimit-input-tokens-remaining", strconv.FormatInt(1000-est, 10)},
		{"anthropic-ratelimit-output-tokens-limit", "500"},
		{"anthropic-ratelimit-output-tokens-remaining", "450"},
		{"anthropic-ratelimit-tokens-remaining", "450"}, // the most restrictive
	} {
		if got := h.Get(c.field); got != c.want {
			t.Fatalf("%s: %q, want %q (headers %v)", c.field, got, c.want, h)
		}
	}
	if got := peek("itpm", 1000); got != 1000-40 {
		t.Fatalf("itpm remaining %d, want 1000 - (30 + 100 reads at 0.1)", got)
	}
	if got := peek("otpm", 500); got != 500-10 {
		t.Fatalf("otpm remaining %d, want 490", got)
	}
	res = e.post(context.Background(), "/v1/messages", clientKey, `{"model":"claude-test","max_tokens":600,"messages":[]}`)
	if res.StatusCode != 429 || res.Header.Get("x-should-retry") != "false" {
		t.Fatalf("max_tokens over otpm: status %d", res.StatusCode)
	}
	if ae := decodeAnthError(t, res); ae.Error.Type != "rate_limit_error" {
		t.Fatalf("%+v", ae)
	}
}

// TestAnthropicRedisTwoGateways: parallel Messages requests, JSON and
// streamed, spread over two gateways that share a real Redis, never admit
// more tokens than the TPM limit, and settle exactly.
func TestAnthropicRedisTwoGateways(t *testing.T) {
	url := redistest.Standalone(t).URL()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	client := strings.NewReplacer(":", "", "/", "").Replace(redistest.Prefix(t))
	client = client[len(client)-6:] + "a"
	up := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey, OutputTokens: 100, InputTokens: 20, CacheCreationInputTokens: 8})
	l := Limits{TPM: 2000, Concurrency: 50}
	var envs []*anthEnv
	for range 2 {
		st, err := redisstore.New(context.Background(), redisstore.Options{URL: url, Clock: clk, DisableDenyCache: true, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		envs = append(envs, newAnthEnv(t, l, up, st, client))
	}
	envs[1].settled = envs[0].settled
	var wg sync.WaitGroup
	statuses := make(chan int, 50)
	for i := range 50 {
		e := envs[i%2]
		stream := i%3 == 0
		wg.Go(func() {
			body := `{"model":"claude-test","max_tokens":150,"stream":` + strconv.FormatBool(stream) + `,"messages":[{"role":"user","content":"hello"}]}`
			req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/messages", strings.NewReader(body))
			req.Header.Set("x-api-key", clientKey)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			statuses <- res.StatusCode
		})
	}
	wg.Wait()
	close(statuses)
	ok := 0
	for s := range statuses {
		switch s {
		case 200:
			ok++
		case 429:
		default:
			t.Fatalf("status %d", s)
		}
	}
	var charged int64
	for range ok {
		charged += envs[0].settle().Actual
	}
	perRequest := int64(20 + 10 + 100) // input, 8 cache writes at 1.25, output
	if ok == 0 || ok == 50 || up.Count() != ok || charged != int64(ok)*perRequest {
		t.Fatalf("admitted %d, upstream %d, charged %d (%d each)", ok, up.Count(), charged, perRequest)
	}
	if charged > l.TPM {
		t.Fatalf("charged %d tokens, over the limit %d", charged, l.TPM)
	}
	if got := envs[0].tpmRemaining(); got != l.TPM-charged {
		t.Fatalf("tpm remaining %d, want %d", got, l.TPM-charged)
	}
}

// TestAnthropicRedisPauseMidStream: Redis stopped (SIGSTOP) for 2 s while
// a Messages stream is relayed. The stream reaches the client whole (settling
// is off its path), no settlement is reported at once, a request arriving
// during the pause does not reach the upstream unless Redis admits it, and
// tpm ends charged each request's usage, or its reservation when its
// settlement failed against the stopped Redis: never less.
func TestAnthropicRedisPauseMidStream(t *testing.T) {
	srv := redistest.NewStandalone(t)
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	st, err := redisstore.New(context.Background(), redisstore.Options{URL: srv.URL(), Clock: clk, DisableDenyCache: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	up := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey, OutputTokens: 10, InputTokens: 30})
	// A tpm slow enough that its Redis keys (whose TTL runs on Redis time,
	// not the test clock) outlive the pause.
	l := Limits{TPM: 200, Concurrency: 2}
	e := newAnthEnv(t, l, up, st, "")
	const perRequest = 30 + 10

	hold, held := make(chan struct{}), make(chan struct{})
	up.Enqueue(fakeanthropic.Fault{HoldAfter: 4, Hold: hold, Held: held})
	res := e.post(context.Background(), "/v1/messages", clientKey, `{"model":"claude-test","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"stream it"}]}`)
	<-held
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	frozen := true
	thaw := func() {
		if frozen {
			frozen = false
			if err := srv.Thaw(); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer thaw()
	paused := time.Now()
	close(hold)
	if ev := readEvents(t, res.Body); len(ev) == 0 || ev[len(ev)-1] != "message_stop" {
		t.Fatalf("stream relayed while Redis is stopped: events %v", ev)
	}
	select {
	case s := <-e.settled:
		t.Fatalf("settled against a stopped Redis: %+v", s)
	default:
	}

	status := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/messages", strings.NewReader(messagesBody))
		req.Header.Set("x-api-key", clientKey)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			status <- -1
			return
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		status <- res.StatusCode
	}()
	time.Sleep(2*time.Second - time.Since(paused)) // the pause itself, not synchronisation
	if n := up.Count(); n != 1 {
		t.Fatalf("upstream saw %d requests while Redis was stopped, want only the stream's", n)
	}
	thaw()
	// The request sent during the pause waited for Redis, within the
	// store timeout, or was refused 503; either way it was metered.
	// (A 2 s stop can outlast a reconnection's 1 s handshake in
	// redisstore, so either answer is possible.)
	want := map[int]bool{200: true, 503: true}
	got := <-status
	if !want[got] || up.Count() != 1+map[bool]int{true: 1}[got == 200] {
		t.Fatalf("request sent during the pause: status %d, upstream saw %d", got, up.Count())
	}
	// Every settlement charges its usage exactly, or, when Redis failed it,
	// leaves at most the larger reservation charged: tpm never under-counts.
	var lo, hi int64
	for range 1 + map[bool]int{true: 1}[got == 200] {
		s := e.settle()
		switch {
		case s.Status != 200 || !s.UsageReported || s.Actual != perRequest:
			t.Fatalf("settled %+v, want %d tokens", s, perRequest)
		case s.Err == nil:
			lo, hi = lo+s.Actual, hi+s.Actual
		default:
			t.Logf("settlement failed against the stopped Redis: %v", s.Err)
			lo, hi = lo+s.Actual, hi+s.Reserved
		}
	}
	if rem := e.tpmRemaining(); rem > l.TPM-lo || rem < l.TPM-hi {
		t.Fatalf("tpm remaining %d, want %d to %d", rem, l.TPM-hi, l.TPM-lo)
	}
}

// TestAnthropicConfig: upstream.api is validated and picks the key
// variable.
func TestAnthropicConfig(t *testing.T) {
	c := &Config{Upstream: UpstreamConfig{BaseURL: "https://api.anthropic.com/v1", API: APIAnthropic}, Tiers: map[string]TierConfig{"t": {RPM: 1}}}
	if err := c.Validate(); err != nil || c.Upstream.APIKeyEnv != DefaultAnthropicKeyEnv {
		t.Fatalf("%v, key env %q", err, c.Upstream.APIKeyEnv)
	}
	c = &Config{Upstream: UpstreamConfig{BaseURL: "https://api.anthropic.com/v1", API: "claude"}, Tiers: map[string]TierConfig{"t": {RPM: 1}}}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "upstream.api") {
		t.Fatalf("err %v", err)
	}
	if _, err := Parse("x.yaml", []byte("upstream: {base_url: 'https://api.anthropic.com/v1', api: anthropic}\ntiers: {t: {rpm: 1}}\n")); err != nil {
		t.Fatal(err)
	}
}

// FuzzParseAnthropicBody: a Messages body the gateway accepts reads the
// same model and max_tokens to an exact, case-sensitive decoder (a Python
// upstream's) as to encoding/json's case-insensitive struct decoding (a Go
// upstream's) and to the gateway; its input estimate is never negative,
// and its reservation covers max_tokens.
func FuzzParseAnthropicBody(f *testing.F) {
	for _, s := range []string{
		messagesBody,
		`{"model":"m","max_tokens":9223372036854775807,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","max_tokens":5,"MAX_TOKENS":100000}`,
		`{"model":"m","max_tokens":5,"max_tokens":100000}`,
		`{"model":"m","max\u005ftokens":5,"system":[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}]}`,
		`{"model":"m","\u004dAX_TOKENS":1,"max_tokens":4}`,
		`{"model":"m","max_tokens":0,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}],"tools":[{"name":"t","input_schema":{}}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := parseAnthropicBody(body, epMessages)
		if err != nil {
			return
		}
		var exact map[string]json.RawMessage
		if json.Unmarshal(body, &exact) != nil {
			t.Fatalf("accepted a body that is not a JSON object: %q", body)
		}
		var model string
		var maxTokens int64
		_ = json.Unmarshal(exact["model"], &model)
		if json.Unmarshal(exact["max_tokens"], &maxTokens) != nil {
			t.Fatalf("accepted a body whose max_tokens an exact decoder cannot read: %q", body)
		}
		var loose struct {
			Model     string `json:"model"`
			MaxTokens int64  `json:"max_tokens"`
		}
		if json.Unmarshal(body, &loose) != nil {
			t.Fatalf("accepted a body encoding/json refuses: %q", body)
		}
		if p.model != model || p.model != loose.Model || p.maxTokens != maxTokens || p.maxTokens != loose.MaxTokens {
			t.Fatalf("gateway %q/%d, exact %q/%d, case-insensitive %q/%d: %q", p.model, p.maxTokens, model, maxTokens, loose.Model, loose.MaxTokens, body)
		}
		if p.promptEst < 0 || p.maxTokens < 0 || reservation(p.promptEst, p.maxTokens, 1) < p.maxTokens {
			t.Fatalf("estimate %d, max_tokens %d: %q", p.promptEst, p.maxTokens, body)
		}
	})
}
