package server

import (
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/sluice-io/sluice"
)

// TestHostCheck: DNS rebinding. A page on evil.example whose name is then
// pointed at sluice sends Host: evil.example and passes the cross-origin
// check (its Origin is its Host); it must not read the console's API or
// /metrics, peek or spend anyone's limit. Every Host below is sent with
// every set of a browser's marks to every endpoint, through the real
// listener: a request is refused (403, naming allowed_hosts) exactly when
// its Host is not allowed and it carries a browser's marks or it reads
// state (every endpoint but POST /v1/check, which SDKs send with Hosts of
// their own and a browser always marks with Origin, and forward-auth,
// which decides itself): a rebound page's GET may carry no mark at all.
func TestHostCheck(t *testing.T) {
	s := "_host"
	cfg := strings.NewReplacer("{S}", s, "{FREE}", sluice.HashKey(bypassFree), "{ENT}", sluice.HashKey(bypassEnt)).Replace(bypassConfig) +
		"console: {enabled: true, public_read: true}\nallowed_hosts: [sluice.internal.example, \"*.corp.example\"]\n"
	svc := startService(t, svcOptions{config: cfg})
	u, _ := url.Parse(svc.url)
	port := u.Port()
	spend := `{"policy":"roomy` + s + `","key":"victim"}`
	endpoints := []struct{ method, path, body string }{
		{"GET", "/ui/api/top", ""},
		{"GET", "/ui/api/overview", ""},
		{"GET", "/ui/", ""},
		{"GET", "/metrics", ""},
		{"GET", "/v1/status?policy=roomy" + s + "&key=victim", ""},
		{"POST", "/v1/check", spend},
		{"POST", "/v1/reset", spend},
		{"GET", "/v1/overrides", ""},
		{"GET", "/v1/authz", ""},
		{"POST", "/v1/authz/login", ""},
	}
	hosts := []struct {
		host    string
		allowed bool
	}{
		{"127.0.0.1:" + port, true},
		{"[::1]:" + port, true},
		{"[::ffff:127.0.0.1]:" + port, true},
		{"10.1.2.3", true},
		{"localhost:" + port, true},
		{"LOCALHOST.:" + port, true},
		{"console.localhost:" + port, true},
		{"sluice.internal.example:" + port, true},
		{"Sluice.Internal.Example", true},
		{"a.corp.example:" + port, true},
		{"evil.example:" + port, false},
		{"evil.example", false},
		{"EVIL.example.:" + port, false},
		{"corp.example:" + port, false}, // *.corp.example is the subdomains
		{"evilcorp.example", false},
		{"127.0.0.1.evil.example:" + port, false},
		{"localhost.evil.example:" + port, false},
		{"sluice.internal.example.evil.example", false},
		{"::1", false}, // malformed: IPv6 needs brackets
	}
	marks := []struct {
		name    string
		hdr     func(host string) []string
		browser bool
	}{
		{"none", func(string) []string { return nil }, false},
		{"curl -d", func(string) []string { return []string{"Content-Type", "application/x-www-form-urlencoded"} }, false},
		{"Origin = Host", func(h string) []string { return []string{"Origin", "http://" + h} }, true},
		{"Origin null", func(string) []string { return []string{"Origin", "null"} }, true},
		{"Sec-Fetch-Site same-origin", func(string) []string { return []string{"Sec-Fetch-Site", "same-origin"} }, true},
		{"Sec-Fetch-Mode alone", func(string) []string { return []string{"Sec-Fetch-Mode", "cors"} }, true},
		{"Sec-Fetch-Dest alone", func(string) []string { return []string{"Sec-Fetch-Dest", "empty"} }, true},
		{"Referer alone", func(h string) []string { return []string{"Referer", "http://" + h + "/"} }, true},
		{"all of a fetch", func(h string) []string {
			return []string{"Origin", "http://" + h, "Sec-Fetch-Site", "same-origin", "Sec-Fetch-Mode", "cors", "Sec-Fetch-Dest", "empty", "Referer", "http://" + h + "/"}
		}, true},
	}
	for _, h := range hosts {
		for _, m := range marks {
			for _, e := range endpoints {
				hdr := append([]string{"Host", h.host, "X-API-Key", bypassEnt}, m.hdr(h.host)...)
				a := svc.do(t, e.method, e.path, e.body, hdr...)
				refused := a.status == 403 && strings.Contains(a.raw, "allowed_hosts")
				always := e.path != "/v1/check" && !strings.HasPrefix(e.path, "/v1/authz")
				want := !h.allowed && !strings.HasPrefix(e.path, "/v1/authz") && (m.browser || always)
				if refused != want {
					t.Errorf("%s %s, Host %q, %s: %d %s; refused %v, want %v", e.method, e.path, h.host, m.name, a.status, strings.TrimSpace(a.raw), refused, want)
				}
				if refused && !strings.Contains(a.raw, "DNS rebinding") {
					t.Errorf("the refusal does not say why: %s", a.raw)
				}
				// An opaque origin ("null") is cross-origin: sameOrigin
				// refuses it from a POST wherever it comes from.
				crossOrigin := m.name == "Origin null" && e.method == "POST"
				if !refused && !crossOrigin && (e.path == "/ui/api/top" || e.path == "/metrics" || e.path == "/v1/check") && a.status != 200 {
					t.Errorf("%s %s, Host %q, %s: %d %s, want 200", e.method, e.path, h.host, m.name, a.status, a.raw)
				}
			}
		}
	}
	// Everything a rebound page tried to spend was refused: only the
	// requests that passed were charged.
	var passed int64
	for _, h := range hosts {
		for _, m := range marks {
			if (!m.browser || h.allowed) && m.name != "Origin null" {
				passed++
			}
		}
	}
	if a := svc.do(t, "GET", "/v1/status?policy=roomy"+s+"&key=victim", ""); a.status != 200 || a.num("remaining") != 1000-passed {
		t.Fatalf("victim's limit: %d %s, want %d remaining", a.status, a.raw, 1000-passed)
	}
	// allowed_hosts is read at each request: a reload that adds a name
	// lets browsers reach sluice by it.
	writeAtomic(t, svc.path, strings.Replace(cfg, "allowed_hosts: [", "allowed_hosts: [evil.example, ", 1))
	if err := svc.waitReload(t); err != nil {
		t.Fatal(err)
	}
	if a := svc.do(t, "GET", "/metrics", "", "Host", "evil.example:"+port, "Sec-Fetch-Site", "same-origin"); a.status != 200 {
		t.Fatalf("after the reload: %d %s", a.status, a.raw)
	}
	// "*" turns the check off.
	writeAtomic(t, svc.path, strings.Replace(cfg, "allowed_hosts: [", `allowed_hosts: ["*", `, 1))
	if err := svc.waitReload(t); err != nil {
		t.Fatal(err)
	}
	if a := svc.do(t, "GET", "/metrics", "", "Host", fmt.Sprintf("other.example:%s", port), "Origin", "http://other.example"); a.status != 200 {
		t.Fatalf("with allowed_hosts *: %d %s", a.status, a.raw)
	}
}

