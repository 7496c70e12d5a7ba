package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/region"
)

// `sluice serve` in region us, its own Redis, with a global policy homed
// in eu (another redis-server): its checks are decided from us's share
// (decided_by "share"), charged in eu's Redis in advance, and the limit
// holds across both; a regional policy is answered as before. /metrics
// counts the tiers by region. A global policy with mode: async is decided
// by us's own store (decided_by "region") and its count is delivered to
// eu's Redis within a sync interval.
func TestRegionsServe(t *testing.T) {
	eu, us := redistest.NewStandalone(t), redistest.NewStandalone(t)
	cfg := testConfig + fmt.Sprintf(`store:
  url: %q
  failure_policy: fail_closed
  timeout: 200ms
  region: us
  regions:
    eu: {url: %q}
  global: {clock_skew: 5ms}
`, us.URL(), eu.URL())
	cfg = strings.Replace(cfg, "anon: {limit: 2/min}", "anon: {limit: 2/min}\n  world: {algorithm: fixed_window, limit: 10/h, scope: global, home: eu}\n  loose: {algorithm: fixed_window, limit: 10/h, scope: global, mode: async}", 1)
	cfg = strings.Replace(cfg, "anonymous: {policies: [anon]}", "anonymous: {policies: [anon, world]}", 1)
	s := startService(t, svcOptions{redis: true, config: cfg})
	id := redistest.Prefix(t)
	admitted := 0
	for i := range 15 {
		a := s.check(t, fmt.Sprintf(`{"policy":"world","key":%q}`, id))
		if a.body["decided_by"] != "share" {
			t.Fatalf("check %d: %d %s, want decided_by share", i, a.status, a.raw)
		}
		if a.status == 200 {
			admitted++
		}
	}
	if admitted != 10 {
		t.Fatalf("admitted %d of a global limit of 10 from us's shares", admitted)
	}
	// The charges are in eu's Redis: its key holds what us fetched.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	keys, err := eu.Do(ctx, "KEYS", "*world*")
	if err != nil || len(keys.([]any)) == 0 {
		t.Fatalf("eu's Redis holds no key of the global policy: %v %v", keys, err)
	}
	a := s.check(t, fmt.Sprintf(`{"policy":"b","key":%q}`, id))
	if a.status != 200 || a.body["decided_by"] != nil {
		t.Fatalf("regional policy: %d %s", a.status, a.raw)
	}
	// Forward auth names the tier that decided the global policy in
	// Sluice-Decided-By; a caller with regional policies only gets none.
	a = s.do(t, "GET", "/v1/authz", "", "X-User-ID", id+"-authz")
	if a.status != 200 || a.header.Get(DecidedByHeader) != "share" {
		t.Fatalf("authz of a global policy: %d %s %q", a.status, a.raw, a.header.Get(DecidedByHeader))
	}
	a = s.do(t, "GET", "/v1/authz", "", "X-API-Key", freeKey)
	if a.status != 200 || a.header.Get(DecidedByHeader) != "" {
		t.Fatalf("authz of regional policies: %d %s %q", a.status, a.raw, a.header.Get(DecidedByHeader))
	}
	admitted = 0
	for i := range 12 {
		a := s.check(t, fmt.Sprintf(`{"policy":"loose","key":%q}`, id))
		if a.body["decided_by"] != "region" {
			t.Fatalf("async check %d: %d %s, want decided_by region", i, a.status, a.raw)
		}
		if a.status == 200 {
			admitted++
		}
	}
	if admitted != 10 {
		t.Fatalf("admitted %d of an async limit of 10 in us", admitted)
	}
	// us's 10 admissions reach eu's Redis, charged to the key's window
	// there, within a sync interval (100ms) and a call.
	redistest.WaitUntil(t, "eu's Redis holds us's async count", 5*time.Second, func() bool {
		keys, err := eu.Do(ctx, "KEYS", "*loose*")
		return err == nil && len(keys.([]any)) > 0
	})
	m := s.do(t, "GET", "/metrics", "").raw
	for _, want := range []string{`sluice_region_decisions_total{region="us",tier="share"} 11`, `sluice_region_units_total{kind="fetched",region="us"} 12`} {
		if !strings.Contains(m, want) {
			t.Fatalf("metrics lack %s:\n%s", want, grepLines(m, "sluice_region_"))
		}
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// policyOfKey reads the policy from storeKey's keys, whatever the
// identity, and nothing from other keys.
func TestPolicyOfKey(t *testing.T) {
	p := &config.Policy{Name: "api.v2", Algorithm: sluice.FixedWindow}
	for _, id := range []string{"user:42", "}{:%", "", "ip:2001:db8::1"} {
		if got := policyOfKey(storeKey(id, p)); got != "api.v2" {
			t.Fatalf("identity %q: policy %q", id, got)
		}
	}
	for _, k := range []string{"sluice:{topk}:api.v2:x", "other:{a}:api.v2:gcra", "sluice:{a}", "sluice:{a}:gcra"} {
		if got := policyOfKey(k); got != "" {
			t.Fatalf("%q: policy %q, want none", k, got)
		}
	}
}

// The region store of serve holds global the keys of global policies and
// the keys other doors mark global (region.GlobalKey), each at its home:
// the mark's, the policy's, or the hash's; every other key is regional.
func TestRegionScopeOfDoorsKeys(t *testing.T) {
	globals := map[string]string{"world": "eu", "anywhere": ""}
	hash := func(string) string { return "hashed" }
	pol := func(name string) string {
		return storeKey("user:1", &config.Policy{Name: name, Algorithm: sluice.GCRA})
	}
	for _, c := range []struct {
		key    string
		global bool
		home   string
	}{
		{pol("world"), true, "eu"},
		{pol("anywhere"), true, "hashed"},
		{pol("local"), false, ""},
		{region.GlobalKey("ap", "rls:{d}:gcra:1:k=v"), true, "ap"},
		{region.GlobalKey("", "{gw:c}:rpm"), true, "hashed"},
		{"rls:{d}:gcra:1:k=@global=ap:", false, ""},
		{"{gw:c}:rpm", false, ""},
	} {
		if got := isGlobal(globals, c.key); got != c.global {
			t.Errorf("%q: global %v, want %v", c.key, got, c.global)
		}
		if c.global {
			if got := homeOf(globals, hash, c.key); got != c.home {
				t.Errorf("%q: home %q, want %q", c.key, got, c.home)
			}
		}
	}
}
