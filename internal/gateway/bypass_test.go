package gateway

import (
	"context"
	"encoding/json"
	"math"
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
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/redisstore"
)

// envFactory starts a gateway environment with limits l in front of a fake
// upstream with options o.
type envFactory func(t *testing.T, l Limits, o fakeopenai.Options) *env

// bypassStores runs test on the memory store and on a real Redis.
func bypassStores(t *testing.T, test func(t *testing.T, newEnv envFactory)) {
	t.Run("memory", func(t *testing.T) { test(t, newEnv) })
	t.Run("redis", func(t *testing.T) {
		url := redistest.Standalone(t).URL()
		test(t, func(t *testing.T, l Limits, o fakeopenai.Options) *env {
			clk := clock.NewFake(time.Unix(1_700_000_000, 0))
			st, err := redisstore.New(context.Background(), redisstore.Options{
				URL: url, Clock: clk, DisableDenyCache: true, Timeout: 5 * time.Second,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			if o.APIKey == "" {
				o.APIKey = upstreamKey
			}
			// A client id of its own: tests share the Redis server.
			client := sluice.HashKey(redistest.Prefix(t))[:20]
			return newEnvUpstream(t, l, fakeopenai.New(t, o), st, clk, client)
		})
	})
}

// worstCase is the most tokens an upstream could spend on a forwarded
// body: the prompt estimate plus the largest completion budget times the
// most choices, read both the exact way and the case-insensitive way of
// encoding/json's struct decoding (a Go upstream's), in math that cannot
// wrap (float64 is enough to tell "fits in 1000" apart). ok is false when
// the body names no budget (the gateway reserves its default, capped).
func worstCase(t *testing.T, body []byte) (tokens float64, ok bool) {
	t.Helper()
	var exact map[string]json.RawMessage
	_ = json.Unmarshal(body, &exact)
	var loose struct {
		MaxTokens           *float64 `json:"max_tokens"`
		MaxCompletionTokens *float64 `json:"max_completion_tokens"`
		MaxOutputTokens     *float64 `json:"max_output_tokens"`
		N                   *float64 `json:"n"`
		BestOf              *float64 `json:"best_of"`
	}
	_ = json.Unmarshal(body, &loose)
	budget, choices := 0.0, 1.0
	for _, name := range []string{"max_tokens", "max_completion_tokens", "max_output_tokens"} {
		var v float64
		if json.Unmarshal(exact[name], &v) == nil {
			budget, ok = math.Max(budget, v), true
		}
	}
	for _, v := range []*float64{loose.MaxTokens, loose.MaxCompletionTokens, loose.MaxOutputTokens} {
		if v != nil {
			budget, ok = math.Max(budget, *v), true
		}
	}
	for _, name := range []string{"n", "best_of"} {
		var v float64
		if json.Unmarshal(exact[name], &v) == nil {
			choices = math.Max(choices, v)
		}
	}
	for _, v := range []*float64{loose.N, loose.BestOf} {
		if v != nil {
			choices = math.Max(choices, *v)
		}
	}
	var r aitoken.Request
	_ = json.Unmarshal(body, &r)
	return float64(r.PromptTokens()) + budget*choices, ok
}

// do sends one request with any method and Authorization value.
func (e *env) do(method, path, auth, body string, hdr http.Header) *http.Response {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { res.Body.Close() })
	return res
}

const (
	maxInt64 = "9223372036854775807"
	pow62    = "4611686018427387904"
	msgs     = `"messages":[{"role":"user","content":"hi"}]`
)

// TestBypassGatewayTokens: each row is a request a hostile client sends to
// get more tokens than its tier allows. Whatever the row, a request that
// reaches the upstream was reserved at least the most tokens the upstream
// could spend on it, and the reservation fits the token burst; a request
// that could never fit is refused with x-should-retry: false.
func TestBypassGatewayTokens(t *testing.T) { bypassStores(t, testBypassGatewayTokens) }

func testBypassGatewayTokens(t *testing.T, newEnv envFactory) {
	const burst = 1000
	rows := []struct {
		name, method, path, body string
		status                   int
		code                     string // the error code, "" for 200
	}{
		{"max_tokens 2^63-1 (wrapped to a 1-token reservation)", "POST", "/v1/chat/completions",
			`{"model":"gpt-test",` + msgs + `,"max_tokens":` + maxInt64 + `}`, 429, "request_too_large"},
		{"max_tokens 2^62 times n 2", "POST", "/v1/chat/completions",
			`{"model":"gpt-test",` + msgs + `,"max_tokens":` + pow62 + `,"n":2}`, 429, "request_too_large"},
		{"max_tokens 2^62 times n 4 (wraps to 0)", "POST", "/v1/chat/completions",
			`{"model":"gpt-test",` + msgs + `,"max_tokens":` + pow62 + `,"n":4}`, 429, "request_too_large"},
		{"max_tokens 2^63-1 streamed", "POST", "/v1/chat/completions",
			`{"model":"gpt-test","stream":true,` + msgs + `,"max_tokens":` + maxInt64 + `}`, 429, "request_too_large"},
		{"max_completion_tokens 2^63-1", "POST", "/v1/chat/completions",
			`{"model":"gpt-test",` + msgs + `,"max_completion_tokens":` + maxInt64 + `}`, 429, "request_too_large"},
		{"max_output_tokens 2^63-1 on responses", "POST", "/v1/responses",
			`{"model":"gpt-test","input":"hi","max_output_tokens":` + maxInt64 + `}`, 429, "request_too_large"},
		{"small max_tokens beside a large max_completion_tokens", "POST", "/v1/chat/completions",
			`{"model":"gpt-test",` + msgs + `,"max_tokens":5,"max_completion_tokens":2000}`, 429, "request_too_large"},
		{"best_of multiplies the budget", "POST", "/v1/completions",
			`{"model":"gpt-test","prompt":"hi","max_tokens":400,"best_of":3}`, 429, "request_too_large"},
		{"best_of 2^40", "POST", "/v1/completions",
			`{"model":"gpt-test","prompt":"hi","max_tokens":1,"best_of":1099511627776}`, 400, "invalid_value"},
		{"n beyond the cap is refused, not reserved as 128", "POST", "/v1/chat/completions",
			`{"model":"gpt-test",` + msgs + `,"max_tokens":1,"n":129}`, 400, "invalid_value"},
		{"n 2^62 without max_tokens", "POST", "/v1/chat/completions",
			`{"model":"gpt-test",` + msgs + `,"n":` + pow62 + `}`, 400, "invalid_value"},
		{"n 0", "POST", "/v1/chat/completions", `{"model":"gpt-test",` + msgs + `,"max_tokens":5,"n":0}`, 400, "invalid_value"},
		{"n -1", "POST", "/v1/chat/completions", `{"model":"gpt-test",` + msgs + `,"max_tokens":5,"n":-1}`, 400, "invalid_value"},
		{"max_tokens 0 (no limit to some servers)", "POST", "/v1/chat/completions",
			`{"model":"gpt-test",` + msgs + `,"max_tokens":0}`, 400, "invalid_value"},
		{"max_tokens -1 (infinite to llama.cpp)", "POST", "/v1/chat/completions",
			`{"model":"gpt-test",` + msgs + `,"max_tokens":-1}`, 400, "invalid_value"},
		{"max_tokens 2^64", "POST", "/v1/chat/completions",
			`{"model":"gpt-test",` + msgs + `,"max_tokens":18446744073709551616}`, 400, "invalid_type"},
		{"max_tokens as a float", "POST", "/v1/chat/completions", `{"model":"gpt-test",` + msgs + `,"max_tokens":1.5}`, 400, "invalid_type"},
		{"max_tokens in exponent form", "POST", "/v1/chat/completions", `{"model":"gpt-test",` + msgs + `,"max_tokens":1e9}`, 400, "invalid_type"},
		{"max_tokens as a string", "POST", "/v1/chat/completions", `{"model":"gpt-test",` + msgs + `,"max_tokens":"100000"}`, 400, "invalid_type"},
		{"case variant read by case-insensitive upstreams", "POST", "/v1/chat/completions",
			`{"model":"gpt-test",` + msgs + `,"max_tokens":100000,"MAX_TOKENS":1}`, 400, "invalid_request_error"},
		{"case variant, reversed", "POST", "/v1/chat/completions",
			`{"model":"gpt-test",` + msgs + `,"Max_Tokens":100000,"max_tokens":1}`, 400, "invalid_request_error"},
		{"Unicode folding (long s)", "POST", "/v1/chat/completions",
			`{"model":"gpt-test",` + msgs + `,"max_token\u017f":100000,"max_tokens":1}`, 400, "invalid_request_error"},
		{"case variant of n", "POST", "/v1/chat/completions",
			`{"model":"gpt-test",` + msgs + `,"max_tokens":100,"N":100}`, 400, "invalid_request_error"},
		{"repeated member (a first-wins upstream reads 100000)", "POST", "/v1/chat/completions",
			`{"model":"gpt-test",` + msgs + `,"max_tokens":100000,"max_tokens":5}`, 400, "invalid_request_error"},
		{"repeated member, reversed", "POST", "/v1/chat/completions",
			`{"model":"gpt-test",` + msgs + `,"max_tokens":5,"max_tokens":100000}`, 400, "invalid_request_error"},
		{"escaped member name is the same member, repeated", "POST", "/v1/chat/completions",
			`{"model":"gpt-test",` + msgs + `,"max_tokens":100000,"max\u005ftokens":5}`, 400, "invalid_request_error"},
		{"escaped member name alone", "POST", "/v1/chat/completions",
			`{"model":"gpt-test",` + msgs + `,"max\u005ftokens":5}`, 200, ""},
		{"repeated content in a message (the long one first)", "POST", "/v1/chat/completions",
			`{"model":"gpt-test","messages":[{"role":"user","content":"` + strings.Repeat("long ", 2000) + `","content":"hi"}],"max_tokens":5}`, 400, "invalid_request_error"},
		{"repeated include_usage", "POST", "/v1/chat/completions",
			`{"model":"gpt-test","stream":true,"stream_options":{"include_usage":false,"include_usage":true},` + msgs + `,"max_tokens":5}`, 400, "invalid_request_error"},
		{"invalid UTF-8", "POST", "/v1/chat/completions",
			"{\"model\":\"gpt-test\xff\"," + msgs + `,"max_tokens":5}`, 400, "invalid_json"},
		{"trailing second object", "POST", "/v1/chat/completions",
			`{"model":"gpt-test",` + msgs + `,"max_tokens":5} {"max_tokens":100000}`, 400, "invalid_json"},
		{"body is an array", "POST", "/v1/chat/completions", `[{"model":"gpt-test"}]`, 400, "invalid_json"},
		{"body is null", "POST", "/v1/chat/completions", `null`, 400, "invalid_json"},
		{"n 128 that fits", "POST", "/v1/chat/completions", `{"model":"gpt-test",` + msgs + `,"max_tokens":7,"n":128}`, 200, ""},
		{"embeddings ignore max_tokens", "POST", "/v1/embeddings", `{"model":"gpt-test","input":"hi","max_tokens":` + maxInt64 + `}`, 200, ""},
		{"trailing slash", "POST", "/v1/chat/completions/", `{"model":"gpt-test",` + msgs + `,"max_tokens":100000}`, 404, "unknown_url"},
		{"path in capitals", "POST", "/v1/Chat/Completions", `{"model":"gpt-test",` + msgs + `,"max_tokens":100000}`, 404, "unknown_url"},
		{"path parameter", "POST", "/v1/chat/completions;x=1", `{"model":"gpt-test",` + msgs + `,"max_tokens":100000}`, 404, "unknown_url"},
		{"trailing dot", "POST", "/v1/responses.", `{"model":"gpt-test","input":"x","max_output_tokens":100000}`, 404, "unknown_url"},
		{"dot segment", "POST", "/v1/./chat/completions", `{"model":"gpt-test",` + msgs + `,"max_tokens":100000}`, 404, "unknown_url"},
		{"double slash", "POST", "/v1/chat//completions", `{"model":"gpt-test",` + msgs + `,"max_tokens":100000}`, 404, "unknown_url"},
		{"lower-case method", "post", "/v1/chat/completions", `{"model":"gpt-test",` + msgs + `,"max_tokens":100000}`, 405, "method_not_allowed"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			e := newEnv(t, Limits{RPM: 100, TPM: burst}, fakeopenai.Options{})
			res := e.do(row.method, row.path, "Bearer "+clientKey, row.body, nil)
			if res.StatusCode != row.status {
				t.Fatalf("status %d, want %d", res.StatusCode, row.status)
			}
			if row.status != 200 {
				ae := decodeError(t, res)
				if got := ae.Error.Code; got == nil || *got != row.code {
					t.Fatalf("error %+v, want code %s", ae.Error, row.code)
				}
				if row.status == 429 && res.Header.Get("x-should-retry") != "false" {
					t.Fatalf("x-should-retry %q on a request that can never fit", res.Header.Get("x-should-retry"))
				}
			}
			fwd := e.up.Requests()
			if row.status != 200 {
				if len(fwd) != 0 {
					t.Fatalf("a refused request reached the upstream: %s", fwd[0].Body)
				}
				return
			}
			if len(fwd) != 1 {
				t.Fatalf("upstream saw %d requests", len(fwd))
			}
			s := e.settle()
			worst, explicit := worstCase(t, fwd[0].Body)
			if !explicit {
				worst = float64(s.Reserved) // the default budget, capped at the burst
			}
			if row.path == "/v1/embeddings" {
				worst = float64(promptEstimate(t, string(fwd[0].Body))) // no completion
			}
			if float64(s.Reserved) < worst || s.Reserved > burst {
				t.Fatalf("reserved %d for a request that may take %g tokens (burst %d)", s.Reserved, worst, burst)
			}
		})
	}
}

