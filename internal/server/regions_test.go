package server

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/homeread"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/internal/regiontest"
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

// `sluice serve` in eu and in us, each its own Redis, a global policy
// homed in eu, us reaching eu through a link. /v1/status in us, which
// holds no share, answers the policy's global remaining, read at the
// home: what eu answers after 4 checks in eu (before, us answered 0, its
// share), with decided_by share and remaining_source home, and allowed
// for a cost the home has left (a check in us would fetch from it). After checks in us, from its
// share, it is the home's remaining plus us's share. 40 concurrent status
// calls in us read the home once (eu's Redis MONITOR counts the peeks of
// the key). Cut off from eu, status answers from the share within the
// read's timeout, saying so (remaining_source share), and the next call
// at once, from the kept failure.
func TestRegionsServeStatusGlobal(t *testing.T) {
	eu, us := redistest.NewStandalone(t), redistest.NewStandalone(t)
	link := regiontest.NewWAN(t, eu.Addr, 10*time.Millisecond)
	conf := func(self, other, otherURL, url string) string {
		cfg := testConfig + fmt.Sprintf(`store:
  url: %q
  failure_policy: fail_closed
  timeout: 200ms
  region: %s
  regions:
    %s: {url: %q}
  global: {clock_skew: 5ms}
`, url, self, other, otherURL)
		return strings.Replace(cfg, "anon: {limit: 2/min}", "anon: {limit: 2/min}\n  world: {algorithm: fixed_window, limit: 10/h, scope: global, home: eu}", 1)
	}
	home := startService(t, svcOptions{redis: true, config: conf("eu", "us", us.URL(), eu.URL())})
	far := startService(t, svcOptions{redis: true, config: conf("us", "eu", link.URL(), us.URL())})
	id := redistest.Prefix(t)
	check := fmt.Sprintf(`{"policy":"world","key":%q}`, id)
	status := func(s *svc) answer {
		t.Helper()
		a := s.do(t, "GET", "/v1/status?policy=world&key="+id, "")
		if a.status != 200 {
			t.Fatalf("status: %d %s", a.status, a.raw)
		}
		return a
	}
	expire := func() { far.clk.Advance(2 * homeread.DefaultReuse) } // past the kept read

	for i := range 4 {
		if a := home.check(t, check); a.status != 200 || a.body["decided_by"] != "home" {
			t.Fatalf("check %d in eu: %d %s", i, a.status, a.raw)
		}
	}
	a := status(home)
	if a.num("remaining") != 6 || a.body["decided_by"] != "home" || a.body["remaining_source"] != "home" {
		t.Fatalf("eu, the home: %s", a.raw)
	}
	a = status(far)
	if a.num("remaining") != 6 || a.body["allowed"] != true || a.body["decided_by"] != "share" || a.body["remaining_source"] != "home" {
		t.Fatalf("us answers %s; eu, the home, 6 left", a.raw)
	}
	if r := a.body["results"].([]any)[0].(map[string]any); r["remaining_source"] != "home" || r["remaining"] != 6.0 {
		t.Fatalf("us's result: %v", r)
	}
	// A cost: allowed when the home has it left, from the same read (kept
	// for every caller of the key, whatever its cost).
	for cost, allowed := range map[int]bool{6: true, 7: false} {
		a := far.do(t, "GET", fmt.Sprintf("/v1/status?policy=world&key=%s&cost=%d", id, cost), "")
		if a.status != 200 || a.body["allowed"] != allowed || a.num("remaining") != 6 {
			t.Fatalf("us, cost %d: %d %s", cost, a.status, a.raw)
		}
	}

	// 2 checks in us, from its share: us answers the home's remaining and
	// its share, 4 in all, once the fetches sent meanwhile are credited
	// (charged at home, not yet in the share, they count nowhere: low,
	// never high).
	for i := range 2 {
		if a := far.check(t, check); a.status != 200 || a.body["decided_by"] != "share" {
			t.Fatalf("check %d in us: %d %s", i, a.status, a.raw)
		}
	}
	redistest.WaitUntil(t, "us answers 4 left", 10*time.Second, func() bool {
		expire()
		a = status(far)
		if n := a.num("remaining"); n > 4 || a.body["remaining_source"] != "home" {
			t.Fatalf("us answers %s after 6 checks of 10", a.raw)
		}
		return a.num("remaining") == 4
	})

	// A flood of status calls in us: one read at the home. (A fetch us
	// sent on its last check may still be on its way: charged at home,
	// not yet in the share, it makes the answers low, never high.)
	expire()
	peeks := monitorCount(t, eu, id)
	var wg sync.WaitGroup
	for range 40 {
		wg.Go(func() {
			if a := far.do(t, "GET", "/v1/status?policy=world&key="+id, ""); a.num("remaining") > 4 || a.body["remaining_source"] != "home" {
				t.Errorf("in the flood: %d %s", a.status, a.raw)
			}
		})
	}
	wg.Wait()
	if n := peeks(); n != 1 {
		t.Fatalf("40 status calls in us sent the home %d commands on the key, want 1", n)
	}

	// Cut off from the home: the share's figure, said to be the share's,
	// within the read's timeout; the next call at once, from the kept
	// failure (a read again would wait out the timeout: the link is a
	// black hole).
	link.Partition()
	expire()
	t0 := time.Now()
	a = status(far)
	if el := time.Since(t0); a.body["remaining_source"] != "share" || a.body["decided_by"] != "share" || a.num("remaining") > 4 || el > homeread.DefaultTimeout+2*time.Second {
		t.Fatalf("cut off: %s in %s", a.raw, el)
	}
	t0 = time.Now()
	if a = status(far); a.body["remaining_source"] != "share" {
		t.Fatalf("the second call: %s", a.raw)
	}
	if el := time.Since(t0); el >= homeread.DefaultTimeout {
		t.Fatalf("the second call took %s: the home was read again", el)
	}
}

// monitorCount counts the commands clients send s from now on whose
// line in MONITOR holds sub (not the calls scripts make), until the returned function is called: it returns
// the count, every command run before it included (a marker sent after
// them ends the count).
func monitorCount(t *testing.T, s *redistest.Server, sub string) func() int {
	t.Helper()
	c, err := net.Dial("tcp", s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	if line, err := r.ReadString('\n'); err != nil || line != "+OK\r\n" {
		t.Fatalf("MONITOR: %q %v", line, err)
	}
	return func() int {
		t.Helper()
		marker := "monitor-end-" + sub
		if _, err := s.Do(context.Background(), "ECHO", marker); err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("MONITOR: %v", err)
			}
			if strings.Contains(line, `"ECHO"`) || strings.Contains(line, `"echo"`) {
				if strings.Contains(line, marker) {
					return n
				}
			}
			if strings.Contains(line, sub) && !strings.Contains(line, " lua] ") { // not a script's own calls
				n++
			}
		}
	}
}
