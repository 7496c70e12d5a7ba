package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/fakeanthropic"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/memstore"
)

// newEnvHandler puts a gateway on the memory store in front of an
// upstream of the test's own, h: one that misbehaves in ways the fake
// upstream does not script. tune, when not nil, changes the configuration
// first. e.up is nil.
func newEnvHandler(t *testing.T, l Limits, h http.Handler, tune func(*Config)) *env {
	t.Helper()
	up := httptest.NewServer(h)
	t.Cleanup(up.Close)
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	st, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	cfg := &Config{
		Upstream: UpstreamConfig{BaseURL: up.URL + "/v1", APIKeyEnv: "TEST_UPSTREAM_KEY"},
		Models:   []string{"gpt-test"},
		Store:    StoreConfig{Timeout: 5 * time.Second},
		Tiers:    map[string]TierConfig{"t": Tier(l)},
		Keys:     []KeyConfig{{Name: "test", Hash: sluice.HashKey(clientKey), Tier: "t"}},
	}
	if tune != nil {
		tune(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, store: st, clk: clk, cfg: cfg, client: cfg.Keys[0].Client, settled: make(chan Settlement, 100)}
	e.gw, e.srv, e.upTransport = startGateway(t, cfg, st, func(string) string { return upstreamKey }, func(s Settlement) { e.settled <- s })
	return e
}

// A streamed event longer than the relay's 64 KiB line buffer used to
// pass through unread. The responses API's response.completed event
// carries the whole response, the request's instructions and tools
// echoed, before its usage: a client that sent 64 KiB of instructions, or
// asked for a long answer, had its usage go unseen and was charged the
// estimate, with the reasoning tokens and any input the gateway cannot
// see (previous_response_id) free. Now the long event is relayed as it
// comes and parsed once whole; one too long to keep (over 16 MiB) leaves
// at least the reservation charged.
func TestSSELongUsageEvent(t *testing.T) {
	for _, tc := range []struct {
		name   string
		echo   int // bytes of instructions echoed in response.completed
		usage  bool
		relays bool
	}{
		{"usage after 80 KiB", 80 << 10, true, true},
		{"usage after 2 MiB", 2 << 20, true, true},
		{"event past the bound", maxSSELine + 1, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sent bytes.Buffer
			fmt.Fprintf(&sent, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n")
			fmt.Fprintf(&sent, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"instructions\":%q,"+
				"\"usage\":{\"input_tokens\":50000,\"output_tokens\":3000,\"output_tokens_details\":{\"reasoning_tokens\":2999}}}}\n\n",
				strings.Repeat("x", tc.echo))
			e := newEnvHandler(t, Limits{RPM: 100, TPM: 1 << 30}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = w.Write(sent.Bytes())
			}), nil)
			res := e.post(context.Background(), "/v1/responses", clientKey, `{"model":"gpt-test","stream":true,"input":"hi","max_output_tokens":4000}`)
			got, err := io.ReadAll(res.Body)
			if err != nil || !bytes.Equal(got, sent.Bytes()) {
				t.Fatalf("relayed %d bytes (%v), want the upstream's %d unchanged", len(got), err, sent.Len())
			}
			s := e.settle()
			if tc.usage {
				if !s.UsageReported || s.PromptTokens != 50000 || s.CompletionTokens != 3000 || s.Actual != 53000 {
					t.Fatalf("settled %+v, want the upstream's usage 50000+3000", s)
				}
				return
			}
			if s.Actual < s.Reserved {
				t.Fatalf("settled %d for an unread event that may have held the usage, reserved %d", s.Actual, s.Reserved)
			}
		})
	}
}

// A request's concurrency slot and reservation are leases of lease_ttl.
// A stream that outlived it (a long generation, or a client reading its
// stream slowly, which holds the upstream) lost its slot while it ran: a
// client with a concurrency limit of 1 could hold any number of streams,
// and the late settlement found its lease lapsed and refunded nothing.
// Now the leases of a request in flight are renewed every lease_ttl/3
// (here every millisecond, the store's clock moved by hand).
func TestBypassLongStreamKeepsSlot(t *testing.T) { bypassStores(t, testBypassLongStreamKeepsSlot) }

