package server

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
)

// TestConsoleOverridesList: GET /ui/api/overrides needs the admin token
// and lists the overrides in force, soonest to expire first, each with
// who set it (the token's name), why and until when; an expired one is
// counted, not listed; an API key's own identity shows by its name and a
// hash prefix (its whole hash only in the identity a removal names).
func TestConsoleOverridesList(t *testing.T) {
	s := startService(t, svcOptions{config: consoleConfig})
	if a := s.do(t, "GET", "/ui/api/overrides", ""); a.status != 401 {
		t.Fatalf("without the token: %d %s", a.status, a.raw)
	}
	hash := sluice.HashKey(freeKey)
	for _, body := range []string{
		`{"identity":"tenant:forever","policy":"b","limit":"20000/day","reason":"contract 42"}`,
		`{"identity":"tenant:soon","scale":2,"ttl":"10m","reason":"incident 7"}`,
		`{"identity":"key:` + hash + `","policy":"free","limit":"50/min","ttl":"1h"}`,
		`{"identity":"tenant:brief","policy":"a","limit":"1/s","ttl":"1m"}`,
	} {
		if a := s.do(t, "PUT", "/v1/overrides", body, bearer...); a.status != 201 {
			t.Fatalf("%s: %d %s", body, a.status, a.raw)
		}
	}
	s.clk.Advance(90 * time.Second) // tenant:brief expires
	a := s.do(t, "GET", "/ui/api/overrides", "", bearer...)
	if a.status != 200 {
		t.Fatalf("%d %s", a.status, a.raw)
	}
	var got struct {
		Overrides []activeOverrideJSON `json:"overrides"`
		Active    int                  `json:"active"`
		Expired   int                  `json:"expired"`
	}
	if err := json.Unmarshal([]byte(a.raw), &got); err != nil {
		t.Fatal(err)
	}
	if got.Active != 3 || got.Expired != 1 || len(got.Overrides) != 3 {
		t.Fatalf("active %d, expired %d, listed %d: %s", got.Active, got.Expired, len(got.Overrides), a.raw)
	}
	want := []string{
		"tenant:soon||2× the configured limit|SLUICE_ADMIN_TOKEN|incident 7|8m30s",
		"key_name:demo-free (key:" + hash[:12] + "…)|free|50 per minute|SLUICE_ADMIN_TOKEN||58m30s",
		"tenant:forever|b|20000 per day|SLUICE_ADMIN_TOKEN|contract 42|",
	}
	for i, o := range got.Overrides {
		// The identity (for a removal, admin only) is the store's; what
		// the page shows holds no whole hash.
		if strings.Contains(o.Shown, hash) {
			t.Errorf("override %d shows an API key's whole hash: %q", i, o.Shown)
		}
		if line := strings.Join([]string{o.Shown, o.Policy, o.Human, o.By, o.Reason, o.ExpiresIn}, "|"); line != want[i] {
			t.Errorf("override %d: %q, want %q", i, line, want[i])
		}
	}
}
