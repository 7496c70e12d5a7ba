package server

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/overrides"
	"github.com/sluice-io/sluice/internal/redistest"
)

var bearer = []string{"Authorization", "Bearer " + adminToken, "Content-Type", "application/json"}

// TestOverridesAPI: the admin token guards every method; bodies, patterns
// and values are bounded; a key_name override applies to its API key; the
// audit log names the token, the change, before and after, never a key.
func TestOverridesAPI(t *testing.T) {
	logs := new(syncBuffer)
	s := startService(t, svcOptions{log: logs})
	put := func(body string) answer { return s.do(t, "PUT", "/v1/overrides", body, bearer...) }
	if a := s.do(t, "PUT", "/v1/overrides", `{"identity":"a","scale":2}`); a.status != 401 {
		t.Fatalf("no token: %d %s", a.status, a.raw)
	}
	if a := s.do(t, "GET", "/v1/overrides", "", "Authorization", "Bearer wrong", "X-Forwarded-For", "192.0.2.99"); a.status != 401 { // another client: its backoff (admin.go) is its own
		t.Fatalf("wrong token: %d %s", a.status, a.raw)
	}
	if a := s.do(t, "DELETE", "/v1/overrides?identity=a", ""); a.status != 401 {
		t.Fatalf("delete without token: %d", a.status)
	}
	for _, bad := range []struct {
		body   string
		status int
	}{
		{`{"identity":"a","scale":2,"extra":1}`, 400},
		{`{"identity":"a","policy":"nope","limit":"1/s"}`, 400},
		{`{"identity":"a","limit":"1/s"}`, 400},
		{`{"identity":"a","policy":"a","limit":"1/s","scale":3}`, 400},
		{`{"identity":"a","scale":1e300}`, 400},
		{`{"identity":"a","scale":-2}`, 400},
		{`{"identity":"a","policy":"a","limit":"9999999999999999/s"}`, 400},
		{`{"identity":"a","scale":2,"ttl":"-1h"}`, 400},
		{`{"identity":"a","scale":2,"ttl":"10000h"}`, 400},
		{`{"identity":"a","scale":2,"until":"2000-01-01T00:00:00Z"}`, 400},
		{`{"identity":"a","scale":2,"by":"mallory"}`, 400},
		{`{"identity":"key:` + freeKey + `","scale":2}`, 400},
		{`{"identity":"` + strings.Repeat("*a", 5) + `","scale":2}`, 400},
		{`{"identity":"` + strings.Repeat("x", 600) + `","scale":2}`, 400},
		{`{"identity":"` + strings.Repeat("x", 300) + `*","scale":2}`, 400},
		{"{\"identity\":\"a\xff\",\"scale\":2}", 400},
		{`{"identity":"a","scale":2,"reason":"` + strings.Repeat("r", 5000) + `"}`, 413},
		{`{"identity":"a","scale":2}{}`, 400},
		{`{"identity":"a","policy":"free","limit":"5/day in Europe/Berlin"}`, 400}, // token_bucket cannot
	} {
		if a := put(bad.body); a.status != bad.status {
			t.Errorf("%.80s: %d %s", bad.body, a.status, a.raw)
		}
	}
	if a := s.do(t, "DELETE", "/v1/overrides?identity=nobody", "", bearer...); a.status != 404 {
		t.Fatalf("delete missing: %d %s", a.status, a.raw)
	}
	// demo-free is tier free (10/min): 2x by its key name.
	if a := put(`{"identity":"key_name:demo-*","scale":2,"reason":"launch"}`); a.status != 201 || a.body["shared"] != false {
		t.Fatalf("put: %d %s", a.status, a.raw)
	}
	if a := s.check(t, fmt.Sprintf(`{"api_key":%q}`, freeKey)); a.status != 200 || a.num("rate") != 20 {
		t.Fatalf("key_name override: %d %s", a.status, a.raw)
	}
	if a := put(`{"identity":"key_name:demo-*","scale":3}`); a.status != 200 || a.body["replaced"] == nil {
		t.Fatalf("replace: %d %s", a.status, a.raw)
	}
	if a := s.do(t, "GET", "/v1/overrides?identity=key_name:demo-free", "", bearer...); a.status != 200 || a.num("count") != 1 {
		t.Fatalf("list: %d %s", a.status, a.raw)
	}
	if a := s.do(t, "DELETE", "/v1/overrides?identity=key_name:demo-*", "", bearer...); a.status != 200 {
		t.Fatalf("delete: %d %s", a.status, a.raw)
	}
	if a := s.check(t, fmt.Sprintf(`{"api_key":%q}`, freeKey)); a.num("rate") != 10 {
		t.Fatalf("after delete: %s", a.raw)
	}
	out := logs.String()
	for _, want := range []string{"override put", "by=SLUICE_ADMIN_TOKEN", `before=none`, `after="scale 2x"`, `before="scale 2x"`, `after="scale 3x"`, "override delete"} {
		if !strings.Contains(out, want) {
			t.Errorf("audit log lacks %s", want)
		}
	}
	if strings.Contains(out, freeKey) || strings.Contains(out, adminToken) {
		t.Error("the log holds a raw API key or the admin token")
	}
}