// TestBypassParallelStreams: parallel streams each reserve what they may
// use, so no more are admitted at once than the token burst holds, however
// large their max_tokens.
func TestBypassParallelStreams(t *testing.T) { bypassStores(t, testBypassParallelStreams) }

func testBypassParallelStreams(t *testing.T, newEnv envFactory) {
	const burst = 1000
	for _, maxTokens := range []string{"400", maxInt64, pow62} {
		t.Run("max_tokens "+maxTokens, func(t *testing.T) {
			hold := make(chan struct{})
			e := newEnv(t, Limits{RPM: 100, TPM: burst, Concurrency: 10}, fakeopenai.Options{
				CompletionTokens: 50, Default: fakeopenai.Fault{HoldAfter: 1, Hold: hold},
			})
			body := `{"model":"gpt-test","stream":true,` + msgs + `,"max_tokens":` + maxTokens + `}`
			var wg sync.WaitGroup
			statuses := make([]int, 4)
			ready := make(chan int, 4)
			for i := range statuses {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res := e.do("POST", "/v1/chat/completions", "Bearer "+clientKey, body, nil)
					statuses[i] = res.StatusCode
					ready <- i
				}()
			}
			for range statuses {
				<-ready // every request has its answer's headers: the admitted hold their reservation
			}
			admitted := 0
			for _, s := range statuses {
				if s == 200 {
					admitted++
				}
			}
			worst, _ := worstCase(t, []byte(body))
			if float64(admitted)*worst > burst {
				t.Errorf("%d streams admitted at once, each may take %g tokens: over the burst %d", admitted, worst, burst)
			}
			if maxTokens == "400" && admitted != 2 {
				t.Errorf("%d streams admitted, want 2 of 412 tokens in a burst of %d", admitted, burst)
			}
			close(hold)
			wg.Wait()
			for range admitted {
				if s := e.settle(); float64(s.Reserved) < worst {
					t.Errorf("stream reserved %d, may take %g", s.Reserved, worst)
				}
			}
		})
	}
}