func testBypassLongStreamKeepsSlot(t *testing.T, newEnv envFactory) {
	hold, held := make(chan struct{}), make(chan struct{})
	e := newEnv(t, Limits{RPM: 100, TPM: 100000, Concurrency: 1}, fakeopenai.Options{
		CompletionTokens: 5, Default: fakeopenai.Fault{HoldAfter: 1, Hold: hold, Held: held},
	})
	renewed := make(chan struct{}, 1)
	e.gw.renewEvery = time.Millisecond
	e.gw.onRenew = func() {
		select {
		case renewed <- struct{}{}:
		default:
		}
	}
	// waitRenewal returns once a renewal has run wholly after the call.
	waitRenewal := func() {
		select {
		case <-renewed:
		default:
		}
		for range 2 { // the second began after the first ended, so after the call
			select {
			case <-renewed:
			case <-time.After(10 * time.Second):
				t.Fatal("no lease renewal within 10s")
			}
		}
	}
	stream := `{"model":"gpt-test","stream":true,` + msgs + `,"max_tokens":5}`
	first := make(chan []byte)
	go func() {
		res := e.do("POST", "/v1/chat/completions", "Bearer "+clientKey, stream, nil)
		b, _ := io.ReadAll(res.Body)
		first <- b
	}()
	<-held
	ttl := e.cfg.LeaseTTL
	for range 3 { // 1.5 lease_ttl in all
		e.clk.Advance(ttl / 2)
		waitRenewal()
	}
	e.up.Enqueue(fakeopenai.Fault{}) // not held, were it forwarded
	res := e.do("POST", "/v1/chat/completions", "Bearer "+clientKey, `{"model":"gpt-test",`+msgs+`,"max_tokens":5}`, nil)
	if res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a second request while the first streams for 1.5 lease_ttl: %d, want 429 (concurrency 1)", res.StatusCode)
	}
	close(hold)
	if b := <-first; !bytes.Contains(b, []byte("[DONE]")) {
		t.Fatalf("the long stream was cut: %q", b)
	}
	if s := e.settle(); s.Err != nil || !s.UsageReported {
		t.Fatalf("the long stream's settlement: %+v, want its lease held and its usage settled", s)
	}
	if n := e.up.Count(); n != 1 {
		t.Fatalf("upstream saw %d requests, want 1", n)
	}
	// Settled: the slot is free, and no renewal took it again.
	e.clk.Advance(time.Second)
	if res := e.do("POST", "/v1/chat/completions", "Bearer "+clientKey, `{"model":"gpt-test",`+msgs+`,"max_tokens":5}`, nil); res.StatusCode != 200 {
		t.Fatalf("a request after the stream settled: %d", res.StatusCode)
	}
	e.settle()
}

// Input the reservation did not count: a structured output's schema
// (response_format, the responses API's text.format), a predicted output
// (billed as completion when rejected) and a completion's suffix reach the
// model, but the prompt estimate read messages, prompt, input,
// instructions and tools only. A client put thousands of tokens there
// beside max_tokens 1 and was reserved a handful, so parallel requests
// passed the token burst and a dollar budget's hard stop, charged only
// after the fact. Now they are counted as raw JSON text.
func TestBypassHiddenInput(t *testing.T) { bypassStores(t, testBypassHiddenInput) }

