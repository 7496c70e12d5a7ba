package server

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// lookupPolicies is a look-up's policies, each as "name why…: human".
func lookupPolicies(t *testing.T, s *svc, id string) []string {
	t.Helper()
	a := s.do(t, "GET", "/ui/api/identity?id="+id, "")
	if a.status != 200 {
		t.Fatalf("look-up of %s: %d %s", id, a.status, a.raw)
	}
	var body struct {
		Policies []peekJSON `json:"policies"`
	}
	if err := json.Unmarshal([]byte(a.raw), &body); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range body.Policies {
		out = append(out, p.Policy+" "+strings.Join(p.Why, ",")+": "+p.Human)
	}
	slices.Sort(out)
	return out
}

// TestConsoleLookupAppliesOnly: a look-up shows the limits that apply to
// the identity, not every policy: an API key's tier's, forward auth's
// default tier for "user:" callers, the config's overrides, a runtime
// override's policy, and policies the identity has state under; in human
// units ("3 per day", not 1440.0m).
func TestConsoleLookupAppliesOnly(t *testing.T) {
	s := startService(t, svcOptions{config: consoleConfig})
	for _, c := range []struct {
		id   string
		want []string
	}{
		{"key_name:demo-pro", []string{"daily tier pro: 3 per day", "pro tier pro: 100 per minute"}},
		{"key_name:demo-free", []string{"free tier free: 10 per minute"}},
		{"user:42", []string{"anon default tier anonymous: 2 per minute"}},
		{"vip", []string{"a config override: 7 per second"}},
		{"tenant:quiet", nil},
	} {
		if got := lookupPolicies(t, s, c.id); !slices.Equal(got, c.want) {
			t.Errorf("look-up of %s: %q, want %q", c.id, got, c.want)
		}
	}
	// State under a policy that the config does not tie to the identity
	// (a /v1/check names its policy) shows it, as "in use".
	s.check(t, `{"policy":"b","key":"tenant:busy"}`)
	if got, want := lookupPolicies(t, s, "tenant:busy"), []string{"b in use: 2 per second"}; !slices.Equal(got, want) {
		t.Errorf("after a check: %q, want %q", got, want)
	}
	if a := s.do(t, "PUT", "/v1/overrides", `{"identity":"tenant:*","policy":"pro","limit":"20000/day"}`, bearer...); a.status != 201 {
		t.Fatal(a.raw)
	}
	if got, want := lookupPolicies(t, s, "tenant:quiet"), []string{"pro override: 20000 per day"}; !slices.Equal(got, want) {
		t.Errorf("with an override: %q, want %q", got, want)
	}
}
