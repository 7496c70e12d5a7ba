package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-io/sluice/internal/redistest"
)

// startEnvoyServe runs `sluice serve` with an envoy: section on the
// deploy/envoy rate-limit files, and extra at the config's top level, and
// returns the gRPC and HTTP addresses
// from its log.
func startEnvoyServe(t *testing.T, extra string) (grpcAddr, httpAddr string) {
	t.Helper()
	// The deploy example's config, with the tenant limit per hour instead of
	// per second, so that refill during the test cannot admit a 21st call.
	src, err := os.ReadFile("../../deploy/envoy/ratelimit/edge.yaml")
	if err != nil {
		t.Fatal(err)
	}
	edge := strings.Replace(string(src), "unit: second\n      requests_per_unit: 20\n", "unit: hour\n      requests_per_unit: 20\n", 1)
	if edge == string(src) {
		t.Fatal("deploy/envoy/ratelimit/edge.yaml no longer has the tenant limit this test expects")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(edge), 0o644); err != nil {
		t.Fatal(err)
	}
	return serveEnvoyConfig(t, "store:\n  url: memory\nenvoy:\n  grpc_addr: 127.0.0.1:0\n  http_addr: 127.0.0.1:0\n  response_headers: true\n  config_dir: "+dir+"\n"+extra)
}

// serveEnvoyConfig runs `sluice serve` on the config doc, whose envoy:
// section has a grpc_addr and an http_addr, and returns their addresses
// from its log.
func serveEnvoyConfig(t *testing.T, doc string) (grpcAddr, httpAddr string) {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(cfg, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--config", cfg, "--listen", "127.0.0.1:0", "--log-format", "json"}, io.Discard, pw)
		pw.Close()
	}()
	addrs := make(chan [2]string, 2)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				continue
			}
			if a, ok := line["grpc"].(string); ok {
				addrs <- [2]string{"grpc", a}
			}
			if a, ok := line["http"].(string); ok {
				addrs <- [2]string{"http", a}
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	for grpcAddr == "" || httpAddr == "" {
		select {
		case a := <-addrs:
			if a[0] == "grpc" {
				grpcAddr = a[1]
			} else {
				httpAddr = a[1]
			}
		case err := <-done:
			t.Fatalf("serve exited: %v", err)
		case <-time.After(20 * time.Second):
			t.Fatal("serve did not start the envoy service within 20s")
		}
	}
	return grpcAddr, httpAddr
}