func testBypassHiddenInput(t *testing.T, newEnv envFactory) {
	const burst = 1000
	big := strings.Repeat("describe the field in great detail ", 400) // some 2400 tokens
	schema := `{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{"a":{"type":"string","description":"` + big + `"}}}}}`
	for _, tc := range []struct{ name, path, body string }{
		{"response_format schema", "/v1/chat/completions", `{"model":"gpt-test",` + msgs + `,"max_tokens":1,"response_format":` + schema + `}`},
		{"responses text.format schema", "/v1/responses", `{"model":"gpt-test","input":"hi","max_output_tokens":1,"text":{"format":` + schema + `}}`},
		{"prediction", "/v1/chat/completions", `{"model":"gpt-test",` + msgs + `,"max_completion_tokens":1,"prediction":{"type":"content","content":"` + big + `"}}`},
		{"completion suffix", "/v1/completions", `{"model":"gpt-test","prompt":"hi","max_tokens":1,"suffix":"` + big + `"}`},
		{"streamed", "/v1/chat/completions", `{"model":"gpt-test","stream":true,` + msgs + `,"max_tokens":1,"response_format":` + schema + `}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Limits{RPM: 100, TPM: burst}, fakeopenai.Options{})
			res := e.do("POST", tc.path, "Bearer "+clientKey, tc.body, nil)
			if res.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("status %d, want 429 request_too_large: the request carries some 2400 tokens of input", res.StatusCode)
			}
			if ae := decodeError(t, res); ae.Error.Code == nil || *ae.Error.Code != "request_too_large" {
				t.Fatalf("%+v, want request_too_large", ae.Error)
			}
			if n := e.up.Count(); n != 0 {
				t.Fatalf("upstream saw %d requests", n)
			}
		})
	}
	// A small schema still fits, reserved with its tokens.
	e := newEnv(t, Limits{RPM: 100, TPM: burst}, fakeopenai.Options{})
	small := `{"type":"json_object"}`
	plain := `{"model":"gpt-test",` + msgs + `,"max_tokens":5}`
	res := e.do("POST", "/v1/chat/completions", "Bearer "+clientKey, plain, nil)
	if res.StatusCode != 200 {
		t.Fatalf("plain request: %d", res.StatusCode)
	}
	without := e.settle().Reserved
	res = e.do("POST", "/v1/chat/completions", "Bearer "+clientKey, `{"model":"gpt-test",`+msgs+`,"max_tokens":5,"response_format":`+small+`}`, nil)
	if res.StatusCode != 200 {
		t.Fatalf("with a small response_format: %d", res.StatusCode)
	}
	if with := e.settle().Reserved; with <= without {
		t.Fatalf("reserved %d with a response_format, %d without", with, without)
	}
}

// ambiguousMember finds a name repeated in one object at any depth, in
// small objects and in large ones (a set past 16 members), escapes
// decoded; the same name in different objects is no repetition.
func TestAmbiguousMember(t *testing.T) {
	var wide strings.Builder
	for i := range 40 {
		fmt.Fprintf(&wide, `"k%d":%d,`, i, i)
	}
	fields := []string{"max_tokens", "model"}
	for _, tc := range []struct {
		body, name, field string
		dup               bool
	}{
		{`{"model":"m","max_tokens":1}`, "", "", false},
		{`{"model":"m","max_tokens":1,"max_tokens":2}`, "max_tokens", "", true},
		{`{"max_tokens":1,"max\u005ftokens":2}`, "max_tokens", "", true},
		{`{"MAX_TOKENS":1,"max_tokens":2}`, "MAX_TOKENS", "max_tokens", false},
		{`{"a":{"x":1,"y":{"x":2}},"b":{"x":3},"c":[{"x":1},{"x":2}]}`, "", "", false},
		{`{"a":[{"x":1,"y":2,"x":3}]}`, "x", "", true},
		{`{"a":{"b":{"c":{"d":1,"d":2}}}}`, "d", "", true},
		{`{"s":"{\"x\":1,\"x\":2}","t":"\"x\""}`, "", "", false}, // inside strings
		{`{` + wide.String() + `"k39x":1}`, "", "", false},
		{`{` + wide.String() + `"k7":1}`, "k7", "", true},
		{`{"o":{` + wide.String() + `"k3\u0039":1}}`, "k39", "", true},
		{`{"o":{` + wide.String() + `"z":1},"p":{` + wide.String() + `"z":1}}`, "", "", false},
	} {
		name, field, dup := ambiguousMember([]byte(tc.body), fields)
		if name != tc.name || field != tc.field || dup != tc.dup {
			t.Errorf("%.60s: %q %q %v, want %q %q %v", tc.body, name, field, dup, tc.name, tc.field, tc.dup)
		}
	}
	if _, err := parseAnthropicBody([]byte(`{"model":"claude-x","max_tokens":1,"messages":[],"max_tokens":100000}`), epMessages); err == nil {
		t.Errorf("a Messages body with max_tokens twice was accepted")
	}
}

// An upstream 429 or 5xx refunded the request as well as its tokens, so
// while the upstream refused, a client's rpm did not bound what it sent:
// each request was admitted again as soon as the last one settled, and
// all of them reached the upstream (a shared upstream account counts the
// refused requests too, keeping it throttled for every other key). Now a
// request the upstream answered counts; its tokens are still refunded.
func TestBypassUpstreamRefusals(t *testing.T) { bypassStores(t, testBypassUpstreamRefusals) }

func testBypassUpstreamRefusals(t *testing.T, newEnv envFactory) {
	const rpm = 3
	for _, status := range []int{429, 500, 503} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			e := newEnv(t, Limits{RPM: rpm, TPM: 100000}, fakeopenai.Options{Default: fakeopenai.Fault{Status: status}})
			gatewayRefused := 0
			for range 10 {
				before := e.up.Count()
				res := e.do("POST", "/v1/chat/completions", "Bearer "+clientKey, `{"model":"gpt-test",`+msgs+`,"max_tokens":5}`, nil)
				if e.up.Count() > before {
					if s := e.settle(); s.Actual != 0 {
						t.Fatalf("an upstream %d charged %d tokens", status, s.Actual)
					}
					continue
				}
				if res.StatusCode != http.StatusTooManyRequests {
					t.Fatalf("status %d from the gateway", res.StatusCode)
				}
				gatewayRefused++
			}
			if n := e.up.Count(); n != rpm || gatewayRefused != 10-rpm {
				t.Fatalf("upstream saw %d requests, the gateway refused %d: want the rpm %d through", n, gatewayRefused, rpm)
			}
		})
	}
}

// An upstream that had the request but did not answer it: past
// upstream.timeout it may still be generating (and billing), so the
// reservation stays charged, not refunded; a connection dropped after the
// request was read charges the prompt. Either way the request counts. Only
// a request the upstream never received is refunded whole
// (TestUpstreamErrorsRefund).
func TestUpstreamSilentAfterRequest(t *testing.T) {
	body := `{"model":"gpt-test",` + msgs + `,"max_tokens":500}`
	for _, tc := range []struct {
		name    string
		h       http.HandlerFunc
		timeout time.Duration
	}{
		{"no headers within upstream.timeout", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done()
		}, 50 * time.Millisecond},
		{"connection dropped after the request", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			panic(http.ErrAbortHandler)
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := Limits{RPM: 10, TPM: 100000}
			e := newEnvHandler(t, l, tc.h, func(c *Config) { c.Upstream.Timeout = tc.timeout })
			res := e.post(context.Background(), "/v1/chat/completions", clientKey, body)
			if res.StatusCode != http.StatusBadGateway {
				t.Fatalf("status %d, want 502", res.StatusCode)
			}
			s := e.settle()
			want := s.Reserved
			if tc.timeout == 0 {
				want = promptEstimate(t, body)
			}
			if s.Actual != want {
				t.Fatalf("charged %d tokens (reserved %d), want %d", s.Actual, s.Reserved, want)
			}
			if got := e.remaining("rpm", sluice.GCRA, sluice.PerMinute(l.RPM)); got != l.RPM-1 {
				t.Fatalf("rpm left %d, want %d: the upstream had the request", got, l.RPM-1)
			}
		})
	}
}

// A body with a Content-Encoding was read as JSON here and forwarded with
// its Content-Encoding, for the upstream to decode first: the gateway
// reserved from one reading and the upstream ran another (a raw deflate or
// brotli stream can be made that is also valid JSON). Any coding but
// identity is now refused, 415, and nothing is forwarded.
func TestBypassContentEncoding(t *testing.T) { bypassStores(t, testBypassContentEncoding) }

func testBypassContentEncoding(t *testing.T, newEnv envFactory) {
	e := newEnv(t, Limits{RPM: 100, TPM: 100000}, fakeopenai.Options{})
	body := `{"model":"gpt-test",` + msgs + `,"max_tokens":5}`
	for _, enc := range [][]string{{"deflate"}, {"br"}, {"gzip"}, {"identity, gzip"}, {"identity", "zstd"}, {"x-custom"}} {
		res := e.do("POST", "/v1/chat/completions", "Bearer "+clientKey, body, http.Header{"Content-Encoding": enc})
		if res.StatusCode != http.StatusUnsupportedMediaType {
			t.Errorf("Content-Encoding %q: status %d, want 415", enc, res.StatusCode)
			if res.StatusCode == 200 {
				e.settle()
			}
			continue
		}
		if ae := decodeError(t, res); ae.Error.Code == nil || *ae.Error.Code != "unsupported_content_encoding" {
			t.Errorf("Content-Encoding %q: %+v", enc, ae.Error)
		}
	}
	if n := e.up.Count(); n != 0 {
		t.Fatalf("%d encoded bodies reached the upstream", n)
	}
	for _, enc := range []string{"identity", "IDENTITY"} {
		if res := e.do("POST", "/v1/chat/completions", "Bearer "+clientKey, body, http.Header{"Content-Encoding": {enc}}); res.StatusCode != 200 {
			t.Fatalf("Content-Encoding %s: status %d", enc, res.StatusCode)
		}
		e.settle()
	}
}

// An upstream reporting a negative usage number was read as 0: the
// request was charged nothing and its whole reservation refunded. Such a
// usage is not believed now: the request settles as if none was
// reported (a JSON answer keeps its reservation, a stream its estimate).
func TestUpstreamNegativeUsage(t *testing.T) {
	for _, tc := range []struct{ name, ctype, body, req string }{
		{"json", "application/json",
			`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok ok ok"}}],"usage":{"prompt_tokens":-1000,"completion_tokens":-5,"total_tokens":-1}}`,
			`{"model":"gpt-test",` + msgs + `,"max_tokens":300}`},
		{"detail", "application/json",
			`{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"completion_tokens_details":{"reasoning_tokens":-9}}}`,
			`{"model":"gpt-test",` + msgs + `,"max_tokens":300}`},
		{"stream", "text/event-stream",
			"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok ok ok\"}}]}\n\n" +
				"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":-1000,\"completion_tokens\":-5,\"total_tokens\":-1}}\n\ndata: [DONE]\n\n",
			`{"model":"gpt-test","stream":true,` + msgs + `,"max_tokens":300}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvHandler(t, Limits{RPM: 10, TPM: 100000}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.ctype)
				_, _ = io.WriteString(w, tc.body)
			}), nil)
			res := e.post(context.Background(), "/v1/chat/completions", clientKey, tc.req)
			_, _ = io.Copy(io.Discard, res.Body)
			s := e.settle()
			if s.UsageReported || s.Actual <= 0 {
				t.Fatalf("settled %+v: a negative usage believed", s)
			}
			if tc.ctype == "application/json" && s.Actual != s.Reserved {
				t.Fatalf("charged %d, want the reservation %d", s.Actual, s.Reserved)
			}
		})
	}
}

// Anthropic's structured output schema (output_format, output_config)
// reaches the model too, and is counted like OpenAI's response_format.
func TestBypassHiddenInputAnthropic(t *testing.T) {
	up := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey})
	e := newAnthEnv(t, Limits{RPM: 100, TPM: 1000}, up, nil, "")
	schema := `{"type":"json_schema","schema":{"type":"object","properties":{"a":{"type":"string","description":"` +
		strings.Repeat("describe the field in great detail ", 400) + `"}}}}`
	for _, member := range []string{"output_format", "output_config"} {
		body := `{"model":"claude-test","max_tokens":1,"messages":[{"role":"user","content":"hi"}],"` + member + `":` + schema + `}`
		res := e.post(context.Background(), "/v1/messages", clientKey, body)
		if res.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("%s: status %d, want 429: some 2400 tokens of input", member, res.StatusCode)
		}
		if ae := decodeAnthError(t, res); ae.Error.Type != "rate_limit_error" || res.Header.Get("x-should-retry") != "false" {
			t.Fatalf("%s: %+v", member, ae)
		}
	}
	if n := up.Count(); n != 0 {
		t.Fatalf("upstream saw %d requests", n)
	}
}

// A model's limits and budgets were matched on its exact name, but its
// price on the name without a dated snapshot suffix: a client limited on
// gpt-test escaped the model's tpm and its model budget by naming
// gpt-test-2024-08-06, which the upstream serves as the same model and
// the gateway priced as it. A limit on a model now covers its snapshots.
func TestBypassModelSnapshot(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey})
	st := fakeClockStore(t)
	e := newBudgetEnv(t, `
upstream: {base_url: %[1]s, api_key_env: UP}
store: {timeout: 5s}
prices: {gpt-test: {input: 1000, output: 1000}, gpt-test-mini: {input: 1, output: 1}}
tiers: {t: {rpm: 100, tpm: 1000000, models: {gpt-test: {tpm: 100}}, budgets: [{usd: 1000, per: day}, {usd: 0.05, per: day, model: gpt-test}]}}
keys: [{name: one, hash: %[2]s, tier: t}]
`, up, st)
	for _, model := range []string{"gpt-test", "gpt-test-2024-08-06", "gpt-test-20240806"} {
		// Over the model's tpm burst of 100.
		res := e.do(0, "POST", "/v1/chat/completions", clientKey, `{"model":"`+model+`",`+msgs+`,"max_tokens":500}`)
		if res.StatusCode != http.StatusTooManyRequests {
			t.Errorf("%s, 500 tokens against the model's tpm 100: status %d, want 429", model, res.StatusCode)
		}
		// Within the tpm, over the model's $0.05 budget ($0.001 a token).
		res = e.do(0, "POST", "/v1/chat/completions", clientKey, `{"model":"`+model+`",`+msgs+`,"max_tokens":90}`)
		if res.StatusCode != http.StatusTooManyRequests {
			t.Errorf("%s, $0.09 against the model's $0.05 budget: status %d, want 429", model, res.StatusCode)
		}
		// Within both: admitted, the model's limits in the headers.
		res = e.do(0, "POST", "/v1/chat/completions", clientKey, `{"model":"`+model+`",`+msgs+`,"max_tokens":5}`)
		if res.StatusCode != 200 {
			t.Fatalf("%s, 5 tokens: status %d", model, res.StatusCode)
		}
		e.settle()
		if !strings.Contains(res.Header.Get("Ratelimit-Policy"), "tpm:gpt-test") {
			t.Errorf("%s: RateLimit-Policy %q does not name the model's tpm", model, res.Header.Get("Ratelimit-Policy"))
		}
	}
	if n := up.Count(); n != 3 {
		t.Fatalf("upstream saw %d requests, want the 3 that fit", n)
	}
	// Another model is not a snapshot of gpt-test.
	if res := e.do(0, "POST", "/v1/chat/completions", clientKey, `{"model":"gpt-test-mini",`+msgs+`,"max_tokens":500}`); res.StatusCode != 200 {
		t.Fatalf("gpt-test-mini: status %d", res.StatusCode)
	}
	e.settle()
}

// The client's Content-Type went upstream with the body the gateway had
// read as JSON: sent as a form, the body's fields could be read from
// inside a JSON string ("content":"&max_tokens=100000&") by an upstream
// that parses forms. A metered request now always goes as
// application/json.
func TestBypassContentType(t *testing.T) { bypassStores(t, testBypassContentType) }

func testBypassContentType(t *testing.T, newEnv envFactory) {
	e := newEnv(t, Limits{RPM: 100, TPM: 100000}, fakeopenai.Options{})
	body := `{"model":"gpt-test","messages":[{"role":"user","content":"&model=gpt-test&max_tokens=100000&n=128&"}],"max_tokens":5}`
	for _, ct := range []string{"application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "text/plain", ""} {
		req, err := http.NewRequest("POST", e.srv.URL+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+clientKey)
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("Content-Type %q: status %d", ct, res.StatusCode)
		}
		e.settle()
	}
	for _, r := range e.up.Requests() {
		if got := r.Header.Values("Content-Type"); len(got) != 1 || got[0] != "application/json" {
			t.Errorf("upstream got Content-Type %q, want application/json", got)
		}
	}
}

// OpenAI's priority processing (service_tier "priority", per request) is
// billed up to twice a model's standard price, which is all the price
// table knows: a key under a $0.05 budget could spend about $0.10 on the
// shared upstream account. A request under a budget may not ask for a
// dearer tier; without a budget (no price involved) it still may.
func TestBypassServiceTier(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey})
	st := fakeClockStore(t)
	e := newBudgetEnv(t, `
upstream: {base_url: %[1]s, api_key_env: UP}
store: {timeout: 5s}
prices: {gpt-test: {input: 1, output: 1}}
tiers: {t: {rpm: 100, budgets: [{usd: 5, per: day}]}, free: {rpm: 100}}
keys: [{name: one, hash: %[2]s, tier: t}, {name: two, hash: %[3]s, tier: free}]
`, up, st)
	for _, tier := range []string{`"priority"`, `"scale"`, `"PRIORITY"`} {
		res := e.do(0, "POST", "/v1/chat/completions", clientKey, `{"model":"gpt-test",`+msgs+`,"max_tokens":5,"service_tier":`+tier+`}`)
		var b struct {
			Error struct{ Code string } `json:"error"`
		}
		_ = json.NewDecoder(res.Body).Decode(&b)
		if res.StatusCode != http.StatusBadRequest || b.Error.Code != "unsupported_service_tier" {
			t.Errorf("service_tier %s under a budget: %d %q, want 400 unsupported_service_tier", tier, res.StatusCode, b.Error.Code)
		}
	}
	if n := up.Count(); n != 0 {
		t.Fatalf("upstream saw %d requests", n)
	}
	for _, tier := range []string{`"flex"`, `"auto"`, `"default"`, `null`} {
		if res := e.do(0, "POST", "/v1/chat/completions", clientKey, `{"model":"gpt-test",`+msgs+`,"max_tokens":5,"service_tier":`+tier+`}`); res.StatusCode != 200 {
			t.Errorf("service_tier %s under a budget: %d", tier, res.StatusCode)
		} else {
			e.settle()
		}
	}
	if res := e.do(0, "POST", "/v1/chat/completions", clientKey2, `{"model":"gpt-test",`+msgs+`,"max_tokens":5,"service_tier":"priority"}`); res.StatusCode != 200 {
		t.Fatalf("service_tier priority without a budget: %d", res.StatusCode)
	}
	e.settle()
}

