package gateway

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/nodesdk"
	"github.com/sluice-io/sluice/internal/upstream"
)

// nodeSDKVersion is the official OpenAI Node SDK the Node test runs,
// pinned exactly.
const nodeSDKVersion = "7.55.0"

// nodeSDKDir returns node and a directory holding node_modules/openai at
// nodeSDKVersion (package nodesdk: installed once under the user's cache
// directory; the test skips, saying why, without node, npm or registry).
func nodeSDKDir(t *testing.T) (node, dir string) {
	t.Helper()
	return nodesdk.Dir(t, "openai", nodeSDKVersion)
}

// nodeChatResult is what testdata/nodesdk/chat.mjs prints.
type nodeChatResult struct {
	Stream struct {
		Content          string
		Chunks           int
		CompletionTokens int `json:"completion_tokens"`
	}
	JSON struct {
		Content          string
		CompletionTokens int `json:"completion_tokens"`
	}
}

// runNodeChat runs testdata/nodesdk/chat.mjs against baseURL. The script
// goes to node on stdin, as an ES module resolved from dir, so that
// `import OpenAI from 'openai'` finds the cached install and nothing is
// written into the repository.
func runNodeChat(t *testing.T, node, dir, baseURL string) nodeChatResult {
	t.Helper()
	script, err := os.ReadFile(filepath.Join("testdata", "nodesdk", "chat.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	out := nodesdk.Run(t, node, dir, script, "SLUICE_BASE_URL="+baseURL, "SLUICE_API_KEY="+clientKey)
	var res nodeChatResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("node chat.mjs printed %q: %v", out, err)
	}
	return res
}

// TestPoolOpenAINodeSDK: the official OpenAI Node SDK (openai on npm,
// pinned to nodeSDKVersion), unmodified and with its own retries off,
// against a pool of two OpenAI upstreams whose first answers 503: the
// stream fails over before its first byte and arrives whole, then a JSON
// completion; each upstream gets its own model id and the upstream key,
// never the client's.
func TestPoolOpenAINodeSDK(t *testing.T) {
	node, dir := nodeSDKDir(t)
	a, b := fakeopenai.New(t, fakeopenai.Options{CompletionTokens: 6}), fakeopenai.New(t, fakeopenai.Options{CompletionTokens: 6})
	a.Enqueue(fakeopenai.Fault{Status: 503})
	cfg := poolConfig(t, []*fakeopenai.Server{a, b}, upstream.Limits{RPM: 100, TPM: 100000})
	cfg.Routing.Policy = upstream.PolicyLatency // up0 first: no latency known, stable order
	_, srv := poolGateway(t, cfg, memStore(t), 0, nil)

	res := runNodeChat(t, node, dir, srv.URL+"/v1")
	want := strings.Repeat("tok ", 6)
	if res.Stream.Content != want || res.Stream.CompletionTokens != 6 || res.Stream.Chunks < 6 {
		t.Fatalf("stream %+v", res.Stream)
	}
	if res.JSON.Content != want || res.JSON.CompletionTokens != 6 {
		t.Fatalf("json %+v", res.JSON)
	}
	// The stream went to up0 (503), then up1; the JSON request then went
	// to up1 first, up0 being marked down on this replica.
	if a.Count() != 1 || b.Count() != 2 {
		t.Fatalf("up0 got %d, up1 %d", a.Count(), b.Count())
	}
	for i, up := range []*fakeopenai.Server{a, b} {
		reqs := up.Requests()
		for j, r := range reqs {
			var body struct {
				Model  string
				Stream bool
			}
			if err := json.Unmarshal(r.Body, &body); err != nil {
				t.Fatalf("up%d request %d: %v", i, j, err)
			}
			// up0 and up1's first request are the stream; up1's second is JSON.
			wantStream := j == 0
			if r.Path != "/v1/chat/completions" || body.Model != fmt.Sprintf("gpt-test-%d", i) || body.Stream != wantStream ||
				r.Authorization != "Bearer "+upstreamKey || strings.Contains(string(r.Body), clientKey) {
				t.Fatalf("up%d request %d: %s %s %q %s", i, j, r.Method, r.Path, r.Authorization, r.Body)
			}
		}
	}
}
