package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/upstream"
)

// nodeSDKVersion is the official OpenAI Node SDK the Node test runs,
// pinned exactly.
const nodeSDKVersion = "7.55.0"

// nodeSDKDir returns a directory holding node_modules/openai at
// nodeSDKVersion, installed once with npm under the user's cache
// directory (sluice-node-sdk/openai@VERSION) and reused by later runs; it
// skips the test, saying why, when node or npm is missing or the install
// fails (no registry).
func nodeSDKDir(t *testing.T) (node, dir string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skipf("node not found (%v): the official OpenAI Node SDK test needs Node.js and npm", err)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Skipf("no user cache directory for the npm install: %v", err)
	}
	root := filepath.Join(cache, "sluice-node-sdk")
	dir = filepath.Join(root, "openai@"+nodeSDKVersion)
	if installedSDK(dir) == nodeSDKVersion {
		return node, dir
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Skipf("npm not found (%v): the official OpenAI Node SDK test needs it to install openai@%s", err, nodeSDKVersion)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Skipf("npm install: %v", err)
	}
	// Install into a fresh directory and rename it into place, so that
	// concurrent test processes never see a half-installed package.
	tmp, err := os.MkdirTemp(root, "install-")
	if err != nil {
		t.Skipf("npm install: %v", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.WriteFile(filepath.Join(tmp, "package.json"), []byte(`{"private":true,"type":"module"}`+"\n"), 0o644); err != nil {
		t.Skipf("npm install: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error", "--save-exact", "openai@"+nodeSDKVersion)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Skipf("npm install openai@%s failed (registry unreachable?): %v\n%s", nodeSDKVersion, err, out)
	}
	if v := installedSDK(tmp); v != nodeSDKVersion {
		t.Fatalf("npm installed openai %q, want %s", v, nodeSDKVersion)
	}
	if err := os.Rename(tmp, dir); err != nil && installedSDK(dir) != nodeSDKVersion {
		t.Fatalf("npm install: %v", err)
	}
	return node, dir
}

// installedSDK is the version of node_modules/openai under dir, or "".
func installedSDK(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "node_modules", "openai", "package.json"))
	if err != nil {
		return ""
	}
	var p struct{ Version string }
	if json.Unmarshal(b, &p) != nil {
		return ""
	}
	return p.Version
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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--input-type=module", "-")
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(script)
	cmd.Env = append(os.Environ(), "SLUICE_BASE_URL="+baseURL, "SLUICE_API_KEY="+clientKey)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Skipf("node did not start: %v", err)
		}
		t.Fatalf("node chat.mjs: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	var res nodeChatResult
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("node chat.mjs printed %q: %v", stdout.String(), err)
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