// Anthropic bills a cache write that lives an hour ("cache_control":
// {"type":"ephemeral","ttl":"1h"}) at twice the input price, a 5-minute
// one at 1.25 times; the gateway weighed every write at 1.25, so a client
// writing its prompt for an hour was charged 1250 of every 2000 tokens
// billed, on tpm and on budgets. Now 1-hour writes weigh 2, in the
// reservation and from usage's cache_creation breakdown.
func TestAnthropicHourCacheWrites(t *testing.T) {
	for _, tc := range []struct {
		name       string
		w5m, w1h   int64
		wantPrompt int64
	}{
		{"5-minute writes", 1000, 0, 10 + 1250},
		{"1-hour writes", 0, 1000, 10 + 2000},
		{"both", 400, 600, 10 + 500 + 1200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvHandler(t, Limits{RPM: 10, TPM: 1000000}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"ok"}],"model":"claude-test",`+
					`"stop_reason":"end_turn","usage":{"input_tokens":10,"cache_creation_input_tokens":%d,"cache_read_input_tokens":0,`+
					`"cache_creation":{"ephemeral_5m_input_tokens":%d,"ephemeral_1h_input_tokens":%d},"output_tokens":5}}`, tc.w5m+tc.w1h, tc.w5m, tc.w1h)
			}), nil)
			res := e.post(context.Background(), "/v1/messages", clientKey,
				`{"model":"claude-test","max_tokens":5,"system":[{"type":"text","text":"be brief","cache_control":{"type":"ephemeral","ttl":"1h"}}],"messages":[{"role":"user","content":"hi"}]}`)
			_, _ = io.Copy(io.Discard, res.Body)
			if res.StatusCode != 200 {
				t.Fatalf("status %d", res.StatusCode)
			}
			if s := e.settle(); !s.UsageReported || s.PromptTokens != tc.wantPrompt {
				t.Fatalf("settled prompt %d (%+v), want %d", s.PromptTokens, s, tc.wantPrompt)
			}
		})
	}
	// The reservation: every input token may be written for an hour.
	p5, err5 := parseAnthropicBody([]byte(`{"model":"claude-test","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"`+
		strings.Repeat("word ", 400)+`","cache_control":{"type":"ephemeral"}}]}]}`), epMessages)
	p1, err1 := parseAnthropicBody([]byte(`{"model":"claude-test","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"`+
		strings.Repeat("word ", 400)+`","cache_control":{"type":"ephemeral","ttl":"1h"}}]}]}`), epMessages)
	if err5 != nil || err1 != nil {
		t.Fatal(err5, err1)
	}
	if raw := p5.promptEst * 4 / 5; p1.promptEst < 2*raw {
		t.Fatalf("estimate with a 1-hour cache write %d, want at least twice the raw %d", p1.promptEst, raw)
	}
}

// A responses request with background: true runs on upstream after its
// request returns or its client leaves, and its final usage is read with
// GET /v1/responses/{id}, which does not pass the gateway's metering. A
// client that set no max_output_tokens had the default reserved but
// nothing forwarded to bound the run; one that left its stream at once
// was refunded down to the prompt while the response ran to the end. Now
// a background request is forwarded with the cap it reserved, and keeps
// its reservation unless its usage passes through.
func TestBypassBackgroundResponse(t *testing.T) { bypassStores(t, testBypassBackgroundResponse) }

func testBypassBackgroundResponse(t *testing.T, newEnv envFactory) {
	hold, held := make(chan struct{}), make(chan struct{})
	defer close(hold)
	e := newEnv(t, Limits{RPM: 100, TPM: 100000}, fakeopenai.Options{
		CompletionTokens: 50, Default: fakeopenai.Fault{HoldAfter: 1, Hold: hold, Held: held},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, "POST", e.srv.URL+"/v1/responses",
			strings.NewReader(`{"model":"gpt-test","input":"hi","background":true,"stream":true}`))
		req.Header.Set("Authorization", "Bearer "+clientKey)
		if res, err := http.DefaultClient.Do(req); err == nil { // canceled before or after the headers
			_, _ = io.Copy(io.Discard, res.Body)
			_ = res.Body.Close()
		}
	}()
	<-held
	cancel() // the client leaves; a background response runs on
	<-done
	s := e.settle()
	if s.Actual != s.Reserved {
		t.Fatalf("a background response whose client left charged %d of its reservation %d", s.Actual, s.Reserved)
	}
	fwd := e.up.Requests()
	var sent struct {
		MaxOutputTokens *int64 `json:"max_output_tokens"`
	}
	if err := json.Unmarshal(fwd[0].Body, &sent); err != nil || sent.MaxOutputTokens == nil || *sent.MaxOutputTokens != s.Reserved-promptEstimate(t, `{"input":"hi"}`) {
		t.Fatalf("forwarded %s (%v), want max_output_tokens the reserved completion", fwd[0].Body, err)
	}
}

// A completions prompt may be a batch: an array of strings or of token
// arrays, each prompt getting its own n completions. The reservation
// counted one completion budget whatever the batch, so ten prompts with
// max_tokens 200 reserved about 200 tokens and the upstream generated
// 2000. Now each prompt of a batch is a choice of its own.
func TestBypassPromptBatch(t *testing.T) { bypassStores(t, testBypassPromptBatch) }

func testBypassPromptBatch(t *testing.T, newEnv envFactory) {
	const burst = 1000
	ten := `"a","b","c","d","e","f","g","h","i","j"`
	for _, tc := range []struct {
		name, prompt string
		fits         bool
	}{
		{"ten strings", `[` + ten + `]`, false},
		{"ten token arrays", `[[1],[2],[3],[4],[5],[6],[7],[8],[9],[10]]`, false},
		{"one prompt's token ids", `[1,2,3,4,5,6,7,8,9,10]`, true},
		{"one string", `"a b c d e f g h i j"`, true},
		{"one string in an array", `["a"]`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Limits{RPM: 100, TPM: burst}, fakeopenai.Options{})
			res := e.do("POST", "/v1/completions", "Bearer "+clientKey, `{"model":"gpt-test","prompt":`+tc.prompt+`,"max_tokens":200}`, nil)
			if !tc.fits {
				if res.StatusCode != http.StatusTooManyRequests {
					t.Fatalf("status %d, want 429: 10 prompts of 200 tokens each against a burst of %d", res.StatusCode, burst)
				}
				if n := e.up.Count(); n != 0 {
					t.Fatalf("upstream saw %d requests", n)
				}
				return
			}
			if res.StatusCode != 200 {
				t.Fatalf("status %d", res.StatusCode)
			}
			if s := e.settle(); s.Reserved < 200 || s.Reserved >= 400 {
				t.Fatalf("reserved %d for one prompt of max_tokens 200", s.Reserved)
			}
		})
	}
	// Two prompts of 200 with n 2 fit 4×200 = 800 in the burst.
	e := newEnv(t, Limits{RPM: 100, TPM: burst}, fakeopenai.Options{})
	res := e.do("POST", "/v1/completions", "Bearer "+clientKey, `{"model":"gpt-test","prompt":["a","b"],"n":2,"max_tokens":200}`, nil)
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	if s := e.settle(); s.Reserved < 800 {
		t.Fatalf("reserved %d for 2 prompts × n 2 × 200", s.Reserved)
	}
}

