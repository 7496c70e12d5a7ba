package server

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/memstore"
)

const adminToken = "9b1f4c7e2a6d03b8e5f9a1c4"

// testConfig is a small config: tiers like the example's, and a policy of
// each kind the tests need.
const testConfig = `
policies:
  free: {algorithm: token_bucket, limit: 10/min}
  pro: {algorithm: token_bucket, limit: 100/min}
  daily: {algorithm: fixed_window, limit: 3/day, shadow: true}
  a: {limit: 5/s}
  b: {limit: 2/s}
  anon: {limit: 2/min}
tiers:
  free: {policies: [free]}
  pro: {policies: [pro, daily]}
  anonymous: {policies: [anon]}
keys:
  - {name: demo-free, hash: ba8510809b719211000410413fad8dfa3470e9b500c4638729b97a635bec3415, tier: free}
  - {name: demo-pro, hash: 0d7308f7692a0f01eb899baac9a91dbf940739af6a0ada7b4ca1b6bfbfdfdc34, tier: pro}
overrides:
  - {key: "vip", policy: a, limit: 7/s}
authz:
  user_header: X-User-ID
  trusted_proxies: [127.0.0.1/32, "::1"]
  default_tier: anonymous
  selectable_policies: [a]
max_body_bytes: 1024
`

const (
	freeKey = "sk-free-demo-0001"
	proKey  = "sk-pro-demo-0002"
)

// svc is a running service on a real socket.
type svc struct {
	url     string
	path    string
	clk     *clock.Fake
	reloads chan error
	sighup  chan os.Signal
	cancel  context.CancelFunc
	done    chan error
	store   sluice.Store
	// gw is the URL of a gateway component the test started, if any.
	gw string
}

type svcOptions struct {
	// wrap, if set, wraps the memory store (to gate or fail calls).
	wrap   func(sluice.Store) sluice.Store
	config string
	// redis uses the store the config names instead of a memory store on
	// the fake clock.
	redis bool
	// log, if set, receives the service's log lines.
	log io.Writer
	// components are run beside the API, as `sluice serve` runs its own.
	components []ComponentFunc
}

func startService(t *testing.T, o svcOptions) *svc {
	t.Helper()
	if o.config == "" {
		o.config = testConfig
	}
	dir := t.TempDir()
	s := &svc{
		path:    filepath.Join(dir, "sluice.yaml"),
		clk:     clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)),
		reloads: make(chan error, 16),
		sighup:  make(chan os.Signal, 1),
		done:    make(chan error, 1),
	}
	writeAtomic(t, s.path, o.config)
	if o.log == nil {
		o.log = io.Discard
	}
	listening := make(chan net.Addr, 1)
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	openStore := func(_ context.Context, sc config.StoreSection) (sluice.Store, io.Closer, error) {
		ms, err := memstore.New(memstore.Options{Clock: s.clk, MaxKeys: cmp.Or(sc.MaxKeys, 10000), MaxBytes: sc.MaxBytes, SweepInterval: -1})
		if err != nil {
			return nil, nil, err
		}
		s.store = ms
		if o.wrap != nil {
			return o.wrap(ms), ms, nil
		}
		return ms, ms, nil
	}
	if o.redis {
		openStore = nil
	}
	go func() {
		s.done <- Run(ctx, ServiceOptions{
			ConfigPath: s.path,
			Listen:     "127.0.0.1:0",
			AdminToken: adminToken,
			Logger:     slog.New(slog.NewTextHandler(o.log, nil)),
			Signals:    s.sighup,
			Clock:      s.clk,
			OnReload:   func(_ *config.Config, err error) { s.reloads <- err },
			OnListen:   func(a net.Addr) { listening <- a },
			OpenStore:  openStore,
			Components: o.components,
		})
	}()
	select {
	case a := <-listening:
		s.url = "http://" + a.String()
	case err := <-s.done:
		t.Fatalf("service exited: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-s.done; err != nil {
			t.Errorf("service: %v", err)
		}
	})
	return s
}