// TestOverridesPrecedence: a runtime override beats the config's; a
// specific override beats a wildcard, which beats the tier.
func TestOverridesPrecedence(t *testing.T) {
	s := startService(t, svcOptions{})
	status := func(key string) int64 {
		t.Helper()
		a := s.do(t, "GET", "/v1/status?tier=free&key="+key, "")
		if a.status != 200 {
			t.Fatalf("status %s: %d %s", key, a.status, a.raw)
		}
		return a.num("rate")
	}
	if got := status("x@example.com"); got != 10 {
		t.Fatalf("tier: %d", got)
	}
	if a := s.do(t, "PUT", "/v1/overrides", `{"identity":"*@example.com","scale":3}`, bearer...); a.status != 201 {
		t.Fatal(a.raw)
	}
	if a := s.do(t, "PUT", "/v1/overrides", `{"identity":"x@example.com","policy":"free","limit":"50/min"}`, bearer...); a.status != 201 {
		t.Fatal(a.raw)
	}
	if got := status("y@example.com"); got != 30 {
		t.Errorf("wildcard over tier: %d, want 30", got)
	}
	if got := status("x@example.com"); got != 50 {
		t.Errorf("specific over wildcard: %d, want 50", got)
	}
	if got := status("x@example.org"); got != 10 {
		t.Errorf("no match: %d, want 10", got)
	}
	// vip has a config override on policy a (7/s); the runtime one wins.
	if a := s.do(t, "PUT", "/v1/overrides", `{"identity":"vip","policy":"a","limit":"70/s"}`, bearer...); a.status != 201 {
		t.Fatal(a.raw)
	}
	if a := s.do(t, "GET", "/v1/status?policy=a&key=vip", ""); a.num("rate") != 70 {
		t.Errorf("runtime over config: %s", a.raw)
	}
}

