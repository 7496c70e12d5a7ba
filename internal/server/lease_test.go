package server

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/redistest"
)

// A policy with `lease: true` decides a hot key from leased capacity: the
// lease metrics count hits and fetches, and the answers stay within the
// limit. A policy without it still asks Redis each time.
func TestRedisLeasedPolicy(t *testing.T) {
	srv := redistest.Standalone(t)
	cfg := strings.Replace(redisConfig(srv.URL(), "fail_closed"), "anon: {limit: 2/min}", "anon: {limit: 2/min}\n  hot: {limit: 1000000/s, lease: true}\n  capped: {limit: 1000/day burst 300, lease: true}", 1)
	s := startService(t, svcOptions{redis: true, config: cfg})
	id := redistest.Prefix(t)
	for i := range 400 {
		if a := s.check(t, fmt.Sprintf(`{"policy":"hot","key":%q}`, id)); a.status != 200 {
			t.Fatalf("hot %d: %d %s", i, a.status, a.raw)
		}
	}
	admitted := 0
	for range 400 {
		a := s.check(t, fmt.Sprintf(`{"policy":"capped","key":%q}`, id))
		if a.status == 200 {
			admitted++
		}
	}
	if admitted > 301 {
		t.Fatalf("capped: admitted %d of a burst of 300", admitted)
	}
	m := s.do(t, "GET", "/metrics", "").raw
	hits := metricValue(t, m, "sluice_lease_hits_total")
	fetches := metricValue(t, m, "sluice_lease_fetches_total")
	t.Logf("lease hits %d, fetches %d; capped admitted %d", hits, fetches, admitted)
	if hits < 200 || fetches == 0 || fetches > hits/4 {
		t.Fatalf("lease hits %d, fetches %d", hits, fetches)
	}
}

func metricValue(t *testing.T, m, name string) int64 {
	t.Helper()
	for _, l := range strings.Split(m, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return int64(n)
		}
	}
	t.Fatalf("metrics lack %s", name)
	return 0
}
