package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/gateway"
	"github.com/sluice-io/sluice/internal/metrics"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/internal/server"
	"github.com/sluice-io/sluice/memstore"
)

func TestGatewayExampleConfigIsValid(t *testing.T) {
	if _, err := gateway.Load("../../examples/gateway.yaml"); err != nil {
		t.Fatal(err)
	}
}

// TestGatewayCommand runs `sluice gateway` on the example config, pointed
// at a fake upstream, and sends a request through it with a demo key.
func TestGatewayCommand(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: "sk-up"})
	t.Setenv("OPENAI_API_KEY", "sk-up")
	example, err := os.ReadFile("../../examples/gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(example), "https://api.openai.com/v1", up.URL()+"/v1", 1)
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"gateway", "--config", path, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--log-level", "warn"}, pw, io.Discard)
		pw.Close()
	}()
	br := bufio.NewReader(pr)
	line, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("no listen line: %v", err)
	}
	mline, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("no metrics line: %v", err)
	}
	go func() { _, _ = io.Copy(io.Discard, br) }()
	addr := strings.TrimSpace(strings.TrimPrefix(line, "sluice gateway listening on "))
	metricsURL := "http://" + strings.TrimSpace(strings.TrimPrefix(mline, "sluice gateway metrics on "))
	// The clients' listener does not serve the metrics: they name tiers,
	// teams and orgs, and what each spent.
	if mres, err := http.Get("http://" + addr + "/metrics"); err != nil || mres.StatusCode != http.StatusNotFound {
		t.Fatalf("GET /metrics on the clients' listener: %v %v, want 404", mres, err)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":10}`))
	req.Header.Set("Authorization", "Bearer sk-demo-free-0000")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("x-ratelimit-limit-requests") != "20" || !strings.Contains(string(body), `"usage"`) {
		t.Fatalf("status %d headers %v body %s", res.StatusCode, res.Header, body)
	}
	if up.Count() != 1 || up.Requests()[0].Authorization != "Bearer sk-up" {
		t.Fatalf("upstream %+v", up.Requests())
	}
	// The overhead is observed at settlement, which runs after the
	// response: wait for it.
	var metrics []byte
	if !redistest.PollUntil(time.Now().Add(10*time.Second), func() bool {
		mres, err := http.Get(metricsURL)
		if err != nil {
			t.Fatal(err)
		}
		metrics, _ = io.ReadAll(mres.Body)
		mres.Body.Close()
		return strings.Contains(string(metrics), `sluice_gateway_overhead_seconds_count{model="gpt-4o-mini",tier="free"} 1`)
	}) {
		t.Fatalf("no overhead observed within 10s; metrics:\n%s", metrics)
	}
	if strings.Contains(string(metrics), "sk-demo") {
		t.Fatal("a key in the metrics")
	}
	// Beside its own, the runtime's, the process's and the store's, as
	// `sluice serve` serves them.
	for _, name := range []string{"go_goroutines ", "go_gc_duration_seconds_count ", "process_resident_memory_bytes ", "sluice_lease_hits_total ", "sluice_store_calls_total "} {
		if !strings.Contains(string(metrics), "\n"+name) {
			t.Errorf("no %s in the metrics", name)
		}
	}
	// A page rebound to the metrics listener does not read them.
	mreq, _ := http.NewRequest(http.MethodGet, metricsURL, nil)
	mreq.Host = "evil.example"
	mreq.Header.Set("Sec-Fetch-Site", "same-origin")
	if mres, err := http.DefaultClient.Do(mreq); err != nil || mres.StatusCode != http.StatusForbidden {
		t.Fatalf("rebound GET /metrics: %v %v, want 403", mres, err)
	} else {
		mres.Body.Close()
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestGatewayInServe loads a service config with a `gateway:` section and
// runs the component `sluice serve` builds from it, with the service's
// store and registry.
func TestGatewayInServe(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	example, err := os.ReadFile("../../examples/gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var section strings.Builder
	for _, l := range strings.Split(strings.Replace(string(example), "https://api.openai.com/v1", up.URL()+"/v1", 1), "\n") {
		section.WriteString("  " + l + "\n")
	}
	doc := "listen: 127.0.0.1:0\nstore:\n  url: memory\npolicies:\n  p:\n    limit: 10/s\ngateway:\n" + section.String()
	cfg, err := config.Parse("serve.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.File.Gateway == nil || cfg.File.Gateway.Tiers["pro"].Models["gpt-4o"].TPM != 300000 {
		t.Fatalf("gateway section not decoded: %+v", cfg.File.Gateway)
	}
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var upstreams server.SpendFunc
	comp, err := gatewayComponent(server.Deps{Store: st, Metrics: metrics.New(), Config: func() *config.Config { return cfg },
		SetGatewayUpstreams: func(f server.SpendFunc) { upstreams = f }})
	if err != nil || comp == nil || comp.Name() != "gateway" {
		t.Fatalf("component %v, %v", comp, err)
	}
	// The console's upstreams view is given the gateway's headroom: none
	// to show with one upstream (no pool).
	if upstreams == nil {
		t.Fatal("the console was not given the gateway's upstreams")
	}
	if v, err := upstreams(context.Background()); err != nil || fmt.Sprintf("%+v", v) != "{Pool:false Upstreams:[]}" {
		t.Fatalf("upstreams view: %+v, %v", v, err)
	}
	gs := comp.(*gateway.Server)
	srv := httptest.NewServer(gs.Handler())
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/embeddings", strings.NewReader(`{"model":"text-embedding-3-small","input":"x"}`))
	req.Header.Set("Authorization", "Bearer sk-demo-pro-0000")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("x-ratelimit-limit-requests") != "500" { // rpm 500, not its burst of 50
		t.Fatalf("status %d headers %v", res.StatusCode, res.Header)
	}
	// DNS rebinding: a browser reaches the gateway by the names of its
	// own allowed_hosts and of the service's (live), never by another.
	withHosts := strings.Replace("allowed_hosts: [svc.example]\n"+doc, "gateway:\n", "gateway:\n  allowed_hosts: [gw.example]\n", 1)
	hcfg, err := config.Parse("serve.yaml", []byte(withHosts))
	if err != nil {
		t.Fatal(err)
	}
	var live atomic.Pointer[config.Config]
	live.Store(hcfg)
	hcomp, err := gatewayComponent(server.Deps{Store: st, Metrics: metrics.New(), Config: live.Load})
	if err != nil {
		t.Fatal(err)
	}
	hsrv := httptest.NewServer(hcomp.(*gateway.Server).Handler())
	defer hsrv.Close()
	healthz := func(host string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, hsrv.URL+"/healthz", nil)
		req.Host = host
		req.Header.Set("Origin", "http://"+host)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return res.StatusCode, string(b)
	}
	for host, want := range map[string]int{"gw.example": 200, "svc.example": 200, "localhost": 200, "evil.example": 403} {
		if code, body := healthz(host); code != want || (want == 403 && !strings.Contains(body, "gateway.allowed_hosts")) {
			t.Errorf("Host %s: %d %s, want %d", host, code, body, want)
		}
	}
	reloaded, err := config.Parse("serve.yaml", []byte(strings.Replace(withHosts, "[svc.example]", "[svc.example, evil.example]", 1)))
	if err != nil {
		t.Fatal(err)
	}
	live.Store(reloaded)
	if code, body := healthz("evil.example"); code != 200 {
		t.Errorf("after the service's allowed_hosts named it: %d %s", code, body)
	}
	// A bad section is reported by the config loader, naming the field.
	bad := strings.Replace(doc, "tier: pro", "tier: gold", 1)
	if _, err := config.Parse("serve.yaml", []byte(bad)); err == nil || !strings.Contains(err.Error(), `unknown tier "gold"`) {
		t.Fatalf("bad gateway section: %v", err)
	}
}

func TestGatewayRefusesEmptyUpstreamKey(t *testing.T) {
	env := map[string]string{"SET": "sk-x"}
	getenv := func(k string) string { return env[k] }
	log := slog.New(slog.DiscardHandler)
	for _, c := range []struct {
		url, env string
		allow    bool
		ok       bool
	}{
		{"https://api.openai.com/v1", "SET", false, true},
		{"https://api.openai.com/v1", "EMPTY", false, false},
		{"https://api.openai.com/v1", "EMPTY", true, true},
		{"http://127.0.0.1:11434/v1", "EMPTY", false, true},
		{"http://[::1]:8000/v1", "EMPTY", false, true},
		{"http://localhost:8000/v1", "EMPTY", false, true},
		{"http://vllm.internal:8000/v1", "EMPTY", false, false},
		{"http://127.0.0.1.evil.example/v1", "EMPTY", false, false},
	} {
		cfg := &gateway.Config{Upstream: gateway.UpstreamConfig{BaseURL: c.url, APIKeyEnv: c.env, AllowNoKey: c.allow}}
		err := checkGatewayKey(cfg, getenv, log)
		if (err == nil) != c.ok {
			t.Errorf("%+v: %v", c, err)
		}
		if err != nil && (!strings.Contains(err.Error(), c.env+" is empty") || !strings.Contains(err.Error(), "allow_no_key")) {
			t.Errorf("%+v: error does not say what to do: %v", c, err)
		}
	}
}

// TestGatewayMetricsPortInUse: a second replica on one host, on the
// default metrics address another holds, fails at start with an error
// naming the setting and what to set, before serving anything.
func TestGatewayMetricsPortInUse(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: "sk-up"})
	t.Setenv("OPENAI_API_KEY", "sk-up")
	example, err := os.ReadFile("../../examples/gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(example), "https://api.openai.com/v1", up.URL()+"/v1", 1)
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	held, err := net.Listen("tcp", "127.0.0.1:0") // the first replica's
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = run(ctx, []string{"gateway", "--config", path, "--listen", "127.0.0.1:0", "--metrics-listen", held.Addr().String(), "--log-level", "warn"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--metrics-listen") || !strings.Contains(err.Error(), "in use") || !strings.Contains(err.Error(), "SLUICE_GATEWAY_METRICS_LISTEN") {
		t.Fatalf("got %v, want a start-up error naming --metrics-listen", err)
	}
}

// TestGatewayAdminToken: a standalone gateway's admin token comes from
// SLUICE_ADMIN_TOKEN: a weak one is refused at start, saying how to make
// one; a strong one matches only itself, as a Bearer token.
func TestGatewayAdminToken(t *testing.T) {
	if admin, err := gatewayAdmin(""); admin != nil || err != nil {
		t.Fatalf("no token: %v %v", admin != nil, err)
	}
	if _, err := gatewayAdmin("password123"); err == nil || !strings.Contains(err.Error(), "SLUICE_ADMIN_TOKEN is too weak") || !strings.Contains(err.Error(), "openssl rand -hex 32") {
		t.Fatalf("weak token: %v", err)
	}
	const token = "3f9c2a7e8b1d4f60a5c9e2b7d1f8a3c6e0b4d7f2a9c5e1b8d3f6a0c4e7b2d9f1"
	admin, err := gatewayAdmin(token)
	if err != nil {
		t.Fatal(err)
	}
	for auth, want := range map[string]bool{"Bearer " + token: true, "bearer " + token: true, "Bearer " + token[:63]: false, token: false, "Bearer sk-client": false, "": false} {
		r := httptest.NewRequest(http.MethodGet, "/v1/status", nil)
		r.Header.Set("Authorization", auth)
		if got := admin(r); got != want {
			t.Errorf("Authorization %q: admin %v, want %v", auth, got, want)
		}
	}
}
