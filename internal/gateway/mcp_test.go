package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/memstore"
)

type bearerRT struct {
	key  string
	next http.RoundTripper
}

func (b bearerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return b.next.RoundTrip(r)
}

// TestMCPThroughGateway: an MCP server behind the gateway's listener
// (Server.Handler, Host check included), configured in mcp_servers, used
// by the official Go SDK's client with its gateway key: tools listed and
// called, the second call over rpm 1 refused as a JSON-RPC error, and a
// wrong key refused before the server.
func TestMCPThroughGateway(t *testing.T) {
	var calls atomic.Int64
	ms := mcp.NewServer(&mcp.Implementation{Name: "docs", Version: "v1"}, nil)
	mcp.AddTool(ms, &mcp.Tool{Name: "lookup"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		calls.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
	})
	mcpSrv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return ms }, nil))
	t.Cleanup(mcpSrv.Close)
	up := fakeopenai.New(t, fakeopenai.Options{})

	cfg, err := Parse("test.yaml", []byte(fmt.Sprintf(`
upstream: {base_url: %s/v1}
tiers: {t: {rpm: 100}}
keys: [{name: one, hash: %s, tier: t}]
mcp_servers:
  - name: docs
    url: %s
    tools: {lookup: {rpm: 1}}
`, up.URL(), sluice.HashKey(clientKey), mcpSrv.URL)))
	if err != nil {
		t.Fatal(err)
	}
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	gw, err := New(Options{Config: cfg, Store: st, Getenv: func(string) string { return upstreamKey }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer((&Server{Gateway: gw, Addr: "127.0.0.1:0"}).Handler())
	t.Cleanup(srv.Close)

	connect := func(key string) (*mcp.ClientSession, error) {
		c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp/docs", MaxRetries: -1, DisableStandaloneSSE: true,
			HTTPClient: &http.Client{Transport: bearerRT{key, http.DefaultTransport}}}, nil)
	}
	if _, err := connect("sk-wrong"); err == nil {
		t.Fatal("a wrong key connected")
	}
	s, err := connect(clientKey)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	tools, err := s.ListTools(ctx, nil)
	if err != nil || len(tools.Tools) != 1 || tools.Tools[0].Name != "lookup" {
		t.Fatalf("tools/list: %v %+v", err, tools)
	}
	if _, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "lookup"}); err != nil {
		t.Fatal(err)
	}
	_, err = s.CallTool(ctx, &mcp.CallToolParams{Name: "lookup"})
	var we *jsonrpc.Error
	if !errors.As(err, &we) || we.Code != -32029 {
		t.Fatalf("second call: %v, want the JSON-RPC rate-limit error", err)
	}
	if calls.Load() != 1 {
		t.Fatalf("the server saw %d calls, want 1", calls.Load())
	}
}
