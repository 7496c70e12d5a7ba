package config

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/sluice-io/sluice"
)

// Guessable admin tokens are refused at load with their file:line and how
// to make a good one; tokens as MakeAdminToken makes them pass.
func TestWeakAdminTokenRefused(t *testing.T) {
	for _, tok := range []string{
		"aaaaaaaaaaaaaaaa", "passwordpassword", "abcabcabcabcabca", "0123456789abcdef",
		"abcdefghijklmnopqrstuvwxyz", "zyxwvutsrqponmlk", "test-admin-token", "Password123456789",
		"ab12ab12ab12ab12ab12", "aabbccddeeffgghhiijj", "secret-token-admin-2024", "qwertyuiop1234567890",
	} {
		_, err := Parse("s.yaml", []byte("policies:\n  p: {limit: 1/s}\nadmin_token: "+tok+"\n"))
		if err == nil || !strings.Contains(err.Error(), "s.yaml:3: admin_token") || !strings.Contains(err.Error(), MakeAdminToken) {
			t.Errorf("admin_token %q: %v", tok, err)
		}
	}
	// Seeded, so that the test is the same each run.
	rng := rand.NewChaCha8([32]byte{'s', 'l', 'u', 'i', 'c', 'e'})
	for range 5000 {
		var b [32]byte
		_, _ = rng.Read(b[:])
		for _, tok := range []string{hex.EncodeToString(b[:]), hex.EncodeToString(b[:16]), base64.RawURLEncoding.EncodeToString(b[:18])} {
			if p := WeakToken(tok); p != "" {
				t.Fatalf("a random token %q refused: %s", tok, p)
			}
		}
	}
	for _, tok := range []string{"correct-horse-battery-staple", "Zq8#rT2!mW5@xL9$"} {
		if p := WeakToken(tok); p != "" {
			t.Errorf("%q refused: %s", tok, p)
		}
	}
}

// admin_tokens are named hashes; admin_token is the token named
// "admin_token". Bad entries are refused with their file:line.
func TestAdminTokens(t *testing.T) {
	h1, h2 := sluice.HashKey("one-9b1f4c7e2a6d03b8"), sluice.HashKey("two-5e9f1a3c7b2d84f0")
	cfg, err := Parse("s.yaml", []byte("policies:\n  p: {limit: 1/s}\nadmin_token: 9b1f4c7e2a6d03b8e5f9a1c4\nadmin_tokens:\n  - {name: alice, hash: "+h1+"}\n  - {name: bob, hash: "+strings.ToUpper(h2)+"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.AdminTokens) != 3 || cfg.AdminTokens[0].Name != LegacyAdminTokenName || cfg.AdminTokens[0].Hash != HashAdminToken("9b1f4c7e2a6d03b8e5f9a1c4") ||
		cfg.AdminTokens[1].Name != "alice" || cfg.AdminTokens[1].Hash != HashAdminToken("one-9b1f4c7e2a6d03b8") || cfg.AdminTokens[2].Hash != HashAdminToken("two-5e9f1a3c7b2d84f0") {
		t.Fatalf("tokens %+v", cfg.AdminTokens)
	}
	for _, c := range []struct{ doc, want string }{
		{"admin_tokens:\n  - {name: alice, hash: 9b1f4c7e2a6d03b8e5f9a1c4}\n", "s.yaml:4: admin_tokens[0].hash: want the 64 hex digits"},
		{"admin_tokens:\n  - {name: alice, hash: " + h1 + "}\n  - {name: alice, hash: " + h2 + "}\n", `s.yaml:5: admin_tokens[1].name: "alice" is named twice`},
		{"admin_tokens:\n  - {name: alice, hash: " + h1 + "}\n  - {name: bob, hash: " + h1 + "}\n", `s.yaml:5: admin_tokens[1].hash: same token as "alice"`},
		{"admin_tokens:\n  - {hash: " + h1 + "}\n", "s.yaml:4: admin_tokens[0].name: a name"},
		{"allowed_hosts: [sluice.example.com, \"http://x.example\"]\n", `s.yaml:3: allowed_hosts[1]: "http://x.example": want a host name`},
		{"allowed_hosts: [\"x.example:8080\"]\n", `allowed_hosts[0]: "x.example:8080": want a host name`},
	} {
		_, err := Parse("s.yaml", []byte("policies:\n  p: {limit: 1/s}\n"+c.doc))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.doc, err, c.want)
		}
	}
	// The bounds: MaxAdminTokens tokens, MaxAllowedHosts hosts.
	var many, hosts strings.Builder
	for i := range MaxAdminTokens + 1 {
		fmt.Fprintf(&many, "  - {name: op%d, hash: %s}\n", i, sluice.HashKey(fmt.Sprint("token-", i)))
	}
	for i := range MaxAllowedHosts + 1 {
		fmt.Fprintf(&hosts, "h%d.example, ", i)
	}
	_, err = Parse("s.yaml", []byte("policies:\n  p: {limit: 1/s}\nadmin_tokens:\n"+many.String()+"allowed_hosts: ["+hosts.String()+"]\n"))
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("admin_tokens: %d tokens; at most %d", MaxAdminTokens+1, MaxAdminTokens)) ||
		!strings.Contains(err.Error(), fmt.Sprintf("allowed_hosts: %d hosts; at most %d", MaxAllowedHosts+1, MaxAllowedHosts)) {
		t.Errorf("over the bounds: %v", err)
	}
	cfg, err = Parse("s.yaml", []byte("policies:\n  p: {limit: 1/s}\nallowed_hosts: [Sluice.Example.COM., \"*.internal.example\", \"[::1]\", \"*\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.AllowedHosts, " "); got != "sluice.example.com *.internal.example ::1 *" {
		t.Fatalf("allowed hosts %q", got)
	}
}

