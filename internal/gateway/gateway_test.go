package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/aitoken"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/memstore"
)

const (
	clientKey   = "sk-client-test-0001"
	upstreamKey = "sk-upstream-secret"
)

// env is a gateway in front of a fake upstream, over real sockets.
type env struct {
	t       *testing.T
	up      *fakeopenai.Server
	gw      *Gateway
	srv     *httptest.Server
	store   sluice.Store
	clk     *clock.Fake
	cfg     *Config
	client  string // client id of clientKey
	settled chan Settlement
	// upTransport is the gateway's transport to the upstream.
	upTransport http.RoundTripper
}

// newEnv starts an environment whose one key has tier "t" with limits l.
// The store reads a fake clock that only the test moves.
func newEnv(t *testing.T, l Limits, upOpts fakeopenai.Options) *env {
	t.Helper()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	st, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return newEnvStore(t, l, upOpts, st, clk)
}

func newEnvStore(t *testing.T, l Limits, upOpts fakeopenai.Options, st sluice.Store, clk *clock.Fake) *env {
	t.Helper()
	if upOpts.APIKey == "" {
		upOpts.APIKey = upstreamKey
	}
	return newEnvUpstream(t, l, fakeopenai.New(t, upOpts), st, clk, "")
}

// newEnvUpstream puts a gateway in front of up; client, when set, is the
// test key's client id (and so its key prefix in the store).
func newEnvUpstream(t *testing.T, l Limits, up *fakeopenai.Server, st sluice.Store, clk *clock.Fake, client string) *env {
	t.Helper()
	cfg := &Config{
		Upstream: UpstreamConfig{BaseURL: up.URL() + "/v1", APIKeyEnv: "TEST_UPSTREAM_KEY"},
		Models:   []string{"gpt-test"},
		// Generous: the machine is shared and tests run with -race.
		Store: StoreConfig{Timeout: 5 * time.Second},
		Tiers: map[string]TierConfig{"t": Tier(l)},
		Keys:  []KeyConfig{{Name: "test", Hash: sluice.HashKey(clientKey), Tier: "t", Client: client}},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, up: up, store: st, clk: clk, cfg: cfg, client: cfg.Keys[0].Client, settled: make(chan Settlement, 1000)}
	e.gw, e.srv, e.upTransport = startGateway(t, cfg, st, func(k string) string { return map[string]string{"TEST_UPSTREAM_KEY": upstreamKey}[k] }, func(s Settlement) { e.settled <- s })
	return e
}

