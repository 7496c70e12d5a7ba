package server

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-io/sluice"
)

// unknownKeysDefaultTier edits a bypass config to give unknown API keys
// the default tier (each its own limit), as behind an upstream that checks
// keys.
func unknownKeysDefaultTier(cfg string) string {
	return strings.Replace(cfg, "authz:\n", "authz:\n  unknown_keys: default_tier\n", 1)
}

// bypass2Tricks are the tricks of a second round, run as TestBypass runs
// its own.
var bypass2Tricks = []bypassTrick{
	// The upstream checks the key in Authorization; sluice reads
	// X-API-Key first. A fresh invented key there each time would be a
	// fresh default-tier limit each time.
	{name: "authz/fresh unknown key beside the checked one", config: unknownKeysDefaultTier, limit: 3, want: 0, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-API-Key", fmt.Sprintf("sk-invented-%d", i), "Authorization", "Bearer "+bypassFree)
	}},
	// The upstream checks the key in Authorization, the free one; sluice
	// read X-API-Key first and charged the enterprise key, whose roomy
	// limit then served the free key's owner. Two valid keys are 400.
	{name: "authz/two valid keys, the upstream checks the other", limit: 3, want: 0, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-API-Key", bypassEnt, "Authorization", "Bearer "+bypassFree)
	}},
	// An upstream that trims keys (JavaScript's trim, .NET's Trim) takes
	// "K\u00a0" for K; each spelling was a fresh unknown key.
	{name: "authz/white space around a key is the key", config: unknownKeysDefaultTier, limit: 3, want: 3, n: 8, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", rotate([][]string{
			{"Authorization", "Bearer " + bypassFree + "\u00a0"}, {"Authorization", "Bearer \ufeff" + bypassFree},
			{"Authorization", "Bearer " + bypassFree + "\u3000\u2003"}, {"X-API-Key", bypassFree + "\ufeff"},
			{"X-API-Key", "\u00a0" + bypassFree}, {"X-API-Key", "Bearer " + bypassFree + "\u0085"},
		}, i)...)
	}},
	// A known key beside another credential (a JWT for the upstream) is
	// charged as that key.
	{name: "authz/known key beside a bearer token", config: unknownKeysDefaultTier, limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-API-Key", bypassFree, "Authorization", fmt.Sprintf("Bearer eyJ.%d.sig", i))
	}},
	// A backend that compares paths case-insensitively by upper case
	// (ASP.NET Core's routing) serves /logın (dotless i) and /ſ (long s)
	// as /login and /s.
	{name: "authz/route not dodged by letters whose upper case is ASCII", limit: 2, want: 2, n: 8, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-API-Key", bypassEnt, "X-Forwarded-Uri", rotate([]string{
			"/logın", "/LOGıN/x", "/log%C4%B1n", "/log%c4%b1n?x", "/x/../logın",
		}, i))
	}},
	// Headers sluice does not read cannot name the client (the peer,
	// 127.0.0.1, is trusted and sends no X-Forwarded-For).
	{name: "authz/X-Real-IP and Forwarded ignored", limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-Real-IP", fmt.Sprintf("198.51.100.%d", i), "Forwarded", fmt.Sprintf("for=198.51.100.%d", i),
			"True-Client-IP", fmt.Sprintf("198.51.100.%d", i), "CF-Connecting-IP", fmt.Sprintf("198.51.100.%d", i))
	}},
	// Spellings of one address, as a trusted proxy may write it, are one
	// client.
	{name: "authz/X-Forwarded-For spellings of one address", limit: 3, want: 3, n: 8, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-Forwarded-For", rotate([]string{
			"198.51.100.9", "::ffff:198.51.100.9", "[::ffff:198.51.100.9]:80", " 198.51.100.9 ", "198.51.100.9:1234", "::FFFF:C633:6409",
		}, i))
	}},
	{name: "authz/X-Forwarded-For spellings of one IPv6 /64", limit: 3, want: 3, n: 8, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-Forwarded-For", rotate([]string{
			"2001:DB8:9:9::1", "2001:db8:9:9:0:0:0:2", "[2001:db8:9:9::3]:443", "2001:0db8:0009:0009::4", "fe80::1%eth0, 2001:db8:9:9::5",
		}, i))
	}},
	// With authz.ipv6_prefix: 48, the /64s of one /48 are one client (a
	// tunnel broker hands out a /48 for free: 65,536 clients at /64).
	{name: "authz/ipv6_prefix 48 keys a /48 as one client", config: ipv6Prefix48, limit: 3, want: 3, n: 8, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-Forwarded-For", fmt.Sprintf("2001:db8:77:%x::1", i))
	}},
	// A backend that resolves the request target against a base URL
	// (WHATWG URL, as Node's docs show: new URL(req.url, base)) serves
	// //evil.example/login as /login.
	{name: "authz/route not dodged by an authority in the path", limit: 2, want: 2, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-API-Key", bypassEnt, "X-Original-URI", rotate([]string{
			"//evil.example/login", `/\evil.example/login`, `\\evil.example\login`, "//evil.example/%6Cogin?x", "http://a//evil.example/login",
		}, i))
	}},
	// Rails, Symfony and Laravel, ASP.NET Core and Express serve a POST
	// that says X-HTTP-Method-Override: DELETE (or ?_method=DELETE) as
	// a DELETE.
	{name: "authz/route not dodged by a method override", config: deleteRoute, limit: 2, want: 2, n: 8, req: func(s string, i int) bypassReq {
		post := func(target string) bypassReq {
			r := authzReq(target, "X-API-Key", bypassEnt)
			r.method = "POST"
			return r
		}
		fwd := func(hdr ...string) bypassReq {
			return authzReq("/v1/authz", append([]string{"X-API-Key", bypassEnt, "X-Forwarded-Method", "POST"}, hdr...)...)
		}
		return rotate([]bypassReq{
			fwd("X-Forwarded-Uri", "/items/1", "X-HTTP-Method-Override", "DELETE"),
			fwd("X-Forwarded-Uri", "/items/1", "X-HTTP-Method", "delete"),
			fwd("X-Forwarded-Uri", "/items/1", "X-Method-Override", "DELETE"),
			fwd("X-Original-URI", "/items/1?_method=DELETE#top"),
			fwd("X-Forwarded-Uri", "/items/1?a=b&_method=%44ELETE"),
			fwd("X-Forwarded-Uri", "/items/1?_%6Dethod=DELETE"),
			post("/v1/authz/items/1?_method=DELETE"),
			post("/v1/authz/items/1?x=1&_method=delete"),
		}, i)
	}},
}

