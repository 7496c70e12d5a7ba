package server

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestConsoleSession: without console.public_read the console's data
// answers an admin only. The admin token is exchanged for a cookie that
// is HttpOnly, SameSite=Strict, for /ui, expiring, and good only at the
// Host it was issued for; the page itself stays open (it has the sign-in
// form). A wrong token gets no session, and a session ends at its
// expiry and on sign-out.
func TestConsoleSession(t *testing.T) {
	s := startService(t, svcOptions{config: testConfig + "console: {enabled: true}\n"})
	u, _ := url.Parse(s.url)
	data := []string{"/ui/api/overview", "/ui/api/top", "/ui/api/series", "/ui/api/identity?id=tenant:acme", "/ui/api/overrides"}
	for _, p := range data {
		if a := s.do(t, "GET", p, ""); a.status != http.StatusUnauthorized || !strings.Contains(a.raw, "admin session") {
			t.Errorf("GET %s without a session: %d %s, want 401", p, a.status, a.raw)
		}
	}
	if a := s.do(t, "GET", "/ui/", ""); a.status != http.StatusOK {
		t.Fatalf("the page: %d", a.status)
	}
	if a := s.do(t, "POST", "/ui/api/session", "", "Authorization", "Bearer wrong-token-0123456789abcdef"); a.status != http.StatusUnauthorized || a.header.Get("Set-Cookie") != "" {
		t.Fatalf("a wrong token: %d %v", a.status, a.header)
	}
	s.clk.Advance(time.Second) // past the wrong token's backoff
	a := s.do(t, "POST", "/ui/api/session", "", "Authorization", "Bearer "+adminToken)
	if a.status != http.StatusOK {
		t.Fatalf("sign-in: %d %s", a.status, a.raw)
	}
	sc := a.header.Get("Set-Cookie")
	for _, want := range []string{sessionCookie + "=", "Path=/ui", "Max-Age=28800", "HttpOnly", "SameSite=Strict"} {
		if !strings.Contains(sc, want) {
			t.Errorf("Set-Cookie %q lacks %q", sc, want)
		}
	}
	cookie := strings.SplitN(sc, ";", 2)[0]
	for _, p := range data {
		if a := s.do(t, "GET", p, "", "Cookie", cookie); a.status != http.StatusOK {
			t.Errorf("GET %s with the session: %d %s", p, a.status, a.raw)
		}
	}
	if a := s.do(t, "GET", "/ui/api/overview", "", "Cookie", cookie); a.body["admin"] != true {
		t.Errorf("overview with the session: admin %v", a.body["admin"])
	}
	// Another Host of the same machine (cookies are not bound to ports,
	// nor is localhost to 127.0.0.1 in sluice's eyes) gets nothing.
	if a := s.do(t, "GET", "/ui/api/overview", "", "Cookie", cookie, "Host", "localhost:"+u.Port()); a.status != http.StatusUnauthorized {
		t.Errorf("the session at another Host: %d", a.status)
	}
	if a := s.do(t, "GET", "/ui/api/overview", "", "Cookie", sessionCookie+"=forged"); a.status != http.StatusUnauthorized {
		t.Errorf("a forged cookie: %d", a.status)
	}
	// Expiry, by the service's clock.
	s.clk.Advance(sessionTTL - time.Second)
	if a := s.do(t, "GET", "/ui/api/top", "", "Cookie", cookie); a.status != http.StatusOK {
		t.Errorf("a second before expiry: %d", a.status)
	}
	s.clk.Advance(time.Second)
	if a := s.do(t, "GET", "/ui/api/top", "", "Cookie", cookie); a.status != http.StatusUnauthorized {
		t.Errorf("at expiry: %d", a.status)
	}
	// Sign-out ends a session.
	cookie = strings.SplitN(s.do(t, "POST", "/ui/api/session", "", "Authorization", "Bearer "+adminToken).header.Get("Set-Cookie"), ";", 2)[0]
	if a := s.do(t, "DELETE", "/ui/api/session", "", "Cookie", cookie); a.status != http.StatusNoContent || !strings.Contains(a.header.Get("Set-Cookie"), "Max-Age=0") {
		t.Fatalf("sign-out: %d %v", a.status, a.header)
	}
	if a := s.do(t, "GET", "/ui/api/top", "", "Cookie", cookie); a.status != http.StatusUnauthorized {
		t.Errorf("after sign-out: %d", a.status)
	}
	// The token itself still reads, as the admin endpoints take it.
	if a := s.do(t, "GET", "/ui/api/top", "", "Authorization", "Bearer "+adminToken); a.status != http.StatusOK {
		t.Errorf("with the token: %d", a.status)
	}
}

// TestConsolePublicReadHidesReasons: under console.public_read anyone
// reads the console's data, but a look-up shows the overrides that match
// without their reason and author (free text an admin wrote, and the
// admin's name), wildcard ones included; an admin sees them.
func TestConsolePublicReadHidesReasons(t *testing.T) {
	s := startService(t, svcOptions{config: testConfig + "console: {enabled: true, public_read: true}\n"})
	for _, id := range []string{"tenant:acme", "tenant:*"} {
		body := `{"identity":"` + id + `","scale":2,"reason":"refund for ticket 4411 secret-reason"}`
		if a := s.do(t, "PUT", "/v1/overrides", body, bearer...); a.status != http.StatusCreated {
			t.Fatalf("PUT override %s: %d %s", id, a.status, a.raw)
		}
	}
	a := s.do(t, "GET", "/ui/api/identity?id=tenant:acme", "")
	if a.status != http.StatusOK || strings.Count(a.raw, `"identity":"tenant:`) < 2 {
		t.Fatalf("public look-up: %d %s", a.status, a.raw)
	}
	if strings.Contains(a.raw, "secret-reason") || strings.Contains(a.raw, `"by"`) {
		t.Errorf("a public look-up shows reasons or authors: %s", a.raw)
	}
	a = s.do(t, "GET", "/ui/api/identity?id=tenant:acme", "", "Authorization", "Bearer "+adminToken)
	if strings.Count(a.raw, "secret-reason") != 2 || !strings.Contains(a.raw, `"by"`) {
		t.Errorf("an admin's look-up lacks reasons or authors: %s", a.raw)
	}
}