// startGateway starts a gateway on cfg and st behind a test server. It
// reads the upstream key through getenv and reports settlements to
// onSettled; it returns the gateway, its server and its transport to the
// upstream.
func startGateway(t *testing.T, cfg *Config, st sluice.Store, getenv func(string) string, onSettled func(Settlement)) (*Gateway, *httptest.Server, http.RoundTripper) {
	t.Helper()
	var upTransport http.RoundTripper
	gw, err := New(Options{
		Config: cfg, Store: st,
		Getenv:    getenv,
		OnSettled: onSettled,
		Logger:    slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper {
			upTransport = rt
			return rt
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	return gw, srv, upTransport
}

func (e *env) post(ctx context.Context, path, key, body string) *http.Response {
	e.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { res.Body.Close() })
	return res
}

// settle waits for the next settlement.
func (e *env) settle() Settlement {
	e.t.Helper()
	select {
	case s := <-e.settled:
		return s
	case <-time.After(10 * time.Second):
		e.t.Fatal("no settlement within 10s")
	}
	return Settlement{}
}

// remaining peeks a limit of the test client without changing it.
func (e *env) remaining(name string, alg sluice.Algorithm, l sluice.Limit) int64 {
	e.t.Helper()
	d, err := e.store.Apply(context.Background(), sluice.OpPeek, sluice.Request{Key: "{gw:" + e.client + "}:" + name, Algorithm: alg, Limit: l})
	if err != nil {
		e.t.Fatal(err)
	}
	return d.Remaining
}

func (e *env) tpmRemaining() int64 {
	tc := e.cfg.Tiers["t"]
	return e.remaining("tpm", sluice.GCRA, sluice.Limit{Rate: tc.TPM, Period: time.Minute, Burst: tc.TPMBurst})
}

// tlog sends log lines to the test's log.
type tlog struct{ t *testing.T }

func (l tlog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

type apiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func decodeError(t *testing.T, res *http.Response) apiError {
	t.Helper()
	var ae apiError
	b, _ := io.ReadAll(res.Body)
	if err := json.Unmarshal(b, &ae); err != nil || ae.Error.Message == "" {
		t.Fatalf("not an OpenAI error body (%v): %s", err, b)
	}
	return ae
}

func promptEstimate(t *testing.T, body string) int64 {
	var r aitoken.Request
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatal(err)
	}
	return r.PromptTokens()
}

const chatBody = `{"model":"gpt-test","messages":[{"role":"user","content":"say something nice about rate limiters"}],"max_tokens":50}`

func TestAuth(t *testing.T) {
	e := newEnv(t, Limits{RPM: 100, TPM: 10000}, fakeopenai.Options{})
	for _, key := range []string{"", "sk-unknown"} {
		res := e.post(context.Background(), "/v1/chat/completions", key, chatBody)
		if res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("key %q: status %d", key, res.StatusCode)
		}
		if ae := decodeError(t, res); ae.Error.Code == nil || *ae.Error.Code != "invalid_api_key" || ae.Error.Type != "invalid_request_error" {
			t.Fatalf("key %q: %+v", key, ae)
		}
	}
	if n := e.up.Count(); n != 0 {
		t.Fatalf("upstream saw %d unauthenticated requests", n)
	}
	res := e.post(context.Background(), "/v1/chat/completions", clientKey, chatBody)
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	e.settle()
	// /v1/models passes through, with the upstream's key only.
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer "+clientKey)
	mres, err := http.DefaultClient.Do(req)
	if err != nil || mres.StatusCode != 200 {
		t.Fatalf("models: %v %v", err, mres)
	}
	mres.Body.Close()
	for _, r := range e.up.Requests() {
		if r.Authorization != "Bearer "+upstreamKey || strings.Contains(string(r.Body), clientKey) {
			t.Fatalf("upstream saw auth %q", r.Authorization)
		}
		for k, vs := range r.Header {
			for _, v := range vs {
				if strings.Contains(v, clientKey) {
					t.Fatalf("client key leaked upstream in %s", k)
				}
			}
		}
	}
	if got := e.up.Requests()[1].Path; got != "/v1/models" {
		t.Fatalf("passthrough path %q", got)
	}
}

func TestNonStreamingExactAccounting(t *testing.T) {
	l := Limits{RPM: 100, TPM: 60000, RPD: 1000, Concurrency: 4}
	e := newEnv(t, l, fakeopenai.Options{CompletionTokens: 7})
	res := e.post(context.Background(), "/v1/chat/completions", clientKey, chatBody)
	var body struct {
		Usage usageJSON `json:"usage"`
	}
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil || res.StatusCode != 200 {
		t.Fatalf("status %d err %v", res.StatusCode, err)
	}
	s := e.settle()
	want := body.Usage.PromptTokens + body.Usage.CompletionTokens
	if !s.UsageReported || s.Actual != want || s.Reserved != promptEstimate(t, chatBody)+50 {
		t.Fatalf("settlement %+v, want actual %d", s, want)
	}
	if got := e.tpmRemaining(); got != l.TPM-want {
		t.Fatalf("tpm remaining %d, want %d", got, l.TPM-want)
	}
	if got := e.remaining("rpm", sluice.GCRA, sluice.PerMinute(l.RPM)); got != l.RPM-1 {
		t.Fatalf("rpm remaining %d", got)
	}
	if got := e.remaining("concurrency", sluice.Concurrency, sluice.Limit{Rate: l.Concurrency, Period: DefaultLeaseTTL}); got != l.Concurrency {
		t.Fatalf("concurrency lease not released: remaining %d", got)
	}
	// Headers on success: OpenAI's and the IETF fields.
	h := res.Header
	if h.Get("x-ratelimit-limit-requests") != "100" || h.Get("x-ratelimit-remaining-requests") != "99" || h.Get("x-ratelimit-limit-tokens") != "60000" {
		t.Fatalf("headers %v", h)
	}
	if _, err := time.ParseDuration(h.Get("x-ratelimit-reset-tokens")); err != nil {
		t.Fatalf("reset-tokens %q: %v", h.Get("x-ratelimit-reset-tokens"), err)
	}
	if !strings.Contains(h.Get("RateLimit-Policy"), `"tpm";q=60000;sluice-qu="tokens";w=60`) || !strings.Contains(h.Get("RateLimit"), `"rpm";r=99`) {
		t.Fatalf("IETF headers %q / %q", h.Get("RateLimit-Policy"), h.Get("RateLimit"))
	}
}

// readSSE returns the data payloads of a stream.
func readSSE(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

func TestStreamingExactAccounting(t *testing.T) {
	l := Limits{RPM: 100, TPM: 60000}
	e := newEnv(t, l, fakeopenai.Options{CompletionTokens: 12})
	body := `{"model":"gpt-test","stream":true,"messages":[{"role":"user","content":"count to twelve"}]}`
	res := e.post(context.Background(), "/v1/chat/completions", clientKey, body)
	events := readSSE(t, res.Body)
	s := e.settle()
	up := e.up.Requests()[0]
	if !strings.Contains(string(up.Body), `"include_usage":true`) {
		t.Fatalf("upstream body lacks include_usage: %s", up.Body)
	}
	for _, ev := range events {
		if strings.Contains(ev, `"usage":{`) {
			t.Fatalf("client got a usage event it did not ask for: %s", ev)
		}
	}
	if n := strings.Count(strings.Join(events, ""), "tok "); n != 12 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("events %q", events)
	}
	want := int64(fakeopenai.CountPromptTokens([]byte(body))) + 12
	if !s.UsageReported || s.Actual != want || s.Reserved != promptEstimate(t, body)+DefaultMaxTokens {
		t.Fatalf("settlement %+v, want actual %d", s, want)
	}
	if got := e.tpmRemaining(); got != l.TPM-want {
		t.Fatalf("tpm remaining %d, want %d", got, l.TPM-want)
	}
	// A client that asks for usage gets it.
	res = e.post(context.Background(), "/v1/chat/completions", clientKey, strings.Replace(body, `"stream":true`, `"stream":true,"stream_options":{"include_usage":true}`, 1))
	events = readSSE(t, res.Body)
	e.settle()
	if !strings.Contains(events[len(events)-2], `"completion_tokens":12`) {
		t.Fatalf("usage event missing: %q", events)
	}
	if got := e.tpmRemaining(); got != l.TPM-2*want {
		t.Fatalf("tpm remaining %d, want %d", got, l.TPM-2*want)
	}
}

func TestResponsesStreamAccounting(t *testing.T) {
	l := Limits{TPM: 60000}
	e := newEnv(t, l, fakeopenai.Options{CompletionTokens: 5})
	body := `{"model":"gpt-test","stream":true,"input":"write a haiku","max_output_tokens":100}`
	res := e.post(context.Background(), "/v1/responses", clientKey, body)
	_, _ = io.Copy(io.Discard, res.Body)
	s := e.settle()
	want := int64(fakeopenai.CountPromptTokens([]byte(body))) + 5
	if !s.UsageReported || s.Actual != want || e.tpmRemaining() != l.TPM-want {
		t.Fatalf("settlement %+v, remaining %d, want actual %d", s, e.tpmRemaining(), want)
	}
}

func TestClientDisconnectMidStream(t *testing.T) {
	l := Limits{RPM: 100, TPM: 60000, Concurrency: 1}
	e := newEnv(t, l, fakeopenai.Options{CompletionTokens: 20})
	hold, held := make(chan struct{}), make(chan struct{})
	defer close(hold)
	e.up.Enqueue(fakeopenai.Fault{HoldAfter: 5, Hold: hold, Held: held})
	ctx, cancel := context.WithCancel(context.Background())
	body := `{"model":"gpt-test","stream":true,"max_tokens":200,"messages":[{"role":"user","content":"tell a long story"}]}`
	res := e.post(ctx, "/v1/chat/completions", clientKey, body)
	<-held
	// Read the five tokens relayed so far, then hang up.
	br := bufio.NewReader(res.Body)
	got := 0
	for got < 5 {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		got += strings.Count(line, "tok ")
	}
	cancel()
	s := e.settle()
	want := promptEstimate(t, body) + 5
	if s.UsageReported || s.Actual != want || s.CompletionTokens != 5 {
		t.Fatalf("settlement %+v, want actual %d", s, want)
	}
	if got := e.tpmRemaining(); got != l.TPM-want {
		t.Fatalf("tpm remaining %d, want %d", got, l.TPM-want)
	}
	if got := e.remaining("concurrency", sluice.Concurrency, sluice.Limit{Rate: 1, Period: DefaultLeaseTTL}); got != 1 {
		t.Fatalf("lease not released after disconnect: remaining %d", got)
	}
}

func TestUpstreamCutMidStream(t *testing.T) {
	l := Limits{TPM: 60000}
	e := newEnv(t, l, fakeopenai.Options{CompletionTokens: 20})
	e.up.Enqueue(fakeopenai.Fault{CutAfter: 3})
	body := `{"model":"gpt-test","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"go"}]}`
	res := e.post(context.Background(), "/v1/chat/completions", clientKey, body)
	b, err := io.ReadAll(res.Body)
	if err == nil {
		t.Fatalf("a cut stream read cleanly: %s", b)
	}
	s := e.settle()
	if want := promptEstimate(t, body) + 3; s.Actual != want || e.tpmRemaining() != l.TPM-want {
		t.Fatalf("settlement %+v, remaining %d, want %d", s, e.tpmRemaining(), want)
	}
}

func TestRateLimited(t *testing.T) {
	l := Limits{RPM: 2, TPM: 60000}
	e := newEnv(t, l, fakeopenai.Options{})
	for range 2 {
		if res := e.post(context.Background(), "/v1/chat/completions", clientKey, chatBody); res.StatusCode != 200 {
			t.Fatalf("status %d", res.StatusCode)
		}
		e.settle()
	}
	before := e.tpmRemaining()
	res := e.post(context.Background(), "/v1/chat/completions", clientKey, chatBody)
	if res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d", res.StatusCode)
	}
	ae := decodeError(t, res)
	if *ae.Error.Code != "rate_limit_exceeded" || ae.Error.Type != "requests" || !strings.Contains(ae.Error.Message, "requests per minute (rpm)") ||
		!strings.Contains(ae.Error.Message, "limit 2/min, 0 left, requested 1") {
		t.Fatalf("error %+v", ae.Error)
	}
	h := res.Header
	// 2/min: the next request fits in 30s.
	if h.Get("Retry-After") != "30" || h.Get("retry-after-ms") != "30000" || h.Get("x-ratelimit-remaining-requests") != "0" ||
		h.Get("x-ratelimit-reset-requests") != "1m0s" || h.Get("x-ratelimit-limit-tokens") != "60000" {
		t.Fatalf("headers %v", h)
	}
	if !strings.Contains(h.Get("RateLimit"), `"rpm";r=0;t=30`) {
		t.Fatalf("RateLimit %q", h.Get("RateLimit"))
	}
	if e.up.Count() != 2 || e.tpmRemaining() != before {
		t.Fatalf("rejected request reached upstream (%d) or was charged (%d → %d)", e.up.Count(), before, e.tpmRemaining())
	}
	// After the wait it says, it is admitted.
	e.clk.Advance(30 * time.Second)
	if res := e.post(context.Background(), "/v1/chat/completions", clientKey, chatBody); res.StatusCode != 200 {
		t.Fatalf("after Retry-After: status %d", res.StatusCode)
	}
	e.settle()
}