// TestOverridesRedisReplicas: three replicas on one Redis. An override set
// on one applies on the others within 1 s; a wildcard beats the tier and a
// specific override the wildcard on every replica; an override with a ttl
// stops applying when the replica's clock passes it.
func TestOverridesRedisReplicas(t *testing.T) {
	srv := redistest.NewStandalone(t)
	var rs [3]*svc
	for i := range rs {
		rs[i] = startService(t, svcOptions{redis: true, config: redisConfig(srv.URL(), "fail_open")})
	}
	id := redistest.Prefix(t)
	rate := func(s *svc, q string) int64 {
		a := s.do(t, "GET", "/v1/status?"+q, "")
		if a.status != 200 {
			t.Fatalf("status %s: %d %s", q, a.status, a.raw)
		}
		return a.num("rate")
	}
	// within waits until cond holds on every replica, at most 1 s after
	// the change was acknowledged, and returns how long it took.
	within := func(what string, cond func(s *svc) bool) time.Duration {
		t.Helper()
		start := time.Now()
		for _, s := range rs {
			if !redistest.PollUntil(start.Add(time.Second), func() bool { return cond(s) }) {
				t.Fatalf("%s: not applied on every replica within 1s", what)
			}
		}
		return time.Since(start)
	}
	key := "policy=b&key=" + id
	for i := range 3 {
		a := rs[0].check(t, fmt.Sprintf(`{"policy":"b","key":%q}`, id))
		if want := i < 2; a.body["allowed"] != want {
			t.Fatalf("check %d: %s", i, a.raw)
		}
	}
	if a := rs[1].do(t, "PUT", "/v1/overrides", fmt.Sprintf(`{"identity":%q,"policy":"b","limit":"100/s"}`, id), bearer...); a.status != 201 || a.body["shared"] != true {
		t.Fatalf("put: %d %s", a.status, a.raw)
	}
	took := within("specific", func(s *svc) bool { return rate(s, key) == 100 })
	t.Logf("an override set on one replica applied on all three in %s", took)
	if a := rs[2].check(t, fmt.Sprintf(`{"policy":"b","key":%q}`, id)); a.status != 200 {
		t.Fatalf("the next decision on another replica: %d %s", a.status, a.raw)
	}

	tier := func(user string) string { return "tier=free&key=" + user + "@" + id + ".example" }
	if a := rs[0].do(t, "PUT", "/v1/overrides", fmt.Sprintf(`{"identity":"*@%s.example","scale":4}`, id), bearer...); a.status != 201 {
		t.Fatal(a.raw)
	}
	if a := rs[2].do(t, "PUT", "/v1/overrides", fmt.Sprintf(`{"identity":"vip@%s.example","policy":"free","limit":"90/min"}`, id), bearer...); a.status != 201 {
		t.Fatal(a.raw)
	}
	within("wildcard and specific", func(s *svc) bool { return rate(s, tier("anyone")) == 40 && rate(s, tier("vip")) == 90 })

	// Expiry: each replica judges it by its own clock.
	if a := rs[0].do(t, "PUT", "/v1/overrides", fmt.Sprintf(`{"identity":"temp-%s","policy":"b","limit":"50/s","ttl":"1m"}`, id), bearer...); a.status != 201 {
		t.Fatal(a.raw)
	}
	temp := "policy=b&key=temp-" + id
	within("ttl", func(s *svc) bool { return rate(s, temp) == 50 })
	rs[1].clk.Advance(time.Minute)
	if got := rate(rs[1], temp); got != 2 {
		t.Errorf("expired override still applies: rate %d", got)
	}
	if got := rate(rs[2], temp); got != 50 {
		t.Errorf("unexpired replica: rate %d", got)
	}
	if a := rs[1].do(t, "DELETE", "/v1/overrides?policy=b&identity="+id, "", bearer...); a.status != 200 {
		t.Fatal(a.raw)
	}
	within("delete", func(s *svc) bool { return rate(s, key) == 2 })
}

// TestOverridesRedisPause: Redis paused (SIGSTOP) under two replicas. The
// decisions go on by the failure policy (local) with the overrides each
// replica last read, an override's limit included; a change and a listing
// answer while Redis is still paused (503 and the last overrides), not
// when it returns; once it returns, changes flow to every replica again.
func TestOverridesRedisPause(t *testing.T) {
	srv := redistest.NewStandalone(t)
	var rs [2]*svc
	for i := range rs {
		rs[i] = startService(t, svcOptions{redis: true, config: redisConfig(srv.URL(), "local")})
	}
	id := redistest.Prefix(t)
	rate := func(s *svc, key string) (int64, bool) {
		a := s.do(t, "GET", "/v1/status?policy=b&key="+key, "")
		if a.status != 200 {
			t.Fatalf("status %s: %d %s", key, a.status, a.raw)
		}
		return a.num("rate"), a.body["degraded"] == true
	}
	if a := rs[0].do(t, "PUT", "/v1/overrides", fmt.Sprintf(`{"identity":%q,"policy":"b","limit":"100/s"}`, id), bearer...); a.status != 201 {
		t.Fatalf("put: %d %s", a.status, a.raw)
	}
	eventually(t, "applied on the other replica", func() (bool, string) {
		r, _ := rate(rs[1], id)
		return r == 100, fmt.Sprint(r)
	})

	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			if err := srv.Thaw(); err != nil {
				t.Error(err)
			}
		}
	}
	defer thaw()
	// Every answer below comes while Redis is paused: none waits for it.
	// The local policy splits a limit among the instances it knows of, so
	// the override shows as 50 times the policy's 2/s, whatever the split.
	withOverride := func(s *svc) (bool, string) {
		r, degraded := rate(s, id)
		plain, _ := rate(s, id+"-other")
		return degraded && plain > 0 && r == 50*plain, fmt.Sprint(r, plain, degraded)
	}
	eventually(t, "degraded decisions with the override", func() (bool, string) { return withOverride(rs[1]) })
	if a := rs[1].do(t, "PUT", "/v1/overrides", fmt.Sprintf(`{"identity":"new-%s","policy":"b","limit":"50/s"}`, id), bearer...); a.status != 503 || a.header.Get("Retry-After") == "" {
		t.Fatalf("put while paused: %d %s", a.status, a.raw)
	}
	if a := rs[0].do(t, "GET", "/v1/overrides", "", bearer...); a.status != 200 || !strings.Contains(a.raw, `"limit":"100/s"`) {
		t.Fatalf("list while paused: %d %s", a.status, a.raw)
	}
	eventually(t, "degraded decisions with the override on the replica that set it", func() (bool, string) { return withOverride(rs[0]) })
	thaw()

	// The change that got 503 may have been applied when Redis resumed
	// (its script was sent); its retry replaces it or creates it.
	eventually(t, "a change after the pause", func() (bool, string) {
		a := rs[1].do(t, "PUT", "/v1/overrides", fmt.Sprintf(`{"identity":"new-%s","policy":"b","limit":"50/s"}`, id), bearer...)
		return a.status == 200 || a.status == 201, a.raw
	})
	eventually(t, "a change after the pause reaches the other replica", func() (bool, string) {
		r, degraded := rate(rs[0], "new-"+id)
		return r == 50 && !degraded, fmt.Sprint(r, degraded)
	})
}

