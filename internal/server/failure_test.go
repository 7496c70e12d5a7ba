package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
)

// eventually polls cond until it holds or 30s pass.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	// Generous: a loaded machine running -race can take seconds for what
	// takes milliseconds alone; a passing run never waits this long.
	var got string
	if !redistest.PollUntil(time.Now().Add(30*time.Second), func() bool {
		var ok bool
		ok, got = cond()
		return ok
	}) {
		t.Fatalf("%s: not within 30s; last: %s", what, got)
	}
}

// TestReloadFailurePolicyLive: a reloaded failure policy applies to
// decisions and /readyz together, from the next request on, while the
// store is failing. A degraded answer names its policy in Sluice-Degraded;
// a degraded denial is a 429 with Retry-After; the error policy is a 503.
func TestReloadFailurePolicyLive(t *testing.T) {
	s := startService(t, svcOptions{
		config: testConfig + "store: {failure_policy: fail_open}\n",
		wrap:   func(st sluice.Store) sluice.Store { return failingStore{st} },
	})
	for _, c := range []struct {
		policy  string
		status  int
		allowed bool
		ready   int
	}{
		{"fail_open", 200, true, 200},
		{"fail_closed", 429, false, 503},
		{"error", 503, false, 503},
		{"local", 200, true, 200},
	} {
		if c.policy != "fail_open" {
			writeAtomic(t, s.path, testConfig+"store: {failure_policy: "+c.policy+"}\n")
			if err := s.waitReload(t); err != nil {
				t.Fatalf("reload to %s: %v", c.policy, err)
			}
		}
		a := s.check(t, fmt.Sprintf(`{"policy":"a","key":"live-%s"}`, c.policy))
		if a.status != c.status {
			t.Fatalf("%s: %d %v %s", c.policy, a.status, a.header, a.raw)
		}
		switch {
		case c.policy == "error":
			if msg, _ := a.body["error"].(string); !strings.Contains(msg, "store unavailable") || a.header.Get("Retry-After") == "" {
				t.Errorf("error policy: %v %s", a.header, a.raw)
			}
		default:
			if a.body["allowed"] != c.allowed || a.body["degraded"] != true || a.header.Get(DegradedHeader) != c.policy ||
				(!c.allowed && a.header.Get("Retry-After") == "") {
				t.Errorf("%s: %v %s", c.policy, a.header, a.raw)
			}
		}
		// /readyz follows the same config, from the probe, without waiting
		// for decisions.
		eventually(t, c.policy+" readyz", func() (bool, string) {
			r := s.do(t, "GET", "/readyz", "")
			return r.status == c.ready && strings.Contains(r.raw, c.policy), fmt.Sprintf("%d %s", r.status, r.raw)
		})
	}
	// The authz door keeps deny_status for a degraded denial too.
	writeAtomic(t, s.path, strings.Replace(testConfig, "  default_tier: anonymous\n", "  default_tier: anonymous\n  deny_status: 403\n", 1)+"store: {failure_policy: fail_closed}\n")
	if err := s.waitReload(t); err != nil {
		t.Fatal(err)
	}
	if a := s.do(t, "GET", "/v1/authz", "", "X-User-ID", "deg"); a.status != 403 || a.header.Get("Retry-After") == "" || a.header.Get(DegradedHeader) != "fail_closed" {
		t.Fatalf("authz degraded denial: %d %v", a.status, a.header)
	}
}

// TestRedisServeStartsWhileDown: the service starts with Redis down,
// answers by its policy meanwhile (local with store.instances: degraded
// decisions; local counting by heartbeat: degraded denials, since it has
// never read its share; error: 503), reports not ready where the policy
// cannot answer without Redis, and recovers when Redis comes back: /readyz
// without any decision traffic, then exact decisions from Redis.
func TestRedisServeStartsWhileDown(t *testing.T) {
	for _, c := range []struct {
		name, policy string
		status       int // of a check while down
		ready        int // of /readyz while down
	}{
		{"local_instances", "local, instances: 3", 200, 200},
		{"local", "local", 429, 503},
		{"error", "error", 503, 503},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := redistest.NewStandalone(t)
			srv.Kill()
			s := startService(t, svcOptions{redis: true, config: redisConfig(srv.URL(), c.policy)})
			c.policy, _, _ = strings.Cut(c.policy, ",")
			body := fmt.Sprintf(`{"policy":"b","key":%q}`, redistest.Prefix(t))
			// The probe finds Redis down and opens the circuit (before it
			// does, local denies a failed call rather than spend locally).
			eventually(t, "circuit open", func() (bool, string) {
				m := s.do(t, "GET", "/metrics", "").raw
				return strings.Contains(m, "\nsluice_store_circuit_state 2\n"), metricLine(m, "sluice_store_circuit_state")
			})
			if a := s.check(t, body); a.status != c.status || (c.status != 503 && a.header.Get(DegradedHeader) != c.policy) {
				t.Fatalf("check while down: %d %v %s", a.status, a.header, a.raw)
			}
			if r := s.do(t, "GET", "/readyz", ""); r.status != c.ready || !strings.Contains(r.raw, "store unreachable") && !strings.Contains(r.raw, "instance count not read") {
				t.Fatalf("readyz while down: %d %s", r.status, r.raw)
			}
			srv.Restart(t)
			eventually(t, "readyz after Redis returned", func() (bool, string) {
				r := s.do(t, "GET", "/readyz", "")
				return r.status == 200 && r.raw == "ready\n", fmt.Sprintf("%d %s", r.status, r.raw)
			})
			if a := s.check(t, body); a.status != 200 || a.body["degraded"] != false || a.header.Get(DegradedHeader) != "" {
				t.Fatalf("check after Redis returned: %d %v %s", a.status, a.header, a.raw)
			}
		})
	}
}

// TestRedisLocalCacheInServe: with store.local_cache on (the default), 100
// denials of one key cost a handful of Redis script calls, not 100: the
// known denial is answered locally until its Retry-After.
func TestRedisLocalCacheInServe(t *testing.T) {
	srv := redistest.NewStandalone(t)
	cfg := strings.Replace(redisConfig(srv.URL(), "local"), "anon: {limit: 2/min}", "anon: {limit: 2/min}\n  slow: {limit: 1/h}", 1)
	s := startService(t, svcOptions{redis: true, config: cfg})
	body := fmt.Sprintf(`{"policy":"slow","key":%q}`, redistest.Prefix(t))
	if a := s.check(t, body); a.status != 200 {
		t.Fatalf("first: %d %s", a.status, a.raw)
	}
	ctx := context.Background()
	before, err := srv.CommandCalls(ctx, "evalsha")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if a := s.check(t, body); a.status != 429 || a.body["degraded"] != false {
			t.Fatalf("denial %d: %d %s", i, a.status, a.raw)
		}
	}
	after, err := srv.CommandCalls(ctx, "evalsha")
	if err != nil {
		t.Fatal(err)
	}
	// One call learns the denial; the instance heartbeat adds one script
	// call a second.
	if calls := after - before; calls > 10 {
		t.Fatalf("100 denials made %d Redis script calls; want the local cache to answer them", calls)
	}
	if m := s.do(t, "GET", "/metrics", "").raw; !strings.Contains(m, "sluice_store_deny_cache_hits_total 99") {
		t.Errorf("cache hits:\n%s", grep(m, "deny_cache"))
	}
}
