package mcpgate_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-io/sluice/internal/mcpgate"
	"github.com/sluice-io/sluice/internal/nodesdk"
	"github.com/sluice-io/sluice/memstore"
)

// mcpNodeSDK is the official MCP TypeScript SDK the test runs, pinned.
const mcpNodeSDK = "1.32.2"

// TestNodeSDKAgent: an agent on the official MCP TypeScript SDK
// (@modelcontextprotocol/sdk on npm), unmodified, through the gateway to a
// server on the official Go SDK: tools listed, a call served, the next
// one over rpm 1 surfaced as an McpError with code -32029 and retry_after
// in its data, and the session still usable afterwards.
func TestNodeSDKAgent(t *testing.T) {
	node, dir := nodesdk.Dir(t, "@modelcontextprotocol/sdk", mcpNodeSDK)
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ts := newToolServer(t)
	g := gateway(t, store, servers(ts.url, map[string]mcpgate.ToolLimits{"search": {RPM: 1}}))
	script, err := os.ReadFile(filepath.Join("testdata", "agent.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	out := nodesdk.Run(t, node, dir, script, "SLUICE_MCP_URL="+g+"/mcp/tools", "SLUICE_API_KEY=key-a")
	var res struct {
		Tools  []string
		First  string
		Second struct {
			Code int
			Data struct {
				Type       string
				RetryAfter float64 `json:"retry_after"`
			}
		}
		After int
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("agent printed %q: %v", out, err)
	}
	if len(res.Tools) != 3 || res.First != "found x" || res.Second.Code != -32029 || res.Second.Data.Type != "rate_limited" ||
		res.Second.Data.RetryAfter <= 0 || res.After != 3 || ts.calls.Load() != 1 {
		t.Fatalf("agent saw %+v; the server got %d calls", res, ts.calls.Load())
	}
}