// TestOverridesCalendar: a runtime override is fitted to its policy as the
// config's are: "5/day" on a policy per Berlin day resets at Berlin's
// midnight (23:00 UTC on the fake clock's 1 January), not at UTC's.
func TestOverridesCalendar(t *testing.T) {
	s := startService(t, svcOptions{config: strings.Replace(testConfig, "  b: {limit: 2/s}\n", "  b: {limit: 2/s}\n  cal: {limit: 3/day, timezone: Europe/Berlin}\n", 1)})
	if a := s.do(t, "PUT", "/v1/overrides", `{"identity":"x","policy":"cal","limit":"5/day"}`, bearer...); a.status != 201 {
		t.Fatalf("put: %d %s", a.status, a.raw)
	}
	a := s.check(t, `{"policy":"cal","key":"x"}`)
	if a.status != 200 || a.num("rate") != 5 || a.num("reset_after_ms") != (23*time.Hour).Milliseconds() {
		t.Fatalf("check: %d %s", a.status, a.raw)
	}
}

// TestAdminRefusalsLogged: a request to an admin endpoint without the
// admin token is logged (a warning naming the endpoint and the peer,
// never what was presented), at most once a second with the count since
// the last line, so that guessing the token shows in the log without
// flooding it. Before, refusals left no line at all.
func TestAdminRefusalsLogged(t *testing.T) {
	logs := new(syncBuffer)
	s := startService(t, svcOptions{config: consoleConfig, log: logs})
	const guess = "guess-0123456789"
	for i, r := range []struct{ method, path string }{
		{"POST", "/v1/reset"}, {"PUT", "/v1/overrides"}, {"GET", "/v1/overrides"}, {"DELETE", "/v1/overrides?identity=a"}, {"POST", "/ui/api/reset?id=a"},
	} {
		// The first guess is wrong, the rest come during its backoff
		// (admin.go).
		if a := s.do(t, r.method, r.path, `{"policy":"b","key":"k"}`, "Authorization", "Bearer "+guess); a.status != map[bool]int{true: 401, false: 429}[i == 0] {
			t.Fatalf("%s %s: %d %s", r.method, r.path, a.status, a.raw)
		}
	}
	refusals := func() []string {
		var out []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "admin token refused") {
				out = append(out, l)
			}
		}
		return out
	}
	if got := refusals(); len(got) != 1 || !strings.Contains(got[0], "level=WARN") || !strings.Contains(got[0], "endpoint=reset") ||
		!strings.Contains(got[0], "peer=127.0.0.1") || !strings.Contains(got[0], "refused=1") {
		t.Fatalf("after five refusals in one second:\n%s", strings.Join(got, "\n"))
	}
	s.clk.Advance(time.Second)
	s.do(t, "GET", "/v1/overrides", "") // no token at all
	if got := refusals(); len(got) != 2 || !strings.Contains(got[1], "endpoint=overrides") || !strings.Contains(got[1], "refused=5") {
		t.Fatalf("a second later:\n%s", strings.Join(got, "\n"))
	}
	if strings.Contains(logs.String(), guess) || strings.Contains(logs.String(), adminToken) {
		t.Fatal("the log holds a presented or the admin token")
	}
}