func TestTooLarge(t *testing.T) {
	e := newEnv(t, Limits{TPM: 1000}, fakeopenai.Options{})
	res := e.post(context.Background(), "/v1/chat/completions", clientKey, strings.Replace(chatBody, `"max_tokens":50`, `"max_tokens":5000`, 1))
	if res.StatusCode != http.StatusTooManyRequests || res.Header.Get("x-should-retry") != "false" {
		t.Fatalf("status %d headers %v", res.StatusCode, res.Header)
	}
	if ae := decodeError(t, res); *ae.Error.Code != "request_too_large" || !strings.Contains(ae.Error.Message, "limit 1000") {
		t.Fatalf("error %+v", ae.Error)
	}
	// Without max_tokens the default budget is capped at the burst.
	res = e.post(context.Background(), "/v1/chat/completions", clientKey, strings.Replace(chatBody, `,"max_tokens":50`, ``, 1))
	if res.StatusCode != 200 {
		t.Fatalf("default budget: status %d", res.StatusCode)
	}
	if s := e.settle(); s.Reserved != 1000 {
		t.Fatalf("reserved %d, want the burst 1000", s.Reserved)
	}
	if e.up.Count() != 1 {
		t.Fatalf("upstream count %d", e.up.Count())
	}
}

func TestUpstreamErrorsRefund(t *testing.T) {
	l := Limits{RPM: 10, TPM: 60000, Concurrency: 2}
	e := newEnv(t, l, fakeopenai.Options{})
	e.up.Enqueue(fakeopenai.Fault{Status: 429, RetryAfter: "7", RetryAfterMS: "6500"}, fakeopenai.Fault{Status: 503})
	res := e.post(context.Background(), "/v1/chat/completions", clientKey, chatBody)
	if res.StatusCode != 429 || res.Header.Get("Retry-After") != "7" || res.Header.Get("retry-after-ms") != "6500" {
		t.Fatalf("upstream 429 not passed through: %d %v", res.StatusCode, res.Header)
	}
	if s := e.settle(); s.Actual != 0 {
		t.Fatalf("settlement %+v", s)
	}
	res = e.post(context.Background(), "/v1/chat/completions", clientKey, chatBody)
	if res.StatusCode != 503 {
		t.Fatalf("status %d", res.StatusCode)
	}
	e.settle()
	// The tokens are refunded; the two requests reached the upstream and
	// count (TestBypassUpstreamRefusals).
	if e.tpmRemaining() != l.TPM || e.remaining("rpm", sluice.GCRA, sluice.PerMinute(l.RPM)) != l.RPM-2 {
		t.Fatalf("tpm %d rpm %d, want tpm %d rpm %d", e.tpmRemaining(), e.remaining("rpm", sluice.GCRA, sluice.PerMinute(l.RPM)), l.TPM, l.RPM-2)
	}
	// An unreachable upstream: 502, OpenAI-shaped, refunded, the request
	// too (the upstream never had it).
	e.up.Close()
	// Without its idle connection too: a request written on a connection
	// the upstream closed before reading it may have reached it, for all
	// the gateway can tell, and keeps its prompt charged (the safe side).
	e.upTransport.(interface{ CloseIdleConnections() }).CloseIdleConnections()
	res = e.post(context.Background(), "/v1/chat/completions", clientKey, chatBody)
	if res.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d", res.StatusCode)
	}
	if ae := decodeError(t, res); ae.Error.Type != "server_error" {
		t.Fatalf("%+v", ae)
	}
	e.settle()
	if e.tpmRemaining() != l.TPM || e.remaining("concurrency", sluice.Concurrency, sluice.Limit{Rate: 2, Period: DefaultLeaseTTL}) != 2 ||
		e.remaining("rpm", sluice.GCRA, sluice.PerMinute(l.RPM)) != l.RPM-2 {
		t.Fatal("502 not refunded")
	}
}