func writeAtomic(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// waitReload waits for the next reload attempt and returns its error.
func (s *svc) waitReload(t *testing.T) error {
	t.Helper()
	select {
	case err := <-s.reloads:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("no reload within 10s")
		return nil
	}
}

type answer struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func (s *svc) do(t *testing.T, method, path string, body string, hdr ...string) answer {
	t.Helper()
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := answer{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &a.body); err != nil {
			t.Fatalf("%s %s: invalid JSON %q: %v", method, path, raw, err)
		}
	}
	return a
}

func (s *svc) check(t *testing.T, body string) answer {
	t.Helper()
	return s.do(t, "POST", "/v1/check", body)
}

func (a answer) num(field string) int64 {
	f, _ := a.body[field].(float64)
	return int64(f)
}

func TestCheckTierByAPIKey(t *testing.T) {
	s := startService(t, svcOptions{})
	body := fmt.Sprintf(`{"api_key":%q}`, freeKey)
	for i := range 10 {
		a := s.check(t, body)
		if a.status != 200 || a.body["allowed"] != true || a.num("remaining") != int64(9-i) || a.num("limit") != 10 {
			t.Fatalf("request %d: %d %s", i, a.status, a.raw)
		}
	}
	a := s.check(t, body)
	if a.status != 429 || a.body["allowed"] != false || a.num("retry_after_ms") != 6000 || a.num("remaining") != 0 {
		t.Fatalf("11th: %d %s", a.status, a.raw)
	}
	for h, want := range map[string]string{
		"Retry-After":           "6",
		"RateLimit-Policy":      `"free";q=10;w=60;sluice-burst=10`,
		"RateLimit":             `"free";r=0;t=6`, // the next request's worth comes back in 6s
		"X-RateLimit-Limit":     "10",
		"X-RateLimit-Remaining": "0",
		"X-RateLimit-Reset":     "60",
	} {
		if got := a.header.Get(h); got != want {
			t.Errorf("%s = %q, want %q", h, got, want)
		}
	}
	if strings.Contains(a.raw, freeKey) {
		t.Errorf("answer echoes the raw API key: %s", a.raw)
	}
	s.clk.Advance(6*time.Second - 1)
	if a := s.check(t, body); a.status != 429 || a.num("retry_after_ms") != 1 {
		t.Fatalf("1ns early: %d %s", a.status, a.raw)
	}
	s.clk.Advance(1)
	if a := s.check(t, body); a.status != 200 {
		t.Fatalf("after Retry-After: %d %s", a.status, a.raw)
	}
	// The key of another tier has its own bucket.
	if a := s.check(t, fmt.Sprintf(`{"api_key":%q}`, proKey)); a.status != 200 || a.num("limit") != 100 || a.body["policy"] != "pro" {
		t.Fatalf("pro key: %d %s", a.status, a.raw)
	}
	if a := s.check(t, `{"api_key":"sk-nobody"}`); a.status != 401 || !strings.Contains(a.raw, "unknown api key") {
		t.Fatalf("unknown key: %d %s", a.status, a.raw)
	}
}

func TestCheckPolicyTierOverrideAndCost(t *testing.T) {
	s := startService(t, svcOptions{})
	if a := s.check(t, `{"policy":"a","key":"u1","cost":5}`); a.status != 200 || a.num("remaining") != 0 {
		t.Fatalf("cost 5: %d %s", a.status, a.raw)
	}
	if a := s.check(t, `{"policy":"a","key":"u1"}`); a.status != 429 || a.num("retry_after_ms") != 200 {
		t.Fatalf("denied: %d %s", a.status, a.raw)
	}
	// Per-key override: vip gets 7/s on policy a.
	if a := s.check(t, `{"policy":"a","key":"vip","cost":7}`); a.status != 200 || a.num("limit") != 7 {
		t.Fatalf("override: %d %s", a.status, a.raw)
	}
	if a := s.check(t, `{"tier":"free","key":"u1"}`); a.status != 200 || a.body["policy"] != "free" {
		t.Fatalf("tier: %d %s", a.status, a.raw)
	}
}