// Names that audit lines could not tell from a built-in one, or from
// another operator's, are refused with a clear error: the built-in token
// names (admin_token, SLUICE_ADMIN_TOKEN, in any case or with - for _),
// the words the logs use where no operator is named, names of punctuation
// only, and names that differ from another only in case.
func TestAdminTokenNamesReserved(t *testing.T) {
	h1, h2 := sluice.HashKey("one-9b1f4c7e2a6d03b8"), sluice.HashKey("two-5e9f1a3c7b2d84f0")
	for _, name := range []string{"admin_token", "ADMIN-TOKEN", "SLUICE_ADMIN_TOKEN", "sluice-admin-token", "unknown", "api", "Console", "none", "-", "...", "_"} {
		doc := "policies:\n  p: {limit: 1/s}\nadmin_tokens:\n  - {name: \"" + name + "\", hash: " + h1 + "}\n"
		_, err := Parse("s.yaml", []byte(doc))
		if err == nil || !strings.Contains(err.Error(), "s.yaml:4: admin_tokens[0].name") || !strings.Contains(err.Error(), "reserved") {
			t.Errorf("name %q: %v, want it refused as reserved", name, err)
		}
	}
	for _, name := range []string{"", " ", " alice", "al ice", "alice\t"} {
		doc := "policies:\n  p: {limit: 1/s}\nadmin_tokens:\n  - {name: \"" + name + "\", hash: " + h1 + "}\n"
		if _, err := Parse("s.yaml", []byte(doc)); err == nil || !strings.Contains(err.Error(), "admin_tokens[0].name: a name of 1-64") {
			t.Errorf("name %q: %v, want it refused", name, err)
		}
	}
	doc := "policies:\n  p: {limit: 1/s}\nadmin_tokens:\n  - {name: alice, hash: " + h1 + "}\n  - {name: Alice, hash: " + h2 + "}\n"
	if _, err := Parse("s.yaml", []byte(doc)); err == nil || !strings.Contains(err.Error(), `s.yaml:5: admin_tokens[1].name: "Alice" is named twice`) {
		t.Errorf("alice and Alice: %v", err)
	}
	// Names like the built-ins' but not them are an operator's.
	doc = "policies:\n  p: {limit: 1/s}\nadmin_tokens:\n  - {name: admin_token_2, hash: " + h1 + "}\n  - {name: api-team, hash: " + h2 + "}\n"
	if _, err := Parse("s.yaml", []byte(doc)); err != nil {
		t.Errorf("admin_token_2, api-team: %v", err)
	}
}

// TestTypoNamesFieldWithoutEmptyLists: one typo (teirs: for tiers:) is
// named with its line, the closest key and the real valid keys; what it
// leaves undefined says so, instead of a "valid:" that lists nothing
// (issue 27).
func TestTypoNamesFieldWithoutEmptyLists(t *testing.T) {
	doc := "policies:\n  free: {limit: 10/min}\nteirs:\n  basic:\n    policies: [free]\nkeys:\n  - hash: " + strings.Repeat("a", 64) + "\n    tier: basic\n"
	_, err := Parse("s.yaml", []byte(doc))
	if err == nil {
		t.Fatal("a config with teirs: parsed")
	}
	msg := err.Error()
	for _, want := range []string{
		"s.yaml:3: teirs: unknown field; did you mean tiers? valid: listen, ",
		", policies, tiers, keys, ",
		`s.yaml:8: keys[0].tier: unknown tier "basic"; none: the config defines no tiers`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "valid: \n") || strings.HasSuffix(msg, "valid: ") {
		t.Errorf("an empty valid: list:\n%s", msg)
	}
}