// TestBypassRequestCount: whatever the spelling of the key, the path or
// the method, a client gets no more requests to a metered path than its
// rpm.
func TestBypassRequestCount(t *testing.T) { bypassStores(t, testBypassRequestCount) }

func testBypassRequestCount(t *testing.T, newEnv envFactory) {
	const rpm = 3
	e := newEnv(t, Limits{RPM: rpm, TPM: 100000}, fakeopenai.Options{})
	body := `{"model":"gpt-test",` + msgs + `,"max_tokens":5}`
	tricks := []struct{ method, path, auth string }{
		{"POST", "/v1/chat/completions", "Bearer " + clientKey},
		{"POST", "/v1/chat/completions", "bearer " + clientKey},
		{"POST", "/v1/chat/completions", "BEARER " + clientKey},
		{"POST", "/v1/chat/completions", "Bearer   " + clientKey + "  "},
		{"POST", "/v1/chat/completions/", "Bearer " + clientKey},
		{"POST", "/v1/CHAT/completions", "Bearer " + clientKey},
		{"Post", "/v1/chat/completions", "Bearer " + clientKey},
		{"POST", "/v1/chat/completions?x=1", "Bearer " + clientKey},
		{"POST", "/v1/chat/completions;v=2", "Bearer " + clientKey},
		{"POST", "/v1/chat/completion%73", "Bearer " + clientKey},
		{"GET", "/v1/chat/completions", "Bearer " + clientKey}, // listing stored completions: refused, generates nothing
	}
	for _, tr := range tricks {
		res := e.do(tr.method, tr.path, tr.auth, body, http.Header{"X-Http-Method-Override": {"POST"}})
		if res.StatusCode == 200 && tr.method == "POST" {
			e.settle()
		}
		if res.StatusCode >= 400 {
			decodeError(t, res) // OpenAI-shaped, whatever the door
		}
	}
	generating := 0
	for _, r := range e.up.Requests() {
		if r.Method == "POST" {
			generating++
		}
		if r.Header.Get("X-Http-Method-Override") != "" {
			t.Errorf("a method override reached the upstream")
		}
	}
	if generating != rpm {
		t.Fatalf("%d generating requests reached the upstream, want the rpm %d", generating, rpm)
	}
}