func TestBatchAllOrNothing(t *testing.T) {
	s := startService(t, svcOptions{})
	if a := s.check(t, `{"policy":"b","key":"y","cost":2}`); a.status != 200 {
		t.Fatalf("drain b: %s", a.raw)
	}
	a := s.check(t, `{"checks":[{"policy":"a","key":"x","cost":3},{"policy":"b","key":"y"}]}`)
	if a.status != 429 || a.body["policy"] != "b" {
		t.Fatalf("batch: %d %s", a.status, a.raw)
	}
	res := a.body["results"].([]any)
	if len(res) != 2 || res[0].(map[string]any)["allowed"] != true || res[1].(map[string]any)["allowed"] != false {
		t.Fatalf("results: %s", a.raw)
	}
	// Nothing was charged to a.
	if st := s.do(t, "GET", "/v1/status?policy=a&key=x", ""); st.status != 200 || st.num("remaining") != 5 {
		t.Fatalf("a after denied batch: %d %s", st.status, st.raw)
	}
	s.clk.Advance(time.Second)
	if a := s.check(t, `{"checks":[{"policy":"a","key":"x","cost":3},{"policy":"b","key":"y"}]}`); a.status != 200 {
		t.Fatalf("batch later: %d %s", a.status, a.raw)
	}
	if st := s.do(t, "GET", "/v1/status?policy=a&key=x", ""); st.num("remaining") != 2 {
		t.Fatalf("a after batch: %s", st.raw)
	}
}

func TestStatusPeeks(t *testing.T) {
	s := startService(t, svcOptions{})
	for range 3 {
		if a := s.do(t, "GET", "/v1/status?tier=free&key=p", ""); a.status != 200 || a.num("remaining") != 10 {
			t.Fatalf("status: %d %s", a.status, a.raw)
		}
	}
	s.check(t, `{"tier":"free","key":"p","cost":4}`)
	a := s.do(t, "GET", "/v1/status?tier=free&key=p&cost=7", "")
	if a.status != 200 || a.body["allowed"] != false || a.num("remaining") != 6 || a.header.Get("X-RateLimit-Remaining") != "6" {
		t.Fatalf("status cost 7: %d %s", a.status, a.raw)
	}
	if a := s.do(t, "GET", "/v1/status?key=p", "", "X-API-Key", freeKey); a.status != 400 {
		t.Fatalf("key and api key: %d %s", a.status, a.raw)
	}
	if a := s.do(t, "GET", "/v1/status", "", "X-API-Key", freeKey); a.status != 200 || a.body["policy"] != "free" {
		t.Fatalf("status by api key: %d %s", a.status, a.raw)
	}
	if a := s.do(t, "GET", "/v1/status?policy=free&api_key=x", ""); a.status != 400 || !strings.Contains(a.raw, "X-API-Key header") {
		t.Fatalf("api key in query: %d %s", a.status, a.raw)
	}
}

func TestReset(t *testing.T) {
	s := startService(t, svcOptions{})
	s.check(t, `{"policy":"b","key":"r","cost":2}`)
	if a := s.do(t, "POST", "/v1/reset", `{"policy":"b","key":"r"}`); a.status != 401 || a.header.Get("WWW-Authenticate") == "" {
		t.Fatalf("no token: %d %s", a.status, a.raw)
	}
	if a := s.do(t, "POST", "/v1/reset", `{"policy":"b","key":"r"}`, "Authorization", "Bearer wrong", "X-Forwarded-For", "192.0.2.99"); a.status != 401 { // another client: its backoff (admin.go) is its own
		t.Fatalf("wrong token: %d %s", a.status, a.raw)
	}
	if a := s.check(t, `{"policy":"b","key":"r"}`); a.status != 429 {
		t.Fatalf("still limited: %d", a.status)
	}
	if a := s.do(t, "POST", "/v1/reset", `{"policy":"b","key":"r"}`, "Authorization", "Bearer "+adminToken); a.status != 200 || a.num("reset") != 1 {
		t.Fatalf("reset: %d %s", a.status, a.raw)
	}
	if a := s.check(t, `{"policy":"b","key":"r"}`); a.status != 200 || a.num("remaining") != 1 {
		t.Fatalf("after reset: %d %s", a.status, a.raw)
	}
}