// TestOverrideLongIdentity: every identity a check can have (up to 512
// bytes) can be given an override by its name. Patterns were bounded at
// 256 bytes, so a caller with a longer key (a check's key, a forward-auth
// user id) was out of reach of the operator's throttle: PUT answered 400.
// Wildcard patterns, which each decision may try, keep the 256-byte bound.
func TestOverrideLongIdentity(t *testing.T) {
	if overrides.MaxIdentityLen != config.MaxKeyLen {
		t.Fatalf("overrides.MaxIdentityLen %d, config.MaxKeyLen %d", overrides.MaxIdentityLen, config.MaxKeyLen)
	}
	s := startService(t, svcOptions{config: strings.Replace(testConfig, "max_body_bytes: 1024", "max_body_bytes: 4096", 1)})
	long := "tenant:" + strings.Repeat("x", config.MaxKeyLen-len("tenant:"))
	check := fmt.Sprintf(`{"policy":"b","key":%q}`, long)
	if a := s.check(t, check); a.status != 200 || a.num("rate") != 2 {
		t.Fatalf("before: %d %s", a.status, a.raw)
	}
	if a := s.do(t, "PUT", "/v1/overrides", fmt.Sprintf(`{"identity":%q,"policy":"b","limit":"1/s"}`, long), bearer...); a.status != 201 {
		t.Fatalf("override of a %d-byte identity: %d %s", len(long), a.status, a.raw)
	}
	if a := s.check(t, check); a.num("rate") != 1 {
		t.Fatalf("after: %s", a.raw)
	}
	for _, bad := range []string{long + "x", long[:300] + "*"} {
		if a := s.do(t, "PUT", "/v1/overrides", fmt.Sprintf(`{"identity":%q,"policy":"b","limit":"1/s"}`, bad), bearer...); a.status != 400 {
			t.Errorf("%d-byte pattern: %d %s", len(bad), a.status, a.raw)
		}
	}
}

// TestOverrideControlCharIdentity: a caller whose key holds a control
// character ("tenant:evil\n", a forward-auth user id with a tab) can be
// given an override by its exact identity, which the console now shows
// quoted and looks up byte for byte. Every pattern had to be printable,
// so such a caller was out of reach of the operator's throttle (400).
// Wildcard patterns stay printable.
func TestOverrideControlCharIdentity(t *testing.T) {
	s := startService(t, svcOptions{})
	evil, _ := json.Marshal("tenant:evil\n\x01") // as JSON: "tenant:evil\n\u0001"
	check := fmt.Sprintf(`{"policy":"b","key":%s}`, evil)
	if a := s.do(t, "PUT", "/v1/overrides", fmt.Sprintf(`{"identity":%s,"policy":"b","limit":"1/s"}`, evil), bearer...); a.status != 201 {
		t.Fatalf("override: %d %s", a.status, a.raw)
	}
	if a := s.check(t, check); a.num("rate") != 1 {
		t.Fatalf("after: %s", a.raw)
	}
	if a := s.do(t, "PUT", "/v1/overrides", `{"identity":"tenant:\n*","policy":"b","limit":"1/s"}`, bearer...); a.status != 400 {
		t.Errorf("wildcard with a control character: %d %s", a.status, a.raw)
	}
}

// TestOverrideSlidingLogRateBounded: an override that would take a
// sliding_window_log policy past algo.MaxLogRate, by its limit or by a
// scale of the policy's, is refused as the config refuses such a policy:
// each decision of a hot key would read and rewrite the whole log.
func TestOverrideSlidingLogRateBounded(t *testing.T) {
	s := startService(t, svcOptions{config: strings.Replace(testConfig, "  b: {limit: 2/s}\n", "  b: {limit: 2/s}\n  log: {limit: 5000/min, algorithm: sliding_window_log}\n", 1)})
	for _, body := range []string{
		`{"identity":"x","policy":"log","limit":"20000/min"}`,
		`{"identity":"x","policy":"log","scale":3}`,
	} {
		if a := s.do(t, "PUT", "/v1/overrides", body, bearer...); a.status != 400 || !strings.Contains(a.raw, "sliding_window_counter") {
			t.Errorf("%s: %d %s", body, a.status, a.raw)
		}
	}
	if a := s.do(t, "PUT", "/v1/overrides", `{"identity":"x","policy":"log","scale":2}`, bearer...); a.status != 201 {
		t.Fatalf("within the bound: %d %s", a.status, a.raw)
	}
}