// TestBearerScheme: the scheme is case-insensitive (RFC 9110), anything
// else is 401 with OpenAI's body.
func TestBearerScheme(t *testing.T) {
	e := newEnv(t, Limits{RPM: 100, TPM: 100000}, fakeopenai.Options{})
	body := `{"model":"gpt-test",` + msgs + `,"max_tokens":5}`
	for _, tc := range []struct {
		auth string
		ok   bool
	}{
		{"Bearer " + clientKey, true}, {"bearer " + clientKey, true}, {"BEARER " + clientKey, true},
		{"bEaReR  " + clientKey, true}, {"Basic " + clientKey, false}, {"Bearer", false}, {"Bearer ", false},
		{clientKey, false}, {"Bearer " + clientKey + "x", false}, {"Bearerx " + clientKey, false},
	} {
		res := e.do("POST", "/v1/chat/completions", tc.auth, body, nil)
		if (res.StatusCode == 200) != tc.ok {
			t.Errorf("%q: status %d", tc.auth, res.StatusCode)
		}
		if tc.ok {
			e.settle()
		} else if ae := decodeError(t, res); ae.Error.Code == nil || *ae.Error.Code != "invalid_api_key" {
			t.Errorf("%q: %+v", tc.auth, ae.Error)
		}
	}
}