// An upstream that encodes its answer past what the transport decodes
// (Content-Encoding br or zstd, unasked): the relay saw no lines in the
// stream and charged the prompt estimate alone. Now an answer the
// gateway cannot read keeps its reservation.
func TestUpstreamEncodedAnswer(t *testing.T) {
	for _, tc := range []struct{ name, ctype, req string }{
		{"stream", "text/event-stream", `{"model":"gpt-test","stream":true,` + msgs + `,"max_tokens":300}`},
		{"json", "application/json", `{"model":"gpt-test",` + msgs + `,"max_tokens":300}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvHandler(t, Limits{RPM: 10, TPM: 100000}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.ctype)
				w.Header().Set("Content-Encoding", "br")
				_, _ = w.Write([]byte{0x8b, 0x7f, 0x00, 0x1f, 0xff, 0x03})
			}), nil)
			res := e.post(context.Background(), "/v1/chat/completions", clientKey, tc.req)
			_, _ = io.Copy(io.Discard, res.Body)
			if s := e.settle(); s.Actual != s.Reserved {
				t.Fatalf("an unreadable answer charged %d of its reservation %d", s.Actual, s.Reserved)
			}
		})
	}
}

// Audio input and output tokens (gpt-4o-audio's modalities: ["audio"], an
// input_audio part) are billed many times a model's text price, which is
// all a budget charges: a key could spend several times its budget. A
// request under a budget may not carry audio; without a budget it still
// may.
func TestBypassAudioUnderBudget(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey})
	st := fakeClockStore(t)
	e := newBudgetEnv(t, `
upstream: {base_url: %[1]s, api_key_env: UP}
store: {timeout: 5s}
prices: {gpt-test: {input: 1, output: 1}}
tiers: {t: {rpm: 100, budgets: [{usd: 5, per: day}]}, free: {rpm: 100}}
keys: [{name: one, hash: %[2]s, tier: t}, {name: two, hash: %[3]s, tier: free}]
`, up, st)
	audio := []string{
		`{"model":"gpt-test",` + msgs + `,"max_tokens":5,"modalities":["text","audio"],"audio":{"voice":"alloy","format":"wav"}}`,
		`{"model":"gpt-test",` + msgs + `,"max_tokens":5,"audio":{"voice":"alloy","format":"wav"}}`,
		`{"model":"gpt-test","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}],"max_tokens":5}`,
	}
	for _, body := range audio {
		res := e.do(0, "POST", "/v1/chat/completions", clientKey, body)
		var b struct {
			Error struct{ Code string } `json:"error"`
		}
		_ = json.NewDecoder(res.Body).Decode(&b)
		if res.StatusCode != http.StatusBadRequest || b.Error.Code != "unsupported_modality" {
			t.Errorf("%.80s under a budget: %d %q, want 400 unsupported_modality", body, res.StatusCode, b.Error.Code)
		}
	}
	if n := up.Count(); n != 0 {
		t.Fatalf("upstream saw %d requests", n)
	}
	for _, body := range []string{`{"model":"gpt-test",` + msgs + `,"max_tokens":5,"modalities":["text"],"audio":null}`} {
		if res := e.do(0, "POST", "/v1/chat/completions", clientKey, body); res.StatusCode != 200 {
			t.Fatalf("text only under a budget: %d", res.StatusCode)
		}
		e.settle()
	}
	for _, body := range audio {
		if res := e.do(0, "POST", "/v1/chat/completions", clientKey2, body); res.StatusCode != 200 {
			t.Fatalf("audio without a budget: %d", res.StatusCode)
		}
		e.settle()
	}
}