// TestServeEnvoy drives `sluice serve` with a real gRPC client, as Envoy
// would.
func TestServeEnvoy(t *testing.T) {
	grpcAddr, httpAddr := startEnvoyServe(t, "")
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	hc, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", hc, err)
	}
	client := rlsv3.NewRateLimitServiceClient(conn)
	descs := func(kv ...string) []*ratelimitv3.RateLimitDescriptor {
		var out []*ratelimitv3.RateLimitDescriptor
		for i := 0; i+1 < len(kv); i += 2 {
			out = append(out, &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: kv[i], Value: kv[i+1]}}})
		}
		return out
	}
	// tenant: 20/h with gcra, no window edge to race: 20 pass, the 21st not,
	// and the health descriptor is unlimited.
	for i := range 21 {
		resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: descs("tenant", "t1", "health", "x")})
		if err != nil {
			t.Fatal(err)
		}
		want := rlsv3.RateLimitResponse_OK
		if i == 20 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if resp.GetOverallCode() != want || resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 20 || resp.GetStatuses()[1].GetLimitRemaining() != 1<<32-1 {
			t.Fatalf("call %d: %v", i, resp)
		}
		if i == 20 && len(resp.GetResponseHeadersToAdd()) == 0 {
			t.Errorf("no response headers")
		}
	}
	// The same check through /json on the HTTP port.
	resp, err := http.Post("http://"+httpAddr+"/json", "application/json",
		strings.NewReader(`{"domain":"edge","descriptors":[{"entries":[{"key":"tenant","value":"t1"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(body), `"overallCode":"OVER_LIMIT"`) {
		t.Fatalf("/json: %d %s", resp.StatusCode, body)
	}
}

// TestServeEnvoyHostCheck: DNS rebinding on the /json port. A page on
// evil.example rebound to the service (Host: evil.example, Origin equal to
// it, so that the cross-origin check passes) must not spend a descriptor's
// limit or probe the port; loopback, the config's allowed_hosts and
// clients that are not browsers are served.
func TestServeEnvoyHostCheck(t *testing.T) {
	_, httpAddr := startEnvoyServe(t, "allowed_hosts: [rls.internal.example]\n")
	_, port, err := net.SplitHostPort(httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	const spend = `{"domain":"edge","descriptors":[{"entries":[{"key":"tenant","value":"rebind"}]}]}`
	do := func(method, path, host string, hdr ...string) (int, string) {
		t.Helper()
		var body io.Reader
		if method == "POST" {
			body = strings.NewReader(spend)
		}
		req, err := http.NewRequest(method, "http://"+httpAddr+path, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct{ method, path, host string }{
		{"POST", "/json", "evil.example"},
		{"POST", "/json", "evil.example:" + port},
		{"GET", "/healthcheck", "evil.example:" + port},
	} {
		for _, marks := range [][]string{
			{"Origin", "http://" + c.host},
			{"Sec-Fetch-Site", "same-origin", "Sec-Fetch-Mode", "cors"},
		} {
			code, body := do(c.method, c.path, c.host, marks...)
			if code != http.StatusForbidden || !strings.Contains(body, "DNS rebinding") || !strings.Contains(body, "allowed_hosts") {
				t.Errorf("%s %s Host %s %v: %d %s, want 403 naming allowed_hosts", c.method, c.path, c.host, marks, code, body)
			}
		}
	}
	passed := 0
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "rls.internal.example", "RLS.internal.example.:" + port} {
		code, body := do("POST", "/json", host, "Origin", "http://"+host, "Sec-Fetch-Site", "same-origin")
		if code != http.StatusOK {
			t.Errorf("POST /json Host %s: %d %s, want 200", host, code, body)
		}
		passed++
	}
	// Not a browser (no Origin, Referer or Sec-Fetch-*): any Host.
	code, body := do("POST", "/json", "evil.example")
	if code != http.StatusOK {
		t.Errorf("POST /json from curl with Host evil.example: %d %s", code, body)
	}
	passed++
	// Only the requests that passed were charged: tenant is 20/h.
	_, body = do("POST", "/json", "127.0.0.1:"+port)
	passed++
	var resp struct {
		Statuses []struct {
			LimitRemaining int `json:"limitRemaining"`
		} `json:"statuses"`
	}
	if err := json.Unmarshal([]byte(body), &resp); err != nil || len(resp.Statuses) != 1 || resp.Statuses[0].LimitRemaining != 20-passed {
		t.Fatalf("after %d charged requests: %s (%v), want %d remaining", passed, body, err, 20-passed)
	}
}

// TestServeEnvoyGlobalRule: `sluice serve` in region us (its own
// redis-server) with a rate_limit of scope global homed in eu (another):
// Envoy's checks are answered in us from its share of the limit, charged
// in eu's Redis in advance (the key there carries the global mark), and
// the limit is the rule's: 20 pass, the 21st not.
func TestServeEnvoyGlobalRule(t *testing.T) {
	eu, us := redistest.NewStandalone(t), redistest.NewStandalone(t)
	dir := t.TempDir()
	rule := "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 20, algorithm: gcra, scope: global, home: eu}\n"
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(rule), 0o644); err != nil {
		t.Fatal(err)
	}
	grpcAddr, _ := serveEnvoyConfig(t, fmt.Sprintf("store:\n  url: %s\n  region: us\n  regions:\n    eu: {url: %s}\n  global: {clock_skew: 5ms}\nenvoy:\n  grpc_addr: 127.0.0.1:0\n  http_addr: 127.0.0.1:0\n  config_dir: %s\n", us.URL(), eu.URL(), dir))
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := rlsv3.NewRateLimitServiceClient(conn)
	for i := range 21 {
		resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "t1"}}}}})
		if err != nil {
			t.Fatal(err)
		}
		want := rlsv3.RateLimitResponse_OK
		if i == 20 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if resp.GetOverallCode() != want {
			t.Fatalf("call %d: %v", i, resp)
		}
	}
	keys, err := eu.Do(ctx, "KEYS", "@global=eu:rls:*")
	if err != nil || len(keys.([]any)) != 1 {
		t.Fatalf("eu's Redis holds %v (%v), want the rule's global key", keys, err)
	}
	if keys, _ := us.Do(ctx, "KEYS", "@global=eu:rls:*"); len(keys.([]any)) != 0 {
		t.Fatalf("us's Redis holds the home's state: %v", keys)
	}
}
