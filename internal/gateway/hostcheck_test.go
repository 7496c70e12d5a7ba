package gateway

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/memstore"
)

// TestServerHostCheck: DNS rebinding on the gateway's listener. A page on
// evil.example rebound to the gateway (Host: evil.example, Origin equal to
// it) is refused 403 host_not_allowed on every path (before the upstream
// or the limits see it, so nothing is spent); loopback, localhost, the
// config's allowed_hosts and clients that are not browsers are served.
func TestServerHostCheck(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey})
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	cfg := &Config{
		AllowedHosts: []string{"GW.Internal.Example.", "*.corp.example"},
		Upstream:     UpstreamConfig{BaseURL: up.URL() + "/v1", APIKeyEnv: "TEST_UPSTREAM_KEY"},
		Store:        StoreConfig{Timeout: 5 * time.Second},
		Tiers:        map[string]TierConfig{"t": Tier(Limits{RPM: 1000})},
		Keys:         []KeyConfig{{Name: "test", Hash: sluice.HashKey(clientKey), Tier: "t"}},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	gw, err := New(Options{Config: cfg, Store: st, Getenv: func(k string) string { return map[string]string{"TEST_UPSTREAM_KEY": upstreamKey}[k] }})
	if err != nil {
		t.Fatal(err)
	}
	addr := make(chan net.Addr, 1)
	srv := &Server{Gateway: gw, Addr: "127.0.0.1:0", ServeMetrics: true, OnListen: func(a net.Addr) { addr <- a }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	})
	base := "http://" + (<-addr).String()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(base, "http://"))
	do := func(method, path, host string, hdr ...string) (int, string) {
		t.Helper()
		var body io.Reader
		if method == "POST" {
			body = strings.NewReader(chatBody)
		}
		req, err := http.NewRequest(method, base+path, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		req.Header.Set("Authorization", "Bearer "+clientKey)
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	paths := []struct{ method, path string }{
		{"POST", "/v1/chat/completions"},
		{"GET", statusPath},
		{"GET", "/v1/models"},
		{"GET", "/metrics"},
		{"GET", "/healthz"},
	}
	marks := func(host string) [][]string {
		return [][]string{
			{"Origin", "http://" + host},
			{"Referer", "http://" + host + "/"},
			{"Sec-Fetch-Site", "same-origin", "Sec-Fetch-Mode", "cors"},
		}
	}
	for _, host := range []string{"evil.example", "evil.example:" + port, "gw.internal.example.evil.example", "corp.example"} {
		for _, m := range marks(host) {
			for _, p := range paths {
				code, body := do(p.method, p.path, host, m...)
				if code != http.StatusForbidden || !strings.Contains(body, `"host_not_allowed"`) || !strings.Contains(body, "DNS rebinding") || !strings.Contains(body, "allowed_hosts") {
					t.Errorf("%s %s Host %s %v: %d %s, want 403 host_not_allowed", p.method, p.path, host, m, code, body)
				}
			}
		}
	}
	if n := up.Count(); n != 0 {
		t.Fatalf("the upstream saw %d requests of a rebound page", n)
	}
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "gw.internal.example:" + port, "a.corp.example"} {
		for _, m := range marks(host) {
			for _, p := range paths {
				if code, body := do(p.method, p.path, host, m...); code != http.StatusOK {
					t.Errorf("%s %s Host %s %v: %d %s, want 200", p.method, p.path, host, m, code, body)
				}
			}
		}
	}
	// No browser's mark: a read (GET) is refused all the same, since
	// Chromium sends none on a same-origin GET over http from a page whose
	// referrer policy is no-referrer; a POST (an SDK's, with a Host of its
	// own; a browser always adds Origin to one) passes with any Host.
	for _, p := range paths {
		code, body := do(p.method, p.path, "evil.example")
		if p.method == "GET" && p.path != "/healthz" && code != http.StatusForbidden {
			t.Errorf("%s %s unmarked with Host evil.example: %d %s, want 403", p.method, p.path, code, body)
		}
		if p.method != "GET" && code != http.StatusOK {
			t.Errorf("%s %s from an SDK with Host evil.example: %d %s", p.method, p.path, code, body)
		}
	}
	if code, body := do("GET", "/healthz", "evil.example"); code != http.StatusOK {
		t.Errorf("an unmarked probe of /healthz: %d %s", code, body)
	}
}