// TestParallelTPM sends 50 requests at once from one key; the clock stands
// still, so the tokens charged can never exceed the TPM burst.
func TestParallelTPM(t *testing.T) {
	l := Limits{TPM: 2000}
	e := newEnv(t, l, fakeopenai.Options{CompletionTokens: 100})
	parallelTPM(t, []*env{e}, l)
}

func parallelTPM(t *testing.T, envs []*env, l Limits) {
	body := `{"model":"gpt-test","messages":[{"role":"user","content":"hello"}],"max_tokens":150}`
	var wg sync.WaitGroup
	statuses := make(chan int, 50)
	for i := range 50 {
		e := envs[i%len(envs)]
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+clientKey)
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
	// A settlement follows each admitted request's response; the envs
	// share one channel.
	var charged int64
	for range ok {
		charged += envs[0].settle().Actual
	}
	upstream := 0
	seen := map[*fakeopenai.Server]bool{}
	for _, e := range envs {
		if !seen[e.up] {
			upstream += e.up.Count()
			seen[e.up] = true
		}
	}
	perRequest := int64(fakeopenai.CountPromptTokens([]byte(body)) + 100)
	if ok == 0 || ok == 50 || upstream != ok || charged != int64(ok)*perRequest {
		t.Fatalf("admitted %d, upstream %d, charged %d (%d each)", ok, upstream, charged, perRequest)
	}
	if charged > l.TPM {
		t.Fatalf("charged %d tokens, over the limit %d", charged, l.TPM)
	}
	if got := envs[0].tpmRemaining(); got != l.TPM-charged {
		t.Fatalf("tpm remaining %d, want %d", got, l.TPM-charged)
	}
}