// ipv6Prefix48 keys IPv6 clients by their /48 in a bypass config.
func ipv6Prefix48(cfg string) string {
	return strings.Replace(cfg, "authz:\n", "authz:\n  ipv6_prefix: 48\n", 1)
}

// deleteRoute adds a route for DELETE below /items to a bypass config.
func deleteRoute(cfg string) string {
	return strings.Replace(cfg, "  routes:\n", "  routes:\n    - {path_prefix: /items, methods: [DELETE], policies: [login{S}]}\n", 1)
}

// TestBypass2 runs bypass2Tricks on the memory store and a real Redis.
func TestBypass2(t *testing.T) { runBypass(t, bypass2Tricks) }

// TestCrossOriginRefused: a page on another site, opened by someone on
// the network that reaches sluice, cannot spend a key's limit with a
// simple (text/plain, unpreflighted) POST, nor reach the admin endpoints;
// clients that are not browsers, the console's own page and forward-auth
// (whose proxies pass their clients' headers on) are unaffected. The
// check reads request headers only, so the memory store serves.
func TestCrossOriginRefused(t *testing.T) {
	s := "_xo"
	cfg := strings.NewReplacer("{S}", s, "{FREE}", sluice.HashKey(bypassFree), "{ENT}", sluice.HashKey(bypassEnt)).Replace(bypassConfig) +
		"console: {enabled: true, public_read: true}\n"
	svc := startService(t, svcOptions{config: cfg})
	spend := `{"policy":"tight` + s + `","key":"victim","cost":3}`
	admin := "Bearer " + adminToken
	for _, c := range []struct {
		method, path, body string
		hdr                []string
	}{
		{"POST", "/v1/check", spend, []string{"Content-Type", "text/plain", "Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example"}},
		{"POST", "/v1/check", spend, []string{"Content-Type", "application/x-www-form-urlencoded", "Sec-Fetch-Site", "same-site"}},
		{"POST", "/v1/check", spend, []string{"Content-Type", "text/plain", "Origin", "https://evil.example"}}, // no Sec-Fetch-Site
		{"POST", "/v1/reset", `{"policy":"tight` + s + `","key":"victim"}`, []string{"Authorization", admin, "Sec-Fetch-Site", "cross-site"}},
		{"PUT", "/v1/overrides", `{"identity":"victim","scale":1000}`, []string{"Authorization", admin, "Sec-Fetch-Site", "cross-site"}},
		{"DELETE", "/v1/overrides?identity=victim", "", []string{"Authorization", admin, "Origin", "http://evil.example"}},
		{"POST", "/ui/api/reset?id=victim", "", []string{"Authorization", admin, "Sec-Fetch-Site", "cross-site"}},
		{"POST", "/ui/api/simulate", `{"limit":"10/s","pattern":"burst","rps":100,"duration":"1h","algorithms":["gcra"]}`, []string{"Sec-Fetch-Site", "cross-site"}},
	} {
		if a := svc.do(t, c.method, c.path, c.body, c.hdr...); a.status != http.StatusForbidden {
			t.Errorf("%s %s %q: %d %s, want 403", c.method, c.path, c.hdr, a.status, a.raw)
		}
	}
	if a := svc.do(t, "GET", "/v1/status?policy=tight"+s+"&key=victim&cost=3", ""); a.status != 200 || a.body["allowed"] != true {
		t.Fatalf("the victim's limit after the cross-site requests: %d %s, want all of it left", a.status, a.raw)
	}
	if a := svc.do(t, "GET", "/v1/overrides", "", "Authorization", admin); a.status != 200 || a.num("count") != 0 {
		t.Fatalf("overrides after the cross-site requests: %d %s, want none", a.status, a.raw)
	}
	// Not browsers, the same origin, and a user typing the URL pass.
	for i, hdr := range [][]string{
		nil,
		{"Content-Type", "application/x-www-form-urlencoded"}, // curl -d
		{"Sec-Fetch-Site", "same-origin", "Origin", svc.url},
		{"Sec-Fetch-Site", "none"},
		{"Origin", svc.url},
	} {
		if a := svc.do(t, "POST", "/v1/check", `{"policy":"roomy`+s+`","key":"victim"}`, hdr...); a.status != 200 {
			t.Errorf("check %d %q: %d %s, want 200", i, hdr, a.status, a.raw)
		}
	}
	// Forward-auth is called by proxies, which pass the browser's headers.
	if a := svc.do(t, "GET", "/v1/authz", "", "X-API-Key", bypassEnt, "Sec-Fetch-Site", "cross-site", "Origin", "https://app.example"); a.status != 200 {
		t.Errorf("authz with a browser's cross-site headers: %d %s", a.status, a.raw)
	}
	if a := svc.do(t, "POST", "/v1/authz", "", "X-API-Key", bypassEnt, "Sec-Fetch-Site", "cross-site", "Origin", "https://app.example"); a.status != 200 {
		t.Errorf("POST authz with a browser's cross-site headers: %d %s", a.status, a.raw)
	}
}

