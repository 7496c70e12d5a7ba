package server

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/regiontest"
)

// TestConsoleRegions: the console's region view of `sluice serve` in us,
// the other regions (eu, ap) through links of 40 and 80 ms each way
// (internal/regiontest), with a global policy homed in eu: this region,
// the others' reachability (ap cut off by a partition: unreachable
// within the view's second), the global policies and their homes, what
// decided this instance's global keys, the failure policies in force. It
// takes the admin token even under console.public_read, and a browser
// page on another Host gets nothing (DNS rebinding).
func TestConsoleRegions(t *testing.T) {
	s, w := regionsService(t)
	for range 3 {
		if a := s.check(t, `{"policy":"world","key":"c1"}`); a.status != 200 || a.body["decided_by"] != "share" {
			t.Fatalf("check: %d %s", a.status, a.raw)
		}
	}
	if a := s.do(t, "GET", "/ui/api/regions", ""); a.status != 401 {
		t.Fatalf("without the token, under public_read: %d %s", a.status, a.raw)
	}
	if a := s.do(t, "GET", "/ui/api/regions", "", append([]string{"Host", "evil.example:80"}, bearer...)...); a.status != 403 {
		t.Fatalf("another Host: %d %s", a.status, a.raw)
	}
	w.Links[[2]string{"us", "ap"}].Partition()
	// A fourth check just before the view.
	if a := s.check(t, `{"policy":"world","key":"c1"}`); a.status != 200 {
		t.Fatalf("check: %d %s", a.status, a.raw)
	}
	a := s.do(t, "GET", "/ui/api/regions", "", bearer...)
	if a.status != 200 {
		t.Fatalf("regions: %d %s", a.status, a.raw)
	}
	var v regionsJSON
	if err := json.Unmarshal([]byte(a.raw), &v); err != nil {
		t.Fatal(err)
	}
	if v.Region != "us" || v.FailurePolicy != "fail_closed" || v.StoreFailurePolicy != "fail_closed" {
		t.Fatalf("view: %s", a.raw)
	}
	if len(v.Regions) != 2 || v.Regions[0].Name != "ap" || v.Regions[0].Reachable || v.Regions[1].Name != "eu" || !v.Regions[1].Reachable || v.Regions[1].RTTMS < 80 {
		t.Fatalf("reachability (ap cut off, eu 80 ms round trip): %+v", v.Regions)
	}
	if len(v.Policies) != 1 || v.Policies[0] != (globalPolicy{"world", "eu"}) {
		t.Fatalf("policies: %+v", v.Policies)
	}
	if v.Decisions["share"] != 4 || v.Fetches["sent"] == 0 || v.Units["fetched"] < 4 || v.Keys != 1 {
		t.Fatalf("counters: %s", a.raw)
	}
	// What us holds of world's capacity: what was fetched less the 4
	// spent, at most (the shares are read before the counters, and a
	// fetch may land between; region's TestHeld is exact).
	if h := v.Held; h == nil || h.Read != 1 || h.Shares > 1 || h.Units < 0 || h.Units > int64(v.Units["fetched"])-4 {
		t.Fatalf("shares held %+v: %s", v.Held, a.raw)
	}
	if strings.Contains(a.raw, "c1") {
		t.Fatalf("the view names a key: %s", a.raw)
	}
	// Without regions: 404, saying why.
	plain := startService(t, svcOptions{config: consoleConfig})
	if a := plain.do(t, "GET", "/ui/api/regions", "", bearer...); a.status != 404 || !strings.Contains(a.raw, "store.region") {
		t.Fatalf("without regions: %d %s", a.status, a.raw)
	}
}

// regionsService runs `sluice serve` with its console in region us of a
// regiontest.World (eu and ap through their links), with a global policy
// world (gcra 100/s) homed in eu.
func regionsService(t *testing.T) (*svc, *regiontest.World) {
	t.Helper()
	w := regiontest.NewWorld(t)
	cfg := consoleConfig + fmt.Sprintf(`store:
  url: %q
  failure_policy: fail_closed
  timeout: 1s
  region: us
  regions:
    eu: {url: %q}
    ap: {url: %q}
  global: {clock_skew: 5ms}
`, w.Redis["us"].URL(), w.Links[[2]string{"us", "eu"}].URL(), w.Links[[2]string{"us", "ap"}].URL())
	cfg = strings.Replace(cfg, "anon: {limit: 2/min}", "anon: {limit: 2/min}\n  world: {algorithm: gcra, limit: 100/s, scope: global, home: eu}", 1)
	return startService(t, svcOptions{redis: true, config: cfg}), w
}