func TestBadRequests(t *testing.T) {
	s := startService(t, svcOptions{})
	for _, c := range []struct {
		body   string
		status int
		want   string
	}{
		{`{"policy":"free","key":`, 400, "malformed JSON"},
		{`not json`, 400, "malformed JSON"},
		{`{"policy":"gold","key":"k"}`, 400, `unknown policy \"gold\"; valid: a, anon, b, daily, free, pro`},
		{`{"tier":"gold","key":"k"}`, 400, `unknown tier \"gold\"; valid: anonymous, free, pro`},
		{`{"policy":"free","key":"k","cost":-1}`, 400, "cost -1 must not be negative"},
		{`{"policy":"free","key":"k","cost":0}`, 400, "cost must be at least 1"},
		{`{"policy":"free","key":"k","cost":11}`, 400, "cost exceeds burst"},
		{`{"policy":"free","key":"k","cost":1.5}`, 400, "cost: number 1.5 is not a whole number from 1 to 9223372036854775807"},
		{`{"policy":"free","key":"k","cost":9223372036854775808}`, 400, "cost: number 9223372036854775808 is not a whole number"},
		{`{"checks":[{"policy":"free","key":"k","cost":1e30}]}`, 400, "cost: number 1e30 is not a whole number"},
		{`{"policy":"free","key":"k","cost":"1"}`, 400, "cost: string is not a whole number"},
		{"{\"policy\":\"free\",\"key\":\"\xff\"}", 400, "body is not valid UTF-8 (byte 24)"},
		{`{"policy":"free","key":"\udc00"}`, 400, "lone UTF-16 surrogate"},
		{`{"policy":"free","key":"k","polcy":"x"}`, 400, `unknown field \"polcy\"`},
		{`{"policy":"free"}`, 400, `missing \"key\"`},
		{`{"key":"k"}`, 400, `missing \"policy\" or \"tier\"`},
		{`{"policy":"free","tier":"free","key":"k"}`, 400, "not both"},
		{`{"policy":"free","key":"k"} {}`, 400, "data after the object"},
		{`{"checks":[{"policy":"free","key":"k"},{"policy":"nope","key":"k"}]}`, 400, "checks[1]: unknown policy"},
		{`{"policy":"free","key":"` + strings.Repeat("k", 2000) + `"}`, 413, "larger than 1024 bytes"},
		{`{"policy":"free","key":"` + strings.Repeat("k", 600) + `"}`, 400, "key longer than 512 bytes"},
	} {
		a := s.check(t, c.body)
		if a.status != c.status || !strings.Contains(a.raw, c.want) || a.body["error"] == nil {
			t.Errorf("%.60s: %d %s, want %d with %q", c.body, a.status, a.raw, c.status, c.want)
		}
	}
	if a := s.do(t, "GET", "/v1/check", ""); a.status != 405 {
		t.Errorf("GET /v1/check: %d", a.status)
	}
	if a := s.do(t, "GET", "/v2/nothing", ""); a.status != 404 || a.body["error"] == nil {
		t.Errorf("unknown path: %d %s", a.status, a.raw)
	}
}

