package server

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
)

// Operators' tokens of the admin tests: alice's and carol's are strong,
// bob's is guessable (its hash cannot be judged at load; its use is).
const (
	aliceToken = "4e7b0c19d2a85f63e1b9c07d"
	carolToken = "c5a1e8f3097bd24e6a1f5c38"
	bobToken   = "passwordpassword"
)

// adminTokensConfig is consoleConfig with three named admin tokens.
var adminTokensConfig = consoleConfig + fmt.Sprintf("admin_tokens:\n  - {name: alice, hash: %s}\n  - {name: bob, hash: %s}\n  - {name: carol, hash: %s}\n",
	sluice.HashKey(aliceToken), sluice.HashKey(bobToken), sluice.HashKey(carolToken))

// TestAdminTokensByName: each operator's token is accepted and named in
// the audit lines (never the token); SLUICE_ADMIN_TOKEN still works, as
// the token of that name; a right token of a guessable form is refused.
func TestAdminTokensByName(t *testing.T) {
	logs := &syncBuffer{}
	s := startService(t, svcOptions{config: adminTokensConfig, log: logs})
	for _, c := range []struct{ token, name, client string }{
		{aliceToken, "alice", "198.51.100.1"}, {carolToken, "carol", "198.51.100.2"}, {adminToken, "SLUICE_ADMIN_TOKEN", "198.51.100.3"},
	} {
		if a := s.do(t, "PUT", "/v1/overrides", `{"identity":"who-`+c.name+`","scale":2}`, "Authorization", "Bearer "+c.token, "X-Forwarded-For", c.client); a.status != 201 {
			t.Fatalf("%s: %d %s", c.name, a.status, a.raw)
		}
		if a := s.do(t, "POST", "/v1/reset", `{"policy":"b","key":"r-`+c.name+`"}`, "Authorization", "Bearer "+c.token, "X-Forwarded-For", c.client); a.status != 200 {
			t.Fatalf("%s reset: %d %s", c.name, a.status, a.raw)
		}
		for _, want := range []string{"identity=who-" + c.name, "identity=r-" + c.name} {
			if !strings.Contains(logs.String(), "by="+c.name) || !lineWith(logs.String(), want, "by="+c.name) {
				t.Errorf("no audit line with %s by=%s:\n%s", want, c.name, logs.String())
			}
		}
	}
	a := s.do(t, "PUT", "/v1/overrides", `{"identity":"bob","scale":2}`, "Authorization", "Bearer "+bobToken, "X-Forwarded-For", "198.51.100.4")
	if a.status != 403 || !strings.Contains(a.raw, `\"bob\" is too weak`) || !strings.Contains(a.raw, "openssl rand -hex 32") {
		t.Fatalf("bob's guessable token: %d %s", a.status, a.raw)
	}
	for _, tok := range []string{aliceToken, carolToken, adminToken, bobToken} {
		if strings.Contains(logs.String(), tok) {
			t.Fatalf("a token is in the log:\n%s", logs.String())
		}
	}
}

// lineWith reports whether one line of log holds all of parts.
func lineWith(log string, parts ...string) bool {
	for _, l := range strings.Split(log, "\n") {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(l, p)
		}
		if ok {
			return true
		}
	}
	return false
}

