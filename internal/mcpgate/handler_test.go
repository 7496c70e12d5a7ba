package mcpgate_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/mcpgate"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/redisstore"
)

// toolServer is a real MCP server: the official Go SDK's server behind its
// own Streamable HTTP handler (stateful, answering POSTs with event
// streams, as the SDK does by default). It counts the calls that reach it
// and the credentials they came with.
type toolServer struct {
	url     string
	calls   atomic.Int64
	auth    sync.Map // Authorization values seen
	inSlow  chan struct{}
	release chan struct{}
}

func newToolServer(t *testing.T) *toolServer {
	t.Helper()
	ts := &toolServer{inSlow: make(chan struct{}, 16), release: make(chan struct{})}
	s := mcp.NewServer(&mcp.Implementation{Name: "tools", Version: "v1"}, nil)
	type in struct {
		Text string `json:"text"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "search", Description: "searches"}, func(ctx context.Context, _ *mcp.CallToolRequest, a in) (*mcp.CallToolResult, any, error) {
		ts.calls.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "found " + a.Text}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "fetch", Description: "fetches"}, func(ctx context.Context, _ *mcp.CallToolRequest, a in) (*mcp.CallToolResult, any, error) {
		ts.calls.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "fetched"}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "slow", Description: "waits"}, func(ctx context.Context, _ *mcp.CallToolRequest, a in) (*mcp.CallToolResult, any, error) {
		ts.calls.Add(1)
		ts.inSlow <- struct{}{}
		select {
		case <-ts.release:
		case <-ctx.Done():
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ts.auth.Store(r.Header.Get("Authorization"), true)
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	ts.url = srv.URL
	return ts
}

var testKeys = map[string]string{"key-a": "client-a", "key-b": "client-b"}

// testClient is a client with no budgets: its tool calls add nothing.
type testClient string

func (c testClient) ID() string     { return string(c) }
func (c testClient) Prefix() string { return "{t:" + string(c) + "}:" }
func (c testClient) Charges(*http.Request, int, int64) ([]sluice.Request, error) {
	return nil, nil
}
func (c testClient) Decided(string, time.Duration) {}

func auth(r *http.Request) (mcpgate.Client, bool) {
	id, ok := testKeys[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
	return testClient(id), ok
}

// gateway starts one replica of the ingress on store.
func gateway(t *testing.T, store sluice.Store, servers []mcpgate.ServerConfig) string {
	t.Helper()
	h, err := mcpgate.New(mcpgate.Options{Servers: servers, Store: store, Auth: auth,
		Getenv: func(k string) string { return map[string]string{"TOOLS_KEY": "server-secret"}[k] }})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

type bearer struct {
	key  string
	next http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return b.next.RoundTrip(r)
}

// connect opens a session with the official SDK's client through the
// gateway at base, with the gateway key key.
func connect(t *testing.T, base, key string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
	tr := &mcp.StreamableClientTransport{Endpoint: base + "/mcp/tools",
		HTTPClient: &http.Client{Transport: bearer{key, http.DefaultTransport}}, DisableStandaloneSSE: true, MaxRetries: -1}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connect through the gateway: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func callTool(s *mcp.ClientSession, name string) (*mcp.CallToolResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: map[string]any{"text": "x"}})
}

// rateLimited returns the retry_after of a JSON-RPC rate-limit error, or
// fails the test for any other error.
func rateLimited(t *testing.T, err error) float64 {
	t.Helper()
	var we *jsonrpc.Error
	if !errors.As(err, &we) {
		t.Fatalf("want a JSON-RPC error, got %v", err)
	}
	if we.Code != -32029 {
		t.Fatalf("want code -32029 (rate limited), got %d %q", we.Code, we.Message)
	}
	var data struct {
		Type       string  `json:"type"`
		RetryAfter float64 `json:"retry_after"`
	}
	if err := json.Unmarshal(we.Data, &data); err != nil || data.Type != "rate_limited" || data.RetryAfter <= 0 {
		t.Fatalf("error data %s: want type rate_limited and a positive retry_after (%v)", we.Data, err)
	}
	return data.RetryAfter
}

func servers(url string, tools map[string]mcpgate.ToolLimits) []mcpgate.ServerConfig {
	return []mcpgate.ServerConfig{{Name: "tools", URL: url, APIKeyEnv: "TOOLS_KEY", Tools: tools}}
}

// TestToolLimitExactAcrossReplicas: two gateway replicas on one real
// Redis, one SDK session through each with the same key, calling at once:
// exactly the key's rpm reaches the server, the rest are JSON-RPC errors
// with retry_after; another key and another tool have their own counters.
func TestToolLimitExactAcrossReplicas(t *testing.T) {
	rs := redistest.NewStandalone(t)
	store, err := redisstore.New(context.Background(), redisstore.Options{URL: rs.URL(), Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	ts := newToolServer(t)
	cfg := servers(ts.url, map[string]mcpgate.ToolLimits{"search": {RPM: 5}, "*": {RPM: 3}})
	g1, g2 := gateway(t, store, cfg), gateway(t, store, cfg)
	sessions := []*mcp.ClientSession{connect(t, g1, "key-a"), connect(t, g2, "key-a")}

	var ok, limited atomic.Int64
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := callTool(sessions[i%2], "search")
			if err == nil {
				ok.Add(1)
				return
			}
			rateLimited(t, err)
			limited.Add(1)
		}()
	}
	wg.Wait()
	if ok.Load() != 5 || limited.Load() != 11 || ts.calls.Load() != 5 {
		t.Fatalf("admitted %d, limited %d, server saw %d: want exactly 5 of 16 across the replicas", ok.Load(), limited.Load(), ts.calls.Load())
	}
	// Tools not named share "*": 3 of fetch, then refused.
	for i := range 4 {
		_, err := callTool(sessions[i%2], "fetch")
		if i < 3 && err != nil {
			t.Fatalf("fetch %d: %v", i, err)
		}
		if i == 3 {
			rateLimited(t, err)
		}
	}
	// Another key is not touched by key-a's use.
	b := connect(t, g2, "key-b")
	if _, err := callTool(b, "search"); err != nil {
		t.Fatalf("key-b's first search: %v", err)
	}
	if ts.calls.Load() != 9 {
		t.Fatalf("server saw %d calls, want 9", ts.calls.Load())
	}
	// The server got the gateway's credential, never a client's key.
	ts.auth.Range(func(k, _ any) bool {
		if k != "Bearer server-secret" {
			t.Errorf("server saw Authorization %q, want only the gateway's", k)
		}
		return true
	})
}

// TestDeniedCallKeepsSession: the denial is a JSON-RPC error, not an HTTP
// error, so the SDK's session lives on: the same session lists tools and,
// when retry_after has passed, calls again.
func TestDeniedCallKeepsSession(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	store, err := memstore.New(memstore.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	ts := newToolServer(t)
	g := gateway(t, store, servers(ts.url, map[string]mcpgate.ToolLimits{"search": {RPM: 1}}))
	s := connect(t, g, "key-a")
	if _, err := callTool(s, "search"); err != nil {
		t.Fatal(err)
	}
	_, err = callTool(s, "search")
	wait := rateLimited(t, err)
	if wait < 59 || wait > 60 {
		t.Fatalf("retry_after %.3f s, want the minute's refill (60 s)", wait)
	}
	if _, err := s.ListTools(context.Background(), nil); err != nil {
		t.Fatalf("the session did not survive its denied call: %v", err)
	}
	clk.Advance(time.Duration(wait * float64(time.Second)))
	res, err := callTool(s, "search")
	if err != nil {
		t.Fatalf("after retry_after: %v", err)
	}
	if txt := res.Content[0].(*mcp.TextContent).Text; txt != "found x" {
		t.Fatalf("result %q", txt)
	}
}

// TestConcurrencyHeld: with concurrency 2, a third call while two are in
// the server is refused at once, and a slot comes back when a call ends.
func TestConcurrencyHeld(t *testing.T) {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ts := newToolServer(t)
	g := gateway(t, store, servers(ts.url, map[string]mcpgate.ToolLimits{"slow": {Concurrency: 2}}))
	s := connect(t, g, "key-a")
	errs := make(chan error, 2)
	for range 2 {
		go func() { _, err := callTool(s, "slow"); errs <- err }()
	}
	<-ts.inSlow
	<-ts.inSlow
	_, err = callTool(s, "slow")
	rateLimited(t, err)
	close(ts.release)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if _, err := callTool(s, "slow"); err != nil {
		t.Fatalf("after the two ended: %v", err)
	}
	<-ts.inSlow
}

// rawServer records what reaches it and answers every POST with an empty
// JSON-RPC result per request, as a server of protocol 2025-03-26 (which
// allowed batches) does.
func rawServer(t *testing.T) (string, *atomic.Int64) {
	var posts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Mcp-Session-Id", "upstream-session")
		_, _ = w.Write([]byte(`[{"jsonrpc":"2.0","id":1,"result":{}}]`))
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &posts
}

func post(t *testing.T, url, key, sid, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-03-26")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func batchOf(tools ...string) string {
	var parts []string
	for i, tool := range tools {
		parts = append(parts, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q}}`, i+1, tool))
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// TestBatchCountedPerCall: a JSON-RPC batch (MCP 2025-03-26) is counted
// call by call and decided all or nothing: three calls under an rpm of 2
// send nothing and answer three errors; two calls then go in one POST.
func TestBatchCountedPerCall(t *testing.T) {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	url, posts := rawServer(t)
	g := gateway(t, store, servers(url, map[string]mcpgate.ToolLimits{"search": {RPM: 2}}))
	resp, body := post(t, g+"/mcp/tools", "key-a", "", batchOf("search", "search", "search"))
	var answers []struct {
		ID    int `json:"id"`
		Error struct {
			Code int `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &answers); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d body %s: %v", resp.StatusCode, body, err)
	}
	if len(answers) != 3 || posts.Load() != 0 {
		t.Fatalf("%d answers, %d posts reached the server: want 3 errors and none sent", len(answers), posts.Load())
	}
	for _, a := range answers {
		if a.Error.Code != -32029 {
			t.Fatalf("answer %d: code %d", a.ID, a.Error.Code)
		}
	}
	if resp.Header.Get("Retry-After") == "" {
		t.Fatal("no Retry-After header")
	}
	if resp, _ := post(t, g+"/mcp/tools", "key-a", "", batchOf("search", "search")); resp.StatusCode != 200 || posts.Load() != 1 {
		t.Fatalf("a batch within the limit: status %d, %d posts", resp.StatusCode, posts.Load())
	}
	if _, body := post(t, g+"/mcp/tools", "key-a", "", batchOf("search")); !strings.Contains(body, "-32029") {
		t.Fatalf("the limit's third call went through: %s", body)
	}
}

// TestSessionBoundToKey: a session id is usable only with the key that
// opened it; another valid key gets 404, as for an unknown session.
func TestSessionBoundToKey(t *testing.T) {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	url, posts := rawServer(t)
	g := gateway(t, store, servers(url, nil))
	resp, _ := post(t, g+"/mcp/tools", "key-a", "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`)
	sid := resp.Header.Get("Mcp-Session-Id")
	if sid == "" || strings.Contains(sid, "key-a") {
		t.Fatalf("session id %q", sid)
	}
	if resp, _ := post(t, g+"/mcp/tools", "key-b", sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("another key's use of the session: %d, want 404", resp.StatusCode)
	}
	if resp, _ := post(t, g+"/mcp/tools", "key-a", sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); resp.StatusCode != 200 || posts.Load() != 2 {
		t.Fatalf("the owner's use: %d, %d posts", resp.StatusCode, posts.Load())
	}
}

// TestBadInput: no key, an unknown server, a bad tool name, a body over
// the bound and broken JSON get clear errors, and nothing reaches the
// server.
func TestBadInput(t *testing.T) {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	url, posts := rawServer(t)
	g := gateway(t, store, servers(url, map[string]mcpgate.ToolLimits{"*": {RPM: 100}}))
	call := func(name string) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":%q}}`, name)
	}
	for _, tc := range []struct {
		name, path, key, body string
		status                int
		want                  string
	}{
		{"no key", "/mcp/tools", "nope", call("search"), 401, "-32001"},
		{"unknown server", "/mcp/other", "key-a", call("search"), 404, "no MCP server"},
		{"long tool name", "/mcp/tools", "key-a", call(strings.Repeat("a", 129)), 200, "-32602"},
		{"odd tool name", "/mcp/tools", "key-a", call("a b"), 200, "-32602"},
		{"broken JSON", "/mcp/tools", "key-a", `{"jsonrpc":`, 400, "-32700"},
		{"huge body", "/mcp/tools", "key-a", call("x") + strings.Repeat(" ", mcpgate.DefaultMaxBodyBytes), 413, "bytes"},
		{"huge batch", "/mcp/tools", "key-a", batchOf(strings.Split(strings.Repeat("s,", mcpgate.MaxBatch+1), ",")[:mcpgate.MaxBatch+1]...), 400, "batch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := post(t, g+tc.path, tc.key, "", tc.body)
			if resp.StatusCode != tc.status || !strings.Contains(body, tc.want) {
				t.Fatalf("status %d body %.200s: want %d and %q", resp.StatusCode, body, tc.status, tc.want)
			}
		})
	}
	if posts.Load() != 0 {
		t.Fatalf("%d bad requests reached the server", posts.Load())
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    mcpgate.ServerConfig
		want string
	}{
		{"bad name", mcpgate.ServerConfig{Name: "a/b", URL: "http://x"}, "name"},
		{"bad url", mcpgate.ServerConfig{Name: "a", URL: "ftp://x"}, "url"},
		{"bad tool", mcpgate.ServerConfig{Name: "a", URL: "http://x", Tools: map[string]mcpgate.ToolLimits{"a b": {RPM: 1}}}, "tool name"},
		{"negative", mcpgate.ServerConfig{Name: "a", URL: "http://x", Tools: map[string]mcpgate.ToolLimits{"t": {RPM: -1}}}, "negative"},
		{"no limit", mcpgate.ServerConfig{Name: "a", URL: "http://x", Tools: map[string]mcpgate.ToolLimits{"t": {}}}, "no limit"},
	} {
		err := mcpgate.Validate([]mcpgate.ServerConfig{tc.s})
		if !errors.Is(err, mcpgate.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if err := mcpgate.Validate([]mcpgate.ServerConfig{{Name: "a", URL: "http://x"}, {Name: "a", URL: "http://y"}}); !errors.Is(err, mcpgate.ErrInvalidConfig) {
		t.Error("a name used twice passed")
	}
}

// recorder is a client that records how its calls were decided.
type recorder struct {
	testClient
	mu      sync.Mutex
	limited []string
}

func (r *recorder) Decided(limit string, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.limited = append(r.limited, limit)
}

// TestDecidedNamesServerAndTool: the console is told each decision, a
// refusal by the limit's server, tool and kind, a tool not configured
// as "other", so that its rows are per server and tool and bounded.
func TestDecidedNamesServerAndTool(t *testing.T) {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	url, _ := rawServer(t)
	rec := &recorder{testClient: "client-a"}
	h, err := mcpgate.New(mcpgate.Options{Servers: servers(url, map[string]mcpgate.ToolLimits{"search": {RPM: 1}, "*": {RPD: 1}}), Store: store,
		Auth: func(*http.Request) (mcpgate.Client, bool) { return rec, true }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	for _, tool := range []string{"search", "search", "random-1", "random-2"} {
		post(t, srv.URL+"/mcp/tools", "key-a", "", fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":%q}}`, tool))
	}
	want := []string{"", "mcp:tools/search:rpm", "", "mcp:tools/other:rpd"}
	if fmt.Sprint(rec.limited) != fmt.Sprint(want) {
		t.Fatalf("decisions %q, want %q", rec.limited, want)
	}
}

// TestInFlightPerKeyBounded: GET streams (unmetered, one held for a
// session's life) past Options.MaxInFlightPerKey of one key are refused with 429,
// another key's are not, and a stream that ends frees its place.
func TestInFlightPerKeyBounded(t *testing.T) {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		select { // an MCP server's GET stream lasts as long as the session
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() { close(release) })
	h, err := mcpgate.New(mcpgate.Options{Servers: servers(up.URL, nil), Store: store, Auth: auth, MaxInFlightPerKey: 4})
	if err != nil {
		t.Fatal(err)
	}
	gsrv := httptest.NewServer(h)
	t.Cleanup(gsrv.Close)
	g := gsrv.URL
	get := func(key string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, g+"/mcp/tools", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Accept", "text/event-stream")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	var open []*http.Response
	for range 4 {
		res := get("key-a")
		if res.StatusCode != 200 {
			t.Fatalf("stream %d: %d", len(open), res.StatusCode)
		}
		open = append(open, res)
	}
	if res := get("key-a"); res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" {
		t.Fatalf("stream past the bound: %d", res.StatusCode)
	} else {
		res.Body.Close()
	}
	other := get("key-b")
	if other.StatusCode != 200 {
		t.Fatalf("another key's stream: %d", other.StatusCode)
	}
	other.Body.Close()
	open[0].Body.Close() // the client ends one stream
	deadline := time.Now().Add(10 * time.Second)
	for {
		res := get("key-a")
		if res.StatusCode == 200 {
			res.Body.Close()
			break
		}
		res.Body.Close()
		if time.Now().After(deadline) {
			t.Fatal("a freed place was never given again")
		}
		time.Sleep(10 * time.Millisecond) // the gateway notices the closed stream asynchronously
	}
	for _, res := range open[1:] {
		res.Body.Close()
	}
}