func TestShadowPolicyCountsButNeverDenies(t *testing.T) {
	s := startService(t, svcOptions{})
	body := fmt.Sprintf(`{"api_key":%q}`, proKey)
	for i := range 5 {
		a := s.check(t, body)
		if a.status != 200 {
			t.Fatalf("request %d: %d %s", i, a.status, a.raw)
		}
		shadow := a.body["results"].([]any)[1].(map[string]any)
		if shadow["shadow"] != true || shadow["allowed"] != (i < 3) {
			t.Fatalf("request %d shadow result: %s", i, a.raw)
		}
	}
	m := s.do(t, "GET", "/metrics", "").raw
	for _, want := range []string{
		`sluice_decisions_total{policy="daily",result="allowed",tier="pro"} 3`,
		`sluice_decisions_total{policy="daily",result="shadow_denied",tier="pro"} 2`,
		`sluice_decisions_total{policy="pro",result="allowed",tier="pro"} 5`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestAuthz(t *testing.T) {
	s := startService(t, svcOptions{})
	// An API key in X-API-Key or Authorization: Bearer, limited by its tier.
	for i := range 10 {
		hdr := []string{"X-API-Key", freeKey}
		if i%2 == 1 {
			hdr = []string{"Authorization", "Bearer " + freeKey}
		}
		a := s.do(t, "GET", "/v1/authz", "", hdr...)
		if a.status != 200 || a.header.Get("X-Sluice-Tier") != "free" || a.header.Get("X-RateLimit-Remaining") != fmt.Sprint(9-i) {
			t.Fatalf("authz %d: %d %v %s", i, a.status, a.header, a.raw)
		}
	}
	a := s.do(t, "GET", "/v1/authz/some/original/path", "", "X-API-Key", freeKey)
	if a.status != 429 || a.header.Get("Retry-After") != "6" || a.header.Get("RateLimit") == "" {
		t.Fatalf("authz denial: %d %v", a.status, a.header)
	}
	if a := s.do(t, "GET", "/v1/authz", "", "X-API-Key", "sk-unknown"); a.status != 401 || a.header.Get("WWW-Authenticate") == "" {
		t.Fatalf("unknown key: %d %s", a.status, a.raw)
	}
	// No key: the client IP from X-Forwarded-For (the peer 127.0.0.1 is a
	// trusted proxy), with the default tier (2/min).
	for _, ip := range []string{"203.0.113.7", "203.0.113.8"} {
		for i := range 3 {
			// The client may prepend anything; only the rightmost untrusted
			// address counts.
			a := s.do(t, "GET", "/v1/authz", "", "X-Forwarded-For", fmt.Sprintf("10.9.9.%d, %s, 127.0.0.1", i, ip))
			want := 200
			if i == 2 {
				want = 429
			}
			if a.status != want || a.header.Get("X-Sluice-Identity") != "ip:"+ip || a.header.Get("X-Sluice-Tier") != "anonymous" {
				t.Fatalf("ip %s request %d: %d %v", ip, i, a.status, a.header)
			}
		}
	}
	// A user id header from the proxy.
	if a := s.do(t, "GET", "/v1/authz", "", "X-User-ID", "42"); a.status != 200 || a.header.Get("X-Sluice-Identity") != "user:42" {
		t.Fatalf("user: %d %v", a.status, a.header)
	}
	// The proxy may add a selectable policy to the caller's tier, and pick
	// a cost.
	a = s.do(t, "GET", "/v1/authz?policy=a&cost=2", "", "X-User-ID", "43")
	if a.status != 200 || a.header.Get("X-RateLimit-Remaining") != "0" || a.body["policy"] != "anon" || len(a.body["results"].([]any)) != 2 {
		t.Fatalf("policy and cost: %d %v %s", a.status, a.header, a.raw)
	}
	for _, q := range []string{"?policy=nope", "?policy=free", "?tier=free", "?cost=0", "?cost=1&cost=2", "?policy=a;x"} {
		if a := s.do(t, "GET", "/v1/authz"+q, "", "X-User-ID", "44"); a.status != 400 {
			t.Fatalf("%s: %d %s", q, a.status, a.raw)
		}
	}
}

func TestHealthReadyMetrics(t *testing.T) {
	s := startService(t, svcOptions{})
	if a := s.do(t, "GET", "/healthz", ""); a.status != 200 {
		t.Fatalf("healthz: %d", a.status)
	}
	if a := s.do(t, "GET", "/readyz", ""); a.status != 200 {
		t.Fatalf("readyz: %d", a.status)
	}
	for range 11 {
		s.check(t, fmt.Sprintf(`{"api_key":%q}`, freeKey))
	}
	s.check(t, `{"policy":"nope","key":"k"}`)
	m := s.do(t, "GET", "/metrics", "")
	if m.status != 200 {
		t.Fatalf("metrics: %d", m.status)
	}
	for _, want := range []string{
		`sluice_decisions_total{policy="free",result="allowed",tier="free"} 10`,
		`sluice_decisions_total{policy="free",result="denied",tier="free"} 1`,
		`sluice_decision_duration_seconds_count{endpoint="check"} 12`,
		`sluice_http_requests_total{code="429",handler="check"} 1`,
		`sluice_http_requests_total{code="400",handler="check"} 1`,
		`sluice_http_requests_in_flight 0`,
		`sluice_config_reloads_total{result="failure"} 0`,
		`sluice_store_circuit_state 0`,
		`sluice_store_errors_total`,
	} {
		if !strings.Contains(m.raw, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(m.raw, freeKey) || strings.Contains(m.raw, sluice.HashKey(freeKey)) || strings.Contains(m.raw, `policy="nope"`) {
		t.Error("metrics carry a key or an unknown policy name")
	}
}

func TestHotReload(t *testing.T) {
	s := startService(t, svcOptions{})
	for range 4 {
		s.check(t, `{"tier":"free","key":"h"}`)
	}
	// Raise the free limit; the state survives. The token bucket keeps its
	// level as refill time: 4 events at 10/min are 24s of refill, which at
	// 20/min is 8 events, so 20-8-1 remain after one more.
	writeAtomic(t, s.path, strings.Replace(testConfig, "free: {algorithm: token_bucket, limit: 10/min}", "free: {algorithm: token_bucket, limit: 20/min}", 1))
	if err := s.waitReload(t); err != nil {
		t.Fatalf("reload: %v", err)
	}
	if a := s.check(t, `{"tier":"free","key":"h"}`); a.status != 200 || a.num("limit") != 20 || a.num("remaining") != 11 {
		t.Fatalf("after reload: %d %s", a.status, a.raw)
	}
	// A broken file is rejected; the old config keeps serving.
	writeAtomic(t, s.path, testConfig+"\nbogus_field: 1\n")
	err := s.waitReload(t)
	if err == nil || !strings.Contains(err.Error(), "bogus_field: unknown field") {
		t.Fatalf("broken reload: %v", err)
	}
	if a := s.check(t, `{"tier":"free","key":"h"}`); a.status != 200 || a.num("limit") != 20 || a.num("remaining") != 10 {
		t.Fatalf("after rejected reload: %d %s", a.status, a.raw)
	}
	m := s.do(t, "GET", "/metrics", "").raw
	if !strings.Contains(m, `sluice_config_reloads_total{result="failure"} 1`) || !strings.Contains(m, `sluice_config_reloads_total{result="success"} 2`) {
		t.Errorf("reload metrics wrong:\n%s", grep(m, "reloads"))
	}
	// SIGHUP reloads too: fix the file without the watcher noticing first
	// is not possible, so check that a signal alone reloads the same file.
	s.sighup <- syscall.SIGHUP
	if err := s.waitReload(t); err == nil {
		t.Fatal("SIGHUP reload of the broken file succeeded")
	}
	writeAtomic(t, s.path, testConfig)
	if err := s.waitReload(t); err != nil {
		t.Fatalf("fixed reload: %v", err)
	}
	s.sighup <- syscall.SIGHUP
	if err := s.waitReload(t); err != nil {
		t.Fatalf("SIGHUP reload: %v", err)
	}
	if a := s.check(t, `{"tier":"free","key":"h"}`); a.num("limit") != 10 {
		t.Fatalf("back to 10/min: %s", a.raw)
	}
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// gatedStore holds calls for key "gate" until released, to have a request
// in flight at a known moment.
type gatedStore struct {
	sluice.Store
	entered chan struct{}
	release chan struct{}
}

func (g *gatedStore) ApplyAll(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	if strings.Contains(reqs[0].Key, "{gate}") {
		g.entered <- struct{}{}
		<-g.release
	}
	return g.Store.ApplyAll(ctx, op, reqs)
}

func (g *gatedStore) Apply(ctx context.Context, op sluice.Op, req sluice.Request) (sluice.Decision, error) {
	if strings.Contains(req.Key, "{gate}") {
		g.entered <- struct{}{}
		<-g.release
	}
	return g.Store.Apply(ctx, op, req)
}

func TestGracefulShutdownDrains(t *testing.T) {
	g := &gatedStore{entered: make(chan struct{}), release: make(chan struct{})}
	s := startService(t, svcOptions{wrap: func(st sluice.Store) sluice.Store { g.Store = st; return g }})
	var wg sync.WaitGroup
	var status int
	wg.Add(1)
	go func() {
		defer wg.Done()
		resp, err := http.Post(s.url+"/v1/check", "application/json", strings.NewReader(`{"policy":"a","key":"gate"}`))
		if err != nil {
			t.Errorf("in-flight request: %v", err)
			return
		}
		resp.Body.Close()
		status = resp.StatusCode
	}()
	<-g.entered
	s.cancel()
	// The listener closes at once; the in-flight request still completes.
	close(g.release)
	wg.Wait()
	if status != 200 {
		t.Fatalf("in-flight request got %d", status)
	}
	if err := <-s.done; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	s.done <- nil // for the cleanup
}

// failingStore fails every call, as an unreachable Redis would.
type failingStore struct{ sluice.Store }

func (failingStore) Apply(context.Context, sluice.Op, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, fmt.Errorf("dial tcp: connection refused")
}

func (failingStore) ApplyAll(context.Context, sluice.Op, []sluice.Request) ([]sluice.Decision, error) {
	return nil, fmt.Errorf("dial tcp: connection refused")
}

func TestFailurePolicies(t *testing.T) {
	for _, c := range []struct {
		policy   string
		status   int
		allowed  bool
		notReady bool
	}{
		{"fail_open", 200, true, false},
		{"fail_closed", 429, false, true},
	} {
		t.Run(c.policy, func(t *testing.T) {
			s := startService(t, svcOptions{
				config: testConfig + "store: {failure_policy: " + c.policy + "}\n",
				wrap:   func(st sluice.Store) sluice.Store { return failingStore{st} },
			})
			// One key: each call fails and is answered by the policy, but
			// one key's failures do not open the circuit; the background
			// probe, which fails too, does.
			for i := range 7 {
				a := s.check(t, `{"policy":"a","key":"f"}`)
				if a.status != c.status || a.body["allowed"] != c.allowed || a.body["degraded"] != true || a.header.Get(DegradedHeader) != c.policy ||
					(!c.allowed && a.header.Get("Retry-After") == "") {
					t.Fatalf("request %d: %d %s", i, a.status, a.raw)
				}
			}
			var m string
			if !redistest.PollUntil(time.Now().Add(10*time.Second), func() bool {
				m = s.do(t, "GET", "/metrics", "").raw
				return strings.Contains(m, `sluice_store_circuit_state 2`) && strings.Contains(m, `sluice_store_circuit_opens_total 1`)
			}) {
				t.Fatalf("circuit not open by the probe:\n%s", grep(m, "sluice_store"))
			}
			m = s.do(t, "GET", "/metrics", "").raw
			for _, want := range []string{
				`sluice_store_errors_total 7`,
				`sluice_decisions_total{policy="a",result="degraded",tier="-"} 7`,
			} {
				if !strings.Contains(m, want) {
					t.Errorf("metrics lack %s:\n%s", want, grep(m, "sluice_store"))
				}
			}
			ready := s.do(t, "GET", "/readyz", "")
			if (ready.status == 503) != c.notReady {
				t.Errorf("readyz: %d %s", ready.status, ready.raw)
			}
			// With the circuit open the store is not asked.
			s.check(t, `{"policy":"a","key":"f"}`)
			if m := s.do(t, "GET", "/metrics", "").raw; !strings.Contains(m, `sluice_store_errors_total 7`) {
				t.Errorf("open circuit asked the store:\n%s", grep(m, "sluice_store"))
			}
		})
	}
}

func TestAuthzDenyStatusForNGINX(t *testing.T) {
	s := startService(t, svcOptions{config: strings.Replace(testConfig, "  default_tier: anonymous\n", "  default_tier: anonymous\n  deny_status: 403\n", 1)})
	for i := range 3 {
		a := s.do(t, "GET", "/v1/authz", "", "X-User-ID", "n1")
		if want := map[bool]int{true: 200, false: 403}[i < 2]; a.status != want || (want == 403 && a.header.Get("Retry-After") == "") {
			t.Fatalf("authz %d: %d %v", i, a.status, a.header)
		}
	}
	// /v1/check keeps 429.
	s.check(t, `{"policy":"b","key":"n2","cost":2}`)
	if a := s.check(t, `{"policy":"b","key":"n2"}`); a.status != 429 {
		t.Fatalf("check: %d", a.status)
	}
}

// TestShadowNotChargedWhenDenied: a request the enforced policy denies does
// not use up the shadow policy; the shadow policies report by peeking.
func TestShadowNotChargedWhenDenied(t *testing.T) {
	cfg := strings.Replace(testConfig, "policies:\n", "policies:\n  tight: {limit: 2/min}\n  watch: {algorithm: fixed_window, limit: 100/day, shadow: true}\n", 1)
	cfg = strings.Replace(cfg, "  free: {policies: [free]}\n", "  free: {policies: [free]}\n  t: {policies: [tight, watch]}\n", 1)
	s := startService(t, svcOptions{config: cfg})
	var last answer
	for i := range 4 {
		last = s.check(t, `{"tier":"t","key":"k"}`)
		if want := map[bool]int{true: 200, false: 429}[i < 2]; last.status != want {
			t.Fatalf("request %d: %d %s", i, last.status, last.raw)
		}
	}
	watch := last.body["results"].([]any)[1].(map[string]any)
	if watch["shadow"] != true || watch["remaining"] != float64(98) {
		t.Fatalf("shadow policy after 2 admitted and 2 denied requests: %s (want remaining 98)", last.raw)
	}
}

// TestResetAudit: both resets, POST /v1/reset and the console's, log one
// audit line with the name of the admin token that made it, as the
// overrides' changes do. /v1/reset logged neither: an audit trail filtered
// on audit=true missed every reset made through the API.
func TestResetAudit(t *testing.T) {
	logs := &syncBuffer{}
	s := startService(t, svcOptions{config: consoleConfig, log: logs})
	if a := s.do(t, "POST", "/v1/reset", `{"policy":"b","key":"r"}`, "Authorization", "Bearer "+adminToken); a.status != 200 {
		t.Fatalf("reset: %d %s", a.status, a.raw)
	}
	if a := s.do(t, "POST", "/ui/api/reset?id=q&confirm=q", "", "Authorization", "Bearer "+adminToken); a.status != 200 {
		t.Fatalf("console reset: %d %s", a.status, a.raw)
	}
	var lines []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "msg=reset ") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("reset lines:\n%s", strings.Join(lines, "\n"))
	}
	for i, want := range []string{"identity=r policies=1 from=api", "identity=q policies=6 from=console"} {
		if l := lines[i]; !strings.Contains(l, "audit=true by=SLUICE_ADMIN_TOKEN") || !strings.Contains(l, want) {
			t.Errorf("reset line %d: %s", i, l)
		}
	}
}