func TestPerModelLimit(t *testing.T) {
	e := newEnv(t, Limits{RPM: 100}, fakeopenai.Options{})
	e.cfg.Tiers["t"] = TierConfig{RPM: 100, Models: map[string]Limits{"gpt-big": {RPM: 1}}}
	gw, err := New(Options{Config: e.cfg, Store: e.store, Getenv: func(string) string { return upstreamKey }, OnSettled: func(s Settlement) { e.settled <- s }})
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Close()
	e.srv = httptest.NewServer(gw)
	t.Cleanup(e.srv.Close)
	big := strings.Replace(chatBody, "gpt-test", "gpt-big", 1)
	codes := []int{}
	for _, b := range []string{big, big, chatBody} {
		res := e.post(context.Background(), "/v1/chat/completions", clientKey, b)
		codes = append(codes, res.StatusCode)
		if res.StatusCode == 200 {
			e.settle()
		} else if ae := decodeError(t, res); !strings.Contains(ae.Error.Message, "on model gpt-big") {
			t.Fatalf("message %q", ae.Error.Message)
		}
	}
	if codes[0] != 200 || codes[1] != 429 || codes[2] != 200 {
		t.Fatalf("codes %v", codes)
	}
}

// TestSettlementOnce: a request's reservation is a lease keyed by its
// request id, so once any instance has settled it, another settlement of the
// same request (here this gateway's own, after a peer settled first) changes
// nothing.
func TestSettlementOnce(t *testing.T) {
	l := Limits{RPM: 100, TPM: 60000} // no concurrency limit: a reservation lease
	e := newEnv(t, l, fakeopenai.Options{CompletionTokens: 20})
	hold, held := make(chan struct{}), make(chan struct{})
	e.up.Enqueue(fakeopenai.Fault{HoldAfter: 5, Hold: hold, Held: held})
	body := `{"model":"gpt-test","stream":true,"max_tokens":200,"messages":[{"role":"user","content":"tell a long story"}]}`
	res := e.post(context.Background(), "/v1/chat/completions", clientKey, body)
	<-held
	id := res.Header.Get("x-sluice-request-id")
	resv := sluice.Limit{Rate: 1 << 40, Period: DefaultLeaseTTL}
	if got := e.remaining("reservation", sluice.Concurrency, resv); got != 1<<40-1 {
		t.Fatalf("reservation lease not taken: remaining %d", got)
	}
	reserved := promptEstimate(t, body) + 200
	// A peer settles first: it releases the lease and keeps 10 tokens charged.
	tc := e.cfg.Tiers["t"]
	ds, err := e.store.ApplyAll(context.Background(), sluice.OpRefund, []sluice.Request{
		{Key: "{gw:" + e.client + "}:reservation", Algorithm: sluice.Concurrency, Limit: resv, Cost: 1, Lease: id},
		{Key: "{gw:" + e.client + "}:tpm", Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: tc.TPM, Period: time.Minute, Burst: tc.TPMBurst}, Cost: reserved - 10},
	})
	if err != nil || !ds[0].Allowed {
		t.Fatalf("peer settlement: %+v %v", ds, err)
	}
	close(hold)
	_, _ = io.Copy(io.Discard, res.Body)
	s := e.settle()
	if !errors.Is(s.Err, ErrAlreadySettled) {
		t.Fatalf("second settlement: %+v, want ErrAlreadySettled", s)
	}
	if got := e.tpmRemaining(); got != l.TPM-10 {
		t.Fatalf("tpm remaining %d, want %d: the reservation was settled twice", got, l.TPM-10)
	}
	if got := e.remaining("reservation", sluice.Concurrency, resv); got != 1<<40 {
		t.Fatalf("reservation lease left behind: remaining %d", got)
	}
}
