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
		"console: {enabled: true}\n"
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
