package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/metrics"
	"github.com/sluice-io/sluice/internal/server"
)

// metricNamesFile lists every metric `sluice serve` can export, one name a
// line; deploy/test checks the dashboards' and alerts' queries against it.
const metricNamesFile = "../../deploy/test/testdata/metric-names.txt"

// TestMetricNamesFile builds the registry of a `sluice serve` with every
// part that registers metrics (the API, delay mode, the Envoy service,
// RLQS, the gateway with an upstream pool and a queue) and fails if metricNamesFile does not
// list exactly its names. SLUICE_UPDATE_METRIC_NAMES=1 rewrites the file.
func TestMetricNamesFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "ratelimit"), 0o755); err != nil {
		t.Fatal(err)
	}
	rl := "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"
	if err := os.WriteFile(filepath.Join(dir, "ratelimit", "edge.yaml"), []byte(rl), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NAMES_UPSTREAM_KEY", "sk-up")
	doc := `listen: 127.0.0.1:0
store: {url: memory}
policies:
  p: {limit: 10/s}
envoy:
  grpc_addr: 127.0.0.1:0
  config_dir: ratelimit
rlqs:
  report_interval: 1s
  domains:
    - domain: envoy
      policies:
        - {name: all, match: {route: api}, requests_per_unit: 100, unit: second}
gateway:
  listen: 127.0.0.1:0
  upstreams:
    - {name: a, kind: openai, base_url: "http://127.0.0.1:1/v1", key_env: NAMES_UPSTREAM_KEY, models: {gpt-4o-mini: {rpm: 100, tpm: 100000}}}
  routes:
    gpt-4o-mini: [{upstream: a}]
  models: [gpt-4o-mini]
  tiers:
    t: {rpm: 100, tpm: 100000}
  keys:
    - {name: k, hash: 0000000000000000000000000000000000000000000000000000000000000000, tier: t}
  queue: {max_wait: 1s}
`
	path := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	reg := make(chan *metrics.Registry, 1)
	capture := func(d server.Deps) (server.Component, error) {
		reg <- d.Metrics.Registry
		return nil, nil
	}
	listening := make(chan net.Addr, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- server.Run(ctx, server.ServiceOptions{
			ConfigPath: path,
			Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
			OnListen:   func(a net.Addr) { listening <- a },
			// capture last: the others have registered theirs.
			Components: []server.ComponentFunc{envoyComponent, gatewayComponent, capture},
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	var r *metrics.Registry
	for r == nil {
		select {
		case r = <-reg:
		case err := <-done:
			t.Fatalf("serve exited: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("serve did not start within 30 s")
		}
	}
	select {
	case <-listening: // the API's handler (and its promhttp counter) is built
	case err := <-done:
		t.Fatalf("serve exited: %v", err)
	}
	want := strings.Join(r.Names(), "\n") + "\n"
	for _, prefix := range []string{"sluice_gateway_", "sluice_gateway_upstream_429_total", "sluice_envoy_rls_", "sluice_rlqs_", "sluice_delay_", "sluice_decisions_total"} {
		if !strings.Contains(want, "\n"+prefix) {
			t.Fatalf("no %s* metric registered: %s", prefix, want)
		}
	}
	if os.Getenv("SLUICE_UPDATE_METRIC_NAMES") == "1" {
		if err := os.WriteFile(metricNamesFile, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(metricNamesFile)
	if err != nil || string(got) != want {
		t.Fatalf("%s is stale (%v): run SLUICE_UPDATE_METRIC_NAMES=1 go test -run TestMetricNamesFile ./cmd/sluice/\nwant:\n%s", metricNamesFile, err, want)
	}
}