// TestAdminBackoff: wrong admin tokens slow their client down, doubling
// from adminBackoffBase to adminBackoffCap; while it backs off, every
// token it sends, the right one too, is refused with 429 and Retry-After,
// so guessing gains nothing from speed. Other clients are not slowed; an
// IPv6 client is its /64; the console's overview, which says whether a
// token is right, counts as a guess too. The clock is the service's fake
// one.
func TestAdminBackoff(t *testing.T) {
	s := startService(t, svcOptions{config: adminTokensConfig})
	try := func(token, client string) answer {
		t.Helper()
		return s.do(t, "GET", "/v1/overrides", "", "Authorization", "Bearer "+token, "X-Forwarded-For", client)
	}
	const guesser = "203.0.113.9"
	wait := adminBackoffBase
	for i := range 10 {
		a := try(fmt.Sprintf("guess-%02d-7d2a85f63e1b9c", i), guesser)
		if a.status != 401 || a.header.Get("Retry-After") != retryAfterSeconds(wait) {
			t.Fatalf("guess %d: %d Retry-After %q %s, want 401 and %s", i, a.status, a.header.Get("Retry-After"), a.raw, retryAfterSeconds(wait))
		}
		// The right token, or another guess, before the backoff ends:
		// refused unread.
		for _, tok := range []string{aliceToken, "another-guess-85f63e1b9c07"} {
			if a := try(tok, guesser); a.status != 429 || a.header.Get("Retry-After") != retryAfterSeconds(wait) {
				t.Fatalf("during backoff %d: %d Retry-After %q %s", i, a.status, a.header.Get("Retry-After"), a.raw)
			}
		}
		s.clk.Advance(wait - time.Millisecond)
		if a := try(aliceToken, guesser); a.status != 429 || a.header.Get("Retry-After") != "1" {
			t.Fatalf("1ms before the end of backoff %d: %d %s", i, a.status, a.raw)
		}
		s.clk.Advance(time.Millisecond)
		wait = min(2*wait, adminBackoffCap)
	}
	if wait != adminBackoffCap {
		t.Fatalf("backoff after 10 guesses %s, want the cap", wait)
	}
	// Another client is not slowed down.
	if a := try(aliceToken, "198.51.100.20"); a.status != 200 {
		t.Fatalf("another client: %d %s", a.status, a.raw)
	}
	// Once the backoff is over the right token is taken, and the client
	// starts over.
	if a := try(aliceToken, guesser); a.status != 200 {
		t.Fatalf("after the backoff: %d %s", a.status, a.raw)
	}
	if a := try("wrong-again-85f63e1b9c07d", guesser); a.status != 401 || a.header.Get("Retry-After") != retryAfterSeconds(adminBackoffBase) {
		t.Fatalf("a guess after a success: %d %q", a.status, a.header.Get("Retry-After"))
	}
	s.clk.Advance(adminBackoffCap)

	// An IPv6 client is its /64.
	if a := try("v6-guess-85f63e1b9c07d2a", "2001:db8:1:2::1"); a.status != 401 {
		t.Fatalf("v6 guess: %d", a.status)
	}
	if a := try(aliceToken, "2001:db8:1:2:ffff::7"); a.status != 429 {
		t.Fatalf("another address of the /64: %d %s", a.status, a.raw)
	}
	if a := try(aliceToken, "2001:db8:1:3::1"); a.status != 200 {
		t.Fatalf("another /64: %d %s", a.status, a.raw)
	}
	s.clk.Advance(adminBackoffCap)

	// The overview says whether a token is right: it counts as a guess.
	ov := s.do(t, "GET", "/ui/api/overview", "", "Authorization", "Bearer overview-guess-5f63e1b9", "X-Forwarded-For", "192.0.2.50")
	if ov.status != 200 || ov.body["admin"] != false {
		t.Fatalf("overview with a wrong token: %d %s", ov.status, ov.raw)
	}
	if a := try(aliceToken, "192.0.2.50"); a.status != 429 {
		t.Fatalf("after a wrong token on the overview: %d %s", a.status, a.raw)
	}
	ov = s.do(t, "GET", "/ui/api/overview", "", "Authorization", "Bearer "+aliceToken, "X-Forwarded-For", "192.0.2.50")
	if ov.body["admin"] != false {
		t.Fatalf("the overview took the right token during backoff: %s", ov.raw)
	}
}

// TestAdminBackoffBounded: the backoff remembers at most maxAdminPeers
// clients; past it the one that failed longest ago is forgotten, and the
// most recent ones are kept.
func TestAdminBackoffBounded(t *testing.T) {
	var b adminBackoffs
	wrong := func() string { return "" }
	for i := range maxAdminPeers + 500 {
		if _, _, read := b.check(fmt.Sprint("peer-", i), int64(i), wrong); !read {
			t.Fatalf("peer %d refused unread on its first token", i)
		}
	}
	if n, l := len(b.peers), b.lru.Len(); n != maxAdminPeers || l != maxAdminPeers {
		t.Fatalf("%d peers (%d in the list), want %d", n, l, maxAdminPeers)
	}
	if _, _, read := b.check("peer-499", maxAdminPeers+500, wrong); !read {
		t.Fatal("the oldest peer should have been forgotten")
	}
	if _, _, read := b.check(fmt.Sprint("peer-", maxAdminPeers+499), maxAdminPeers+500, wrong); read {
		t.Fatal("the newest peer should still back off")
	}
}