// TestForwardedForForms: a trusted proxy that writes X-Forwarded-For hops
// with ports or brackets (Azure Application Gateway appends "IP:port")
// gets each client keyed by its address, ports aside, not every client
// keyed as the proxy, one limit for all.
func TestForwardedForForms(t *testing.T) {
	s := "_xff"
	cfg := strings.NewReplacer("{S}", s, "{FREE}", sluice.HashKey(bypassFree), "{ENT}", sluice.HashKey(bypassEnt)).Replace(bypassConfig)
	svc := startService(t, svcOptions{config: cfg})
	for _, c := range []struct{ xff, identity string }{
		{"198.51.100.1:1111", "ip:198.51.100.1"},
		{"198.51.100.1:2222", "ip:198.51.100.1"},
		{"203.0.113.9, 198.51.100.2:3333", "ip:198.51.100.2"},
		{"[2001:db8:1:2::1]:443", "ip:2001:db8:1:2::/64"},
		{"[2001:db8:1:3::1]", "ip:2001:db8:1:3::/64"},
		{"[::ffff:198.51.100.3]:80", "ip:198.51.100.3"},
		{"198.51.100.4:99999", "ip:127.0.0.1"}, // malformed: the last good address
	} {
		a := svc.do(t, "GET", "/v1/authz", "", "X-Forwarded-For", c.xff)
		if got := a.header.Get("X-Sluice-Identity"); a.status != 200 || got != c.identity {
			t.Errorf("X-Forwarded-For %q: %d, identity %q, want %q", c.xff, a.status, got, c.identity)
		}
	}
	// One client on two ports is one client: anon allows 3.
	for i := range 4 {
		a := svc.do(t, "GET", "/v1/authz", "", "X-Forwarded-For", fmt.Sprintf("198.51.100.5:%d", 1000+i))
		if want := map[bool]int{true: 200, false: 429}[i < 3]; a.status != want {
			t.Fatalf("request %d of one client on port %d: %d, want %d", i, 1000+i, a.status, want)
		}
	}
}

// TestTrustedProxyMapped: a proxy listed by its IPv4-mapped IPv6 address
// is trusted: its clients are keyed by their own addresses and it may
// name users, instead of every client being keyed as the proxy.
func TestTrustedProxyMapped(t *testing.T) {
	s := "_mapped"
	cfg := strings.NewReplacer("{S}", s, "{FREE}", sluice.HashKey(bypassFree), "{ENT}", sluice.HashKey(bypassEnt)).Replace(bypassConfig)
	cfg = strings.Replace(cfg, `trusted_proxies: [127.0.0.1/32, "::1"]`, `trusted_proxies: ["::ffff:127.0.0.0/104"]`, 1)
	svc := startService(t, svcOptions{config: cfg})
	for _, c := range []struct{ hdr, value, identity string }{
		{"X-Forwarded-For", "198.51.100.1", "ip:198.51.100.1"},
		{"X-User-ID", "42", "user:42"},
	} {
		a := svc.do(t, "GET", "/v1/authz", "", c.hdr, c.value)
		if got := a.header.Get("X-Sluice-Identity"); a.status != 200 || got != c.identity {
			t.Errorf("%s: %s: %d, identity %q, want %q", c.hdr, c.value, a.status, got, c.identity)
		}
	}
}