// TestAuthzBrowserUserHeader: 127.0.0.1 is a trusted proxy (as in
// examples/sluice.yaml), and a browser runs on the same machine. A page
// whose name is rebound to 127.0.0.1 sends X-User-ID itself: its request
// carries a Host sluice is not known by, or a browser's marks (Origin,
// Referer, Sec-Fetch-*; a same-origin no-referrer GET over http carries
// none, so the Host decides). Such a request is charged as its peer, not
// as the user it names; a proxy's request (its own Host, no browser
// header: NGINX's proxy_pass with proxy_pass_request_headers off,
// Traefik's authRequestHeaders) is charged as the user.
func TestAuthzBrowserUserHeader(t *testing.T) {
	s := startService(t, svcOptions{})
	u, _ := url.Parse(s.url)
	port := u.Port()
	for _, c := range []struct {
		name string
		hdr  []string
		want string
	}{
		{"proxy", []string{"Host", "127.0.0.1:" + port}, "user:alice"},
		{"proxy by localhost", []string{"Host", "localhost:" + port}, "user:alice"},
		{"rebound page, no mark", []string{"Host", "evil.test:" + port}, "ip:127.0.0.1"},
		{"rebound page, Origin", []string{"Host", "evil.test:" + port, "Origin", "http://evil.test:" + port}, "ip:127.0.0.1"},
		{"page at 127.0.0.1, Sec-Fetch-Site", []string{"Host", "127.0.0.1:" + port, "Sec-Fetch-Site", "same-origin"}, "ip:127.0.0.1"},
		{"page at 127.0.0.1, Referer", []string{"Host", "127.0.0.1:" + port, "Referer", "http://127.0.0.1:" + port + "/"}, "ip:127.0.0.1"},
		{"page at 127.0.0.1, Origin", []string{"Host", "127.0.0.1:" + port, "Origin", "http://127.0.0.1:" + port}, "ip:127.0.0.1"},
	} {
		a := s.do(t, "GET", "/v1/authz", "", append([]string{"X-User-ID", "alice"}, c.hdr...)...)
		// anon allows 2/min: the later ones answer 429, charged all the same.
		if got := a.header.Get("X-Sluice-Identity"); (a.status != 200 && a.status != 429) || got != c.want {
			t.Errorf("%s: %d, charged %q, want %q", c.name, a.status, got, c.want)
		}
	}
	// The documented proxies still key their clients by address, whatever
	// Host they send: Traefik's is its address's ("sluice:8080", a Compose
	// service name), Caddy's and Envoy's the site's, with a browser's
	// headers passed on; X-Forwarded-For from a trusted peer is believed.
	for _, hdr := range [][]string{
		{"Host", "sluice:" + port},
		{"Host", "api.example.com", "Referer", "https://api.example.com/app", "Sec-Fetch-Site", "same-origin"},
	} {
		a := s.do(t, "GET", "/v1/authz", "", append([]string{"X-Forwarded-For", "203.0.113.7"}, hdr...)...)
		if got := a.header.Get("X-Sluice-Identity"); got != "ip:203.0.113.7" {
			t.Errorf("a proxy's request %v: %d, charged %q, want ip:203.0.113.7", hdr, a.status, got)
		}
	}
}