// TestConfigAllowedHosts: allowed_hosts entries are normalized, and a
// malformed one or too many are named with their line.
func TestConfigAllowedHosts(t *testing.T) {
	base := "upstream: {base_url: \"http://127.0.0.1:1/v1\"}\ntiers: {t: {rpm: 1}}\n"
	c, err := Parse("g.yaml", []byte(base+"allowed_hosts: [GW.Example., \"*.Corp.Example\", \"[::1]\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.AllowedHosts, ","); got != "gw.example,*.corp.example,::1" {
		t.Fatalf("normalized: %s", got)
	}
	for doc, want := range map[string]string{
		"allowed_hosts: [gw.example, \"http://x.example\"]\n":           `g.yaml:3: allowed_hosts[1]: "http://x.example": want a host name`,
		"allowed_hosts: [\"x.example:8080\"]\n":                         `allowed_hosts[0]: "x.example:8080": want a host name`,
		"allowed_hosts: [" + strings.Repeat("a.example, ", 257) + "]\n": "allowed_hosts: 257 hosts; at most 256",
	} {
		_, err := Parse("g.yaml", []byte(base+doc))
		if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v, want %q", doc, err, want)
		}
	}
}

// TestErrorsNotHTMLEscaped: the gateway's error bodies show "<key>" as
// written, never as \u003ckey\u003e (issue 27), in OpenAI's and
// Anthropic's forms, with nosniff.
func TestErrorsNotHTMLEscaped(t *testing.T) {
	e := newEnv(t, Limits{RPM: 100}, fakeopenai.Options{})
	for _, c := range []struct{ path, hdr, want string }{
		{"/v1/chat/completions", "", "Authorization: Bearer <key>."},
		{"/v1/messages", "x-api-key", "x-api-key: <key>."},
	} {
		req, err := http.NewRequest("POST", e.srv.URL+c.path, strings.NewReader(chatBody))
		if err != nil {
			t.Fatal(err)
		}
		if c.hdr != "" {
			req.Header.Set(c.hdr, "sk-wrong")
			req.Header.Set("anthropic-version", "2023-06-01")
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized || !strings.Contains(string(b), c.want) || strings.Contains(string(b), `\u003c`) {
			t.Errorf("%s: %d %s, want %q as written", c.path, res.StatusCode, b, c.want)
		}
		if res.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: no nosniff", c.path)
		}
	}
	if got := string(marshalJSON(map[string]string{"m": "<a&b>"})); got != `{"m":"<a&b>"}` {
		t.Errorf("marshalJSON: %s", got)
	}
}

// TestUnknownPathBeforeAuth: a path the gateway does not serve is 404
// unknown_url whatever the key (none, a wrong one, a right one), never 401
// "invalid API key" (issue 27); a served path still needs the key.
func TestUnknownPathBeforeAuth(t *testing.T) {
	e := newEnv(t, Limits{RPM: 100}, fakeopenai.Options{})
	for _, c := range []struct{ method, path string }{
		{"POST", "/v1/chat/completion"},
		{"POST", "/v1/chat/completions/"},
		{"POST", "/v1/images/generations"},
		{"GET", "/v1/chat/completions"},
		{"GET", "/v1/files"},
		{"DELETE", "/v1/models/ft-1"},
		{"POST", "/v1/status"},
		{"GET", "/v2/models"},
	} {
		for _, auth := range []string{"", "Bearer sk-wrong", "Bearer " + clientKey} {
			res := e.do(c.method, c.path, auth, "{}", nil)
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusNotFound || !strings.Contains(string(b), `"unknown_url"`) {
				t.Errorf("%s %s with %q: %d %s, want 404 unknown_url", c.method, c.path, auth, res.StatusCode, b)
			}
		}
	}
	for _, c := range []struct{ method, path string }{
		{"POST", "/v1/chat/completions"},
		{"GET", "/v1/status"},
		{"GET", "/v1/models"},
	} {
		res := e.do(c.method, c.path, "Bearer sk-wrong", "{}", nil)
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s %s with a wrong key: %d, want 401", c.method, c.path, res.StatusCode)
		}
	}
	if n := e.up.Count(); n != 0 {
		t.Errorf("the upstream saw %d requests", n)
	}
}
