package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/redistest"
)

// startServe runs `sluice serve` with args through run() and returns the
// API's base URL, read from the "sluice serving" log line, which is logged
// once the listener is bound and so names the port it got.
func startServe(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"serve", "--listen", "127.0.0.1:0", "--log-format", "json"}, args...), io.Discard, pw)
		pw.Close()
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == "sluice serving" {
				addr <- line["listen"].(string)
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	select {
	case a := <-addr:
		if strings.HasSuffix(a, ":0") {
			t.Fatalf("serving logged before the listener was bound: %s", a)
		}
		return "http://" + a
	case err := <-done:
		t.Fatalf("serve exited: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not listen within 20s")
	}
	return ""
}

func TestServeExampleConfig(t *testing.T) {
	t.Setenv("SLUICE_ADMIN_TOKEN", "3f9c1e7ab2d84f06c5e1")
	url := startServe(t, "--config", "../../examples/sluice.yaml")
	post := func(path, body string, hdr ...string) *http.Response {
		req, _ := http.NewRequest("POST", url+path, strings.NewReader(body))
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	// The tutorial's free tier: 10/min.
	for i := range 10 {
		if r := post("/v1/check", `{"api_key":"sk-free-demo-0001"}`); r.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, r.StatusCode)
		}
	}
	r := post("/v1/check", `{"api_key":"sk-free-demo-0001"}`)
	if r.StatusCode != 429 || r.Header.Get("Retry-After") == "" || r.Header.Get("RateLimit-Policy") != `"free";q=10;w=60;sluice-burst=10` {
		t.Fatalf("11th: %d %v", r.StatusCode, r.Header)
	}
	// The admin token comes from SLUICE_ADMIN_TOKEN.
	if r := post("/v1/reset", `{"api_key":"sk-free-demo-0001"}`, "Authorization", "Bearer 3f9c1e7ab2d84f06c5e1"); r.StatusCode != 200 {
		t.Fatalf("reset: %d", r.StatusCode)
	}
	if r := post("/v1/check", `{"api_key":"sk-free-demo-0001"}`); r.StatusCode != 200 {
		t.Fatalf("after reset: %d", r.StatusCode)
	}
	// sluice loadtest against it.
	var out bytes.Buffer
	if err := run(context.Background(), []string{"loadtest", "--url", url + "/v1/check", "-c", "4", "-n", "200",
		"--body", `{"tier":"enterprise","key":"lt-{key}"}`, "--keys", "50"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"requests   200", "status     200:200", "p99"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("loadtest output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestServeBadFlagsAndConfig(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--config", "../../internal/config/testdata/bad_limit.bad.yaml"},
		{"serve", "--config", "../../examples/sluice.yaml", "--log-format", "xml"},
		{"serve", "--config", "../../examples/sluice.yaml", "--log-level", "loud"},
		{"serve", "--config", "no-such-file.yaml"},
	} {
		if err := run(context.Background(), args, io.Discard, io.Discard); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

func TestConfigCheck(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"config", "check", "../../examples/sluice.yaml"}, &out, &errOut); err != nil {
		t.Fatal(err, errOut.String())
	}
	if !strings.Contains(out.String(), "examples/sluice.yaml: ok: sluice serve config: 6 policies, 4 tiers, 3 keys") {
		t.Errorf("output: %s", out.String())
	}
	bad, _ := filepath.Glob("../../internal/config/testdata/*.bad.yaml")
	out.Reset()
	errOut.Reset()
	err := run(context.Background(), append([]string{"config", "check", "../../examples/sluice.yaml"}, bad...), &out, &errOut)
	if exitCode(err) != 1 || !errors.Is(err, config.ErrInvalid) {
		t.Fatalf("bad configs: %v (exit %d)", err, exitCode(err))
	}
	if !strings.Contains(errOut.String(), "bad_algorithm.bad.yaml:3: policies.free.algorithm") {
		t.Errorf("stderr: %s", errOut.String())
	}
}

func TestKeys(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"keys", "hash", "sk-pro-demo-0002"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load("../../examples/sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if h := strings.TrimSpace(out.String()); cfg.Keys[h] == nil || cfg.Keys[h].Name != "demo-pro" {
		t.Fatalf("hash %q is not the example's demo-pro key", h)
	}
	// From stdin.
	root := newRootCmd()
	root.SetArgs([]string{"keys", "hash"})
	root.SetIn(strings.NewReader("a\n\nb\n"))
	out.Reset()
	root.SetOut(&out)
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if out.String() != sluice.HashKey("a")+"\n"+sluice.HashKey("b")+"\n" {
		t.Fatalf("stdin hashes: %q", out.String())
	}
	// generate: a fresh key whose printed entry loads as config.
	out.Reset()
	if err := run(context.Background(), []string{"keys", "generate", "--tier", "free", "--name", "n1"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	key, entry, _ := strings.Cut(out.String(), "\n")
	key = strings.TrimPrefix(key, "key: ")
	doc := "policies: {free: {limit: 1/s}}\ntiers: {free: {policies: [free]}}\nkeys:\n" + strings.SplitN(entry, "\n", 2)[1]
	cfg, err = config.Parse("gen.yaml", []byte(doc))
	if err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
	if cfg.Keys[sluice.HashKey(key)] == nil || strings.Contains(doc, key) {
		t.Fatalf("generated entry %q does not match key %q", doc, key)
	}
}

// TestJSONLogDurations: durations in JSON logs are strings such as "1.5s",
// as in text logs, not integer nanoseconds.
func TestJSONLogDurations(t *testing.T) {
	var buf bytes.Buffer
	log, err := newLogger(&buf, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("x", "wait", 1500*time.Millisecond, slog.Group("g", "timeout", 2*time.Minute))
	if !strings.Contains(buf.String(), `"wait":"1.5s"`) || !strings.Contains(buf.String(), `"timeout":"2m0s"`) {
		t.Fatalf("log line %s", buf.String())
	}
}

// TestServeLogsOnlyThroughSlog runs serve with --log-format json against a
// Redis that is not there: it starts, and every line it writes (the
// store's, the guard's, gRPC's, the server's) is one JSON object. With
// store.instances set, local answers though no heartbeat ever read the
// instance count (without it, local denies until one does: cold start).
func TestServeLogsOnlyThroughSlog(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens there now
	dir := t.TempDir()
	cfg := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfg, []byte("policies:\n  p: {limit: 5/s}\nstore: {url: \"redis://"+dead+"\", instances: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs syncBuf
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--config", cfg, "--listen", "127.0.0.1:0", "--log-format", "json", "--log-level", "debug"}, io.Discard, &logs)
	}()
	var url string
	deadline := time.Now().Add(20 * time.Second)
	for url == "" {
		for _, l := range strings.Split(logs.String(), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == "sluice serving" {
				url = "http://" + rec["listen"].(string)
			}
		}
		if url == "" && !redistest.PollUntil(deadline, func() bool { return strings.Contains(logs.String(), `"sluice serving"`) }) {
			t.Fatalf("serve did not listen with Redis down:\n%s", logs.String())
		}
	}
	for range 3 {
		resp, err := http.Post(url+"/v1/check", "application/json", strings.NewReader(`{"policy":"p","key":"k"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Sluice-Degraded") != "local" {
			t.Errorf("check with Redis down: %d %v", resp.StatusCode, resp.Header)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	for _, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Errorf("a log line is not JSON: %q", l)
		}
	}
	if !strings.Contains(logs.String(), "guard") {
		t.Errorf("the store's failures were not logged:\n%s", logs.String())
	}
}

// syncBuf is a bytes.Buffer safe for concurrent writes and reads.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