// TestUpstream429OneSetOfHeaders: on an upstream 429 the client sees the
// gateway's x-ratelimit-* and RateLimit fields once, not the upstream's
// beside them, and the upstream's Retry-After.
func TestUpstream429OneSetOfHeaders(t *testing.T) {
	e := newEnv(t, Limits{RPM: 100, TPM: 100000}, fakeopenai.Options{})
	upstreamHeaders := http.Header{
		"X-Ratelimit-Limit-Requests": {"10000"}, "X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"6m0s"},
		"X-Ratelimit-Limit-Tokens": {"2000000"}, "X-Ratelimit-Remaining-Tokens": {"5"}, "X-Ratelimit-Reset-Tokens": {"1s"},
		"Ratelimit": {`"upstream";r=0;t=1`}, "Ratelimit-Policy": {`"upstream";q=10000;w=60`},
	}
	for _, status := range []int{429, 500, 200} {
		e.up.Enqueue(fakeopenai.Fault{Status: status, RetryAfter: "7", Header: upstreamHeaders})
		res := e.do("POST", "/v1/chat/completions", "Bearer "+clientKey, `{"model":"gpt-test",`+msgs+`,"max_tokens":5}`, nil)
		e.settle()
		if res.StatusCode != status {
			t.Fatalf("status %d, want %d", res.StatusCode, status)
		}
		for k := range upstreamHeaders {
			if vs := res.Header.Values(k); len(vs) != 1 || vs[0] == upstreamHeaders.Get(k) {
				t.Errorf("%d: %s = %q, want the gateway's one value", status, k, vs)
			}
		}
		if res.Header.Get("X-Ratelimit-Limit-Requests") != "100" {
			t.Errorf("%d: x-ratelimit-limit-requests %q", status, res.Header.Get("X-Ratelimit-Limit-Requests"))
		}
		if status == 429 && res.Header.Get("Retry-After") != "7" {
			t.Errorf("upstream Retry-After %q not passed through", res.Header.Get("Retry-After"))
		}
	}
}

