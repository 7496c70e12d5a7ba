package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeopenai"
)

// TestGatewayReload runs `sluice gateway` and edits its file as a deploy
// tool would (a new file renamed into place): a valid file is applied
// whole (a key it adds is served at once, with a log line), and a file
// that fails to validate or changes a setting only a restart applies is
// refused whole with a log line naming the error, the running config
// serving on.
func TestGatewayReload(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: "sk-up"})
	t.Setenv("OPENAI_API_KEY", "sk-up")
	example, err := os.ReadFile("../../examples/gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	base := strings.Replace(string(example), "https://api.openai.com/v1", up.URL()+"/v1", 1)
	const newKey = "sk-reloaded-key-0001"
	added := strings.Replace(base, "keys:\n", "keys:\n  - name: reloaded\n    hash: "+sluice.HashKey(newKey)+"\n    tier: free\n", 1)
	dir := t.TempDir()
	path := filepath.Join(dir, "gateway.yaml")
	write := func(content string) {
		t.Helper()
		tmp := filepath.Join(dir, ".gateway.yaml.tmp")
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write(base)

	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	lr, lw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"gateway", "--config", path, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--log-format", "text"}, pw, lw)
		pw.Close()
		lw.Close()
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("no listen line: %v", err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	addr := strings.TrimSpace(strings.TrimPrefix(line, "sluice gateway listening on "))
	var mu sync.Mutex
	logs := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(lr)
		for sc.Scan() {
			if l := sc.Text(); strings.Contains(l, "config reload") {
				logs <- l
			}
		}
	}()
	nextLog := func() string {
		t.Helper()
		select {
		case l := <-logs:
			return l
		case <-time.After(10 * time.Second):
			t.Fatal("no reload log line within 10s")
			return ""
		}
	}
	chat := func(key string) int {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions",
			strings.NewReader(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":10}`))
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	if c := chat(newKey); c != http.StatusUnauthorized {
		t.Fatalf("the key before it is configured: %d, want 401", c)
	}

	write(added)
	if l := nextLog(); !strings.Contains(l, "gateway config reloaded") {
		t.Fatalf("log: %s", l)
	}
	if c := chat(newKey); c != http.StatusOK {
		t.Fatalf("the reloaded key: %d, want 200", c)
	}

	// Invalid: an unknown tier. Refused whole: the new key of the same
	// file is not served, and the running config still is.
	bad := strings.Replace(added, "    tier: free\n", "    tier: nonesuch\n", 1)
	write(strings.Replace(bad, newKey, "x", 1))
	if l := nextLog(); !strings.Contains(l, "gateway config reload rejected") || !strings.Contains(l, "nonesuch") {
		t.Fatalf("log: %s", l)
	}
	if c := chat(newKey); c != http.StatusOK {
		t.Fatalf("after a refused file, the running config's key: %d, want 200", c)
	}

	// A store change takes a restart: refused whole too, though its key
	// change alone would be valid.
	write(strings.Replace(base, "  max_keys: 100000", "  max_keys: 99999", 1))
	if l := nextLog(); !strings.Contains(l, "rejected") || !strings.Contains(l, "store changed") {
		t.Fatalf("log: %s", l)
	}
	if c := chat(newKey); c != http.StatusOK {
		t.Fatalf("after a restart-only change, the running config's key: %d, want 200", c)
	}
}
