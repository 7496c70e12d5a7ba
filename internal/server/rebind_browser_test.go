package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/gateway"
	"github.com/sluice-io/sluice/memstore"
)

// The rebinding test plays a DNS rebinding attack on a real headless
// Chromium. The attacker's page is at http://evil.test:P/attack.html,
// evil.test resolving to 127.0.0.1 (--host-resolver-rules, as an
// attacker's DNS answers with a short TTL). P is a rebinder (below): on
// each new connection it answers the page itself, or, for any other first
// request, splices the connection byte for byte to the sluice listener, as
// if evil.test had been rebound to sluice's address between the page's
// load and its requests. So sluice sees exactly what Chromium sends for a
// same-origin request of a page on evil.test: Host evil.test:P, and for a
// GET over plain http with referrerPolicy "no-referrer" no Origin, no
// Referer and no Sec-Fetch-* at all (Chromium sends Fetch Metadata only to
// potentially trustworthy origins: https://w3c.github.io/webappsec-fetch-metadata/
// "set the Sec-Fetch-* headers", step 1; and Origin on a GET only for CORS
// requests: https://fetch.spec.whatwg.org/#append-a-request-origin-header).

// rebinder listens on 127.0.0.1 and serves page at /attack.html to each
// connection whose first request asks for it (answered with Connection:
// close, so that the page's own requests open new connections), and
// splices every other connection to target. It returns its port.
func rebinder(t *testing.T, target string, page string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	const want = "GET /attack.html "
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				head, err := br.Peek(len(want))
				if err != nil {
					return
				}
				if string(head) == want {
					if _, err := http.ReadRequest(br); err != nil {
						return
					}
					fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(page), page)
					return
				}
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, br); _ = up.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// rebindRequest is one request of the attacker's page.
type rebindRequest struct {
	Method  string            `json:"method"`
	Path    string            `json:"path"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    string            `json:"body,omitempty"`
}

// rebindResult is what the page got.
type rebindResult struct {
	Policy   string `json:"rp"`
	Method   string `json:"method"`
	Path     string `json:"path"`
	Status   int    `json:"status"`
	Body     string `json:"body"`
	Identity string `json:"identity"`
}

// attackPage is the attacker's page: it sends each request with each
// referrer policy ("" is the default, strict-origin-when-cross-origin),
// reads what it can, and leaves the results in window.results.
func attackPage(reqs []rebindRequest) string {
	js, _ := json.Marshal(reqs)
	return `<!doctype html><title>cute cats</title><script>
window.results = null;
(async () => {
  const out = [];
  for (const rp of ["no-referrer", "same-origin", ""]) {
    for (const q of ` + string(js) + `) {
      const opts = { method: q.method, headers: q.headers || {}, cache: "no-store" };
      if (rp) opts.referrerPolicy = rp;
      if (q.body) opts.body = q.body;
      try {
        const r = await fetch(q.path, opts);
        const body = await r.text();
        out.push({ rp: rp || "default", method: q.method, path: q.path, status: r.status, body: body.slice(0, 300), identity: r.headers.get("X-Sluice-Identity") || "" });
      } catch (e) {
        out.push({ rp: rp || "default", method: q.method, path: q.path, status: -1, body: String(e), identity: "" });
      }
    }
  }
  window.results = out;
})();
</script>`
}

// runAttack loads the attacker's page at evil.test:port in ctx's browser
// and returns its results.
func runAttack(ctx context.Context, t *testing.T, port string) []rebindResult {
	t.Helper()
	run := browserRunner(ctx, t, 60*time.Second)
	run("the attacker's page", chromedp.Navigate("http://evil.test:"+port+"/attack.html"), poll("window.results !== null"))
	raw := evalIn[string](ctx, t, "JSON.stringify(window.results)")
	var out []rebindResult
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		t.Fatalf("results %s: %v", raw, err)
	}
	if len(out) == 0 {
		t.Fatal("the page sent nothing")
	}
	return out
}

// TestRebindBrowser: a page on evil.test, rebound to sluice's listeners,
// reads nothing and spends nothing, with every referrer policy: the
// console's data, /v1/status, /metrics and the admin API answer it 403
// (sluice's own answer, naming DNS rebinding: the request did reach it),
// its /v1/check spends no one's limit, its /v1/authz with X-User-ID is
// charged as its own address, never as the user, although 127.0.0.1 is a
// trusted proxy; and on the gateway's listener its model list, metrics and
// completions are refused, the upstream seeing nothing.
func TestRebindBrowser(t *testing.T) {
	ctx := browser(t, chromedp.Flag("host-resolver-rules", "MAP evil.test 127.0.0.1"))

	// The service: console on and public to whoever reaches it (so that
	// the Host check alone keeps its data; TestConsoleSession tests the
	// sessions), 127.0.0.1 a trusted proxy.
	s := startService(t, svcOptions{config: testConfig + "console: {enabled: true, public_read: true}\n"})
	target := strings.TrimPrefix(s.url, "http://")
	serveReqs := []rebindRequest{
		{Method: "GET", Path: "/ui/api/overview"},
		{Method: "GET", Path: "/ui/api/top"},
		{Method: "GET", Path: "/ui/api/identity?id=user:alice"},
		{Method: "GET", Path: "/ui/api/overrides"},
		{Method: "GET", Path: "/ui/api/series"},
		{Method: "GET", Path: "/ui/"},
		{Method: "GET", Path: "/v1/status?policy=a&key=victim"},
		{Method: "GET", Path: "/v1/overrides"},
		{Method: "GET", Path: "/metrics"},
		{Method: "POST", Path: "/v1/check", Body: `{"policy":"a","key":"victim"}`},
		{Method: "POST", Path: "/v1/reset", Body: `{"policy":"a","key":"victim"}`},
		{Method: "GET", Path: "/v1/authz", Headers: map[string]string{"X-User-ID": "alice"}},
	}
	port := rebinder(t, target, attackPage(serveReqs))
	results := runAttack(ctx, t, port)
	if len(results) != 3*len(serveReqs) {
		t.Fatalf("%d results, want %d", len(results), 3*len(serveReqs))
	}
	for _, r := range results {
		if r.Path == "/v1/authz" {
			if r.Identity == "user:alice" || (r.Status != 200 && r.Status != 429) {
				t.Errorf("%s %s (referrer policy %s): %d, charged %q: a rebound page spent alice's limit", r.Method, r.Path, r.Policy, r.Status, r.Identity)
			}
			continue
		}
		if r.Status != http.StatusForbidden || !strings.Contains(r.Body, "DNS rebinding") {
			t.Errorf("%s %s (referrer policy %s): %d %s, want sluice's 403", r.Method, r.Path, r.Policy, r.Status, r.Body)
		}
	}
	// Nothing spent: the victim's limit is whole (the clock is the
	// service's fake one: nothing refilled), and alice's first request
	// through a real proxy (its own Host, no browser header) finds hers
	// whole too.
	if a := s.do(t, "GET", "/v1/status?policy=a&key=victim", ""); a.status != 200 || a.num("remaining") != 5 {
		t.Errorf("the victim's limit after the attack: %d %s", a.status, a.raw)
	}
	if a := s.do(t, "GET", "/v1/authz", "", "X-User-ID", "alice"); a.header.Get("X-Sluice-Identity") != "user:alice" || a.header.Get("X-RateLimit-Remaining") != "1" {
		t.Errorf("alice through the proxy after the attack: %d %v", a.status, a.header)
	}

	// The gateway's listener, with a key the page holds.
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: "sk-up"})
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	const clientKey = "sk-client-rebind-0001"
	gcfg := &gateway.Config{
		Upstream: gateway.UpstreamConfig{BaseURL: up.URL() + "/v1", APIKeyEnv: "UP_KEY"},
		Store:    gateway.StoreConfig{Timeout: 5 * time.Second},
		Tiers:    map[string]gateway.TierConfig{"t": gateway.Tier(gateway.Limits{RPM: 1000})},
		Keys:     []gateway.KeyConfig{{Name: "c", Hash: sluice.HashKey(clientKey), Tier: "t"}},
	}
	if err := gcfg.Validate(); err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(gateway.Options{Config: gcfg, Store: st, Getenv: func(string) string { return "sk-up" }})
	if err != nil {
		t.Fatal(err)
	}
	addr := make(chan net.Addr, 1)
	gsrv := &gateway.Server{Gateway: gw, Addr: "127.0.0.1:0", ServeMetrics: true, OnListen: func(a net.Addr) { addr <- a }}
	gctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gsrv.Run(gctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	})
	auth := map[string]string{"Authorization": "Bearer " + clientKey}
	gwReqs := []rebindRequest{
		{Method: "GET", Path: "/v1/models", Headers: auth},
		{Method: "GET", Path: "/metrics"},
		{Method: "POST", Path: "/v1/chat/completions", Headers: auth, Body: `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`},
	}
	gport := rebinder(t, (<-addr).String(), attackPage(gwReqs))
	for _, r := range runAttack(ctx, t, gport) {
		if r.Status != http.StatusForbidden || !strings.Contains(r.Body, "host_not_allowed") {
			t.Errorf("gateway %s %s (referrer policy %s): %d %s, want the gateway's 403", r.Method, r.Path, r.Policy, r.Status, r.Body)
		}
	}
	if n := up.Count(); n != 0 {
		t.Errorf("the upstream saw %d requests of the rebound page", n)
	}
}