// TestErrorsAreOpenAIShaped: every door of the gateway's listener answers
// errors with OpenAI's JSON body; the body-size 413 and the token-size 429
// have distinct codes.
func TestErrorsAreOpenAIShaped(t *testing.T) {
	e := newEnv(t, Limits{RPM: 100, TPM: 1000}, fakeopenai.Options{})
	srv := &Server{Gateway: e.gw, ServeMetrics: true}
	e.srv = httptest.NewServer(srv.Handler())
	t.Cleanup(e.srv.Close)
	e.cfg.MaxBodyBytes = 64 // the gateway reads its Config
	cases := []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"GET", "/", "", 404, "unknown_url"},
		{"GET", "/nope", "", 404, "unknown_url"},
		{"POST", "/healthz", "", 404, "unknown_url"},
		{"DELETE", "/metrics", "", 404, "unknown_url"},
		{"POST", "/v2/chat/completions", "{}", 404, "unknown_url"},
		{"POST", "/v1/chat/completions", `{"model":"gpt-test","messages":[{"role":"user","content":"` + strings.Repeat("x", 100) + `"}]}`, 413, "request_body_too_large"},
		{"POST", "/v1/chat/completions", `{"model":"gpt-test","max_tokens":2000}`, 429, "request_too_large"},
		{"POST", "/v1/chat/completions", `{"max_tokens":20}`, 400, "missing_required_parameter"},
		{"POST", "/v1/chat/completions", `{"model":1}`, 400, "invalid_type"},
		{"POST", "/v1/chat/completions", `{"model":"gpt-test","stream":true,"stream_options":3}`, 400, "invalid_type"},
	}
	for _, tc := range cases {
		res := e.do(tc.method, tc.path, "Bearer "+clientKey, tc.body, nil)
		if res.StatusCode != tc.status {
			t.Errorf("%s %s: status %d, want %d", tc.method, tc.path, res.StatusCode, tc.status)
			continue
		}
		if ae := decodeError(t, res); ae.Error.Code == nil || *ae.Error.Code != tc.code {
			t.Errorf("%s %s: %+v, want code %s", tc.method, tc.path, ae.Error, tc.code)
		}
		if ct := res.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s %s: Content-Type %q", tc.method, tc.path, ct)
		}
	}
	if n := e.up.Count(); n != 0 {
		t.Errorf("upstream saw %d requests", n)
	}
}

// OpenAI's Batch API would run a batch's requests upstream on the
// gateway's key, past every limit and budget: creating or cancelling a
// batch is refused in every spelling, and nothing reaches the upstream.
// Reading batches (GET) still passes through.
func TestBatchesRefused(t *testing.T) {
	e := newEnv(t, Limits{RPM: 100, TPM: 100000}, fakeopenai.Options{})
	body := `{"input_file_id":"file-1","endpoint":"/v1/chat/completions","completion_window":"24h"}`
	for _, p := range []string{"/v1/batches", "/v1/Batches", "/v1//batches", "/v1/./batches", "/v1/batches/", "/v1/batches;x",
		"/v1/%62atches", "/v1/chat/../batches", "/v1/batches/batch_1/cancel"} {
		res := e.do("POST", p, "Bearer "+clientKey, body, nil)
		var b struct {
			Error struct{ Code string } `json:"error"`
		}
		_ = json.NewDecoder(res.Body).Decode(&b)
		if res.StatusCode != http.StatusNotFound || b.Error.Code != "unknown_url" {
			t.Errorf("POST %s: %d %q, want 404 unknown_url", p, res.StatusCode, b.Error.Code)
		}
	}
	if n := e.up.Count(); n != 0 {
		t.Fatalf("%d batch requests reached the upstream", n)
	}
	// Nor are the batches listed: every client's batches run on the one
	// upstream key (TestSharedReadsRefused).
	if res := e.do("GET", "/v1/batches", "Bearer "+clientKey, "", nil); res.StatusCode != http.StatusNotFound || e.up.Count() != 0 {
		t.Fatalf("GET /v1/batches: %d, upstream saw %d; want 404 and none", res.StatusCode, e.up.Count())
	}
}