// TestHostCheckKubernetes: with the chart's environment, what Kubernetes
// sends passes with no browser header: Prometheus's pod targets and the
// kubelet's probes (Host: the pod's IP and port), clients by the
// Service's names (short, namespaced, .svc, the cluster domain's), the
// pod's own name; a name that only ends like one of them does not.
func TestHostCheckKubernetes(t *testing.T) {
	t.Setenv("SLUICE_K8S_SERVICE", "rl-sluice")
	t.Setenv("SLUICE_K8S_NAMESPACE", "prod")
	s := startService(t, svcOptions{config: testConfig + "console: {enabled: true, public_read: true}\n"})
	for _, c := range []struct {
		path, host string
		want       int
	}{
		{"/metrics", "10.244.1.7:8080", 200},
		{"/metrics", "[fd00:10:244::7]:8080", 200},
		{"/readyz", "10.244.1.7:8080", 200},
		{"/healthz", "10.244.1.7:8080", 200},
		{"/v1/status?policy=a&key=k", "rl-sluice:8080", 200},
		{"/v1/status?policy=a&key=k", "rl-sluice.prod:8080", 200},
		{"/v1/status?policy=a&key=k", "rl-sluice.prod.svc:8080", 200},
		{"/ui/api/top", "rl-sluice.prod.svc.cluster.local:8080", 200},
		{"/ui/api/top", "rl-sluice.prod.svc.cluster.local.evil.test:8080", 403},
		{"/ui/api/top", "rl-sluice.other:8080", 403},
		{"/metrics", "sluice.evil.test", 403},
	} {
		if a := s.do(t, "GET", c.path, "", "Host", c.host); a.status != c.want {
			t.Errorf("GET %s Host %s: %d %s, want %d", c.path, c.host, a.status, a.raw, c.want)
		}
	}
}