// Reads pass through only for the model list: the gateway's one upstream
// key is every client's, so GET /v1/files, stored completions, batches or
// vector stores would list and fetch other tenants' data. A passthrough
// prefix opens its reads (and writes), as the operator chose.
func TestSharedReadsRefused(t *testing.T) {
	e := newEnv(t, Limits{RPM: 100, TPM: 100000}, fakeopenai.Options{})
	for _, p := range []string{
		"/v1/files", "/v1/files/file-1/content", "/v1/chat/completions", "/v1/chat/completions/chatcmpl-1/messages",
		"/v1/batches", "/v1/vector_stores", "/v1/responses/resp_1", "/v1/models/../files", "/v1/Models/../files",
		"/v1/models/..;/files", "/v1/modelsx",
	} {
		for _, m := range []string{"GET", "HEAD"} {
			if res := e.do(m, p, "Bearer "+clientKey, "", nil); res.StatusCode != http.StatusNotFound {
				t.Errorf("%s %s: %d, want 404", m, p, res.StatusCode)
			}
		}
	}
	if n := e.up.Count(); n != 0 {
		t.Fatalf("%d shared reads reached the upstream", n)
	}
	for i, p := range []string{"/v1/models", "/v1/models/gpt-test", "/v1/Models"} {
		e.do("GET", p, "Bearer "+clientKey, "", nil)
		if n := e.up.Count(); n != i+1 {
			t.Fatalf("GET %s did not pass through (upstream saw %d)", p, n)
		}
	}
	e.cfg.Passthrough = []string{"/v1/files"}
	e.do("GET", "/v1/files/file-1/content", "Bearer "+clientKey, "", nil)
	if n := e.up.Count(); n != 4 {
		t.Fatalf("GET under a passthrough prefix did not pass (upstream saw %d)", n)
	}
}

// A path the gateway does not meter passes reads only: a POST to
// /v1/images/generations or a DELETE of a fine-tuned model would run on
// the gateway's upstream key past every limit. The passthrough setting
// opens a prefix to every method, on segment boundaries only.
func TestUnmeteredWritesRefused(t *testing.T) {
	e := newEnv(t, Limits{RPM: 1, TPM: 100000}, fakeopenai.Options{})
	refused := []struct{ method, path string }{
		{"POST", "/v1/images/generations"}, {"POST", "/v1/audio/speech"}, {"POST", "/v1/fine_tuning/jobs"},
		{"DELETE", "/v1/models/ft:gpt-test:acme"}, {"PUT", "/v1/files/file-1"}, {"PATCH", "/v1/x"},
		{"POST", "/v1/Images/Generations"}, {"POST", "/v1/files"}, {"POST", "/v1/filesx"},
	}
	for _, c := range refused {
		res := e.do(c.method, c.path, "Bearer "+clientKey, `{"prompt":"a cat"}`, nil)
		if res.StatusCode != http.StatusNotFound {
			t.Errorf("%s %s: %d, want 404", c.method, c.path, res.StatusCode)
		}
	}
	// The Realtime API's WebSocket upgrade is a GET, but no read.
	ws := http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Version": {"13"}, "Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}}
	if res := e.do("GET", "/v1/realtime?model=gpt-test", "Bearer "+clientKey, "", ws); res.StatusCode != http.StatusNotFound {
		t.Errorf("GET /v1/realtime upgrade: %d, want 404", res.StatusCode)
	}
	if n := e.up.Count(); n != 0 {
		t.Fatalf("%d unmetered writes reached the upstream", n)
	}
	if res := e.do("GET", "/v1/models", "Bearer "+clientKey, "", nil); res.StatusCode != 200 || e.up.Count() != 1 {
		t.Fatalf("GET /v1/models: %d, upstream saw %d", res.StatusCode, e.up.Count())
	}
	e.cfg.Passthrough = []string{"/v1/files"}
	for _, p := range []string{"/v1/files", "/v1/files/file-1/content", "/v1//files"} {
		e.do("POST", p, "Bearer "+clientKey, `{}`, nil)
	}
	if res := e.do("POST", "/v1/filesx", "Bearer "+clientKey, `{}`, nil); res.StatusCode != http.StatusNotFound {
		t.Fatalf("POST /v1/filesx with /v1/files passed through: %d", res.StatusCode)
	}
	if n := e.up.Count(); n != 4 {
		t.Fatalf("upstream saw %d requests, want 4 (GET models and 3 under /v1/files)", n)
	}
	// Bad settings are refused with their field named.
	for _, bad := range []string{"v1/files", "/v1/Files", "/v1/files/", "/v1/chat", "/v1/messages", "/v1/batches", "/v1/../x"} {
		cfg := *e.cfg
		cfg.Passthrough = []string{bad}
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "passthrough[0]") {
			t.Errorf("passthrough %q: %v, want an error at passthrough[0]", bad, err)
		}
	}
}
