package server

import (
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/ratelimittest"
)

// headerConfig has a single-limit tier and a multi-limit one, every rate
// different from its burst, and a shadow policy that must not be published.
const headerConfig = `
policies:
  burst: {limit: 10/s burst 30}
  slow: {algorithm: token_bucket, limit: 100/min burst 5}
  rpd: {limit: 1000/day}
  watch: {limit: 1/min, shadow: true}
tiers:
  single: {policies: [burst]}
  multi: {policies: [slow, rpd, watch]}
authz:
  user_header: X-User-ID
  trusted_proxies: [127.0.0.1/32, "::1"]
  default_tier: multi
`

// rateLimitFields are the fields a door's answer is compared on.
var rateLimitFields = []string{"Ratelimit-Policy", "Ratelimit", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Retry-After"}

func fieldsOf(h http.Header) http.Header {
	out := http.Header{}
	for _, k := range rateLimitFields {
		if v, ok := h[k]; ok {
			out[k] = v
		}
	}
	return out
}

// TestHeadersGoldenPerDoor holds /v1/check, /v1/status and /v1/authz to the
// header model of docs/API.md, for a single- and a multi-limit tier with
// rates that differ from their bursts, and checks every answer against the
// draft's grammar.
func TestHeadersGoldenPerDoor(t *testing.T) {
	s := startService(t, svcOptions{config: headerConfig})
	singlePolicy := `"burst";q=10;w=1;sluice-burst=30`
	multiPolicy := `"slow";q=100;w=60;sluice-burst=5, "rpd";q=1000;w=86400;sluice-burst=1000`

	// Single limit, 10/s burst 30: the rate is q/w, the burst its own
	// parameter; the next unit is 100ms away.
	a := s.check(t, `{"tier":"single","key":"k1"}`)
	want := http.Header{
		"Ratelimit-Policy":      {singlePolicy},
		"Ratelimit":             {`"burst";r=29;t=1`},
		"X-Ratelimit-Limit":     {"30"}, // the burst: Remaining never above Limit
		"X-Ratelimit-Remaining": {"29"},
		"X-Ratelimit-Reset":     {"1"},
	}
	s.expect(t, "check single", a, want, 200)
	if a.num("rate") != 10 || a.num("period_ms") != 1000 || a.num("burst") != 30 || a.num("limit") != 10 || a.num("window_ms") != 1000 {
		t.Errorf("check single JSON: %s", a.raw)
	}

	// Multi limit: five requests spend slow's burst of 5; the sixth is
	// denied by slow alone. slow speaks for the request, first; rpd, far
	// from spent, follows; the shadow policy is not published.
	for range 5 {
		s.check(t, `{"tier":"multi","key":"k2"}`)
	}
	a = s.check(t, `{"tier":"multi","key":"k2"}`)
	want = http.Header{
		"Ratelimit-Policy":      {multiPolicy},
		"Ratelimit":             {`"slow";r=0;t=1, "rpd";r=995;t=87`},
		"X-Ratelimit-Limit":     {"100"},
		"X-Ratelimit-Remaining": {"0"},
		"X-Ratelimit-Reset":     {"3"},
		"Retry-After":           {"1"},
	}
	s.expect(t, "check multi denied", a, want, 429)
	if a.num("rate") != 100 || a.num("period_ms") != 60000 || a.num("burst") != 5 || a.num("retry_after_ms") != 600 {
		t.Errorf("check multi JSON: %s", a.raw)
	}

	// /v1/status peeks the same state: the same fields, answered 200.
	a = s.do(t, "GET", "/v1/status?tier=multi&key=k2", "")
	want["Ratelimit"] = []string{`"slow";r=0;t=1, "rpd";r=995;t=87`}
	s.expect(t, "status multi", a, want, 200)

	// /v1/authz: the user's default tier is multi.
	a = s.do(t, "GET", "/v1/authz", "", "X-User-ID", "u1")
	want = http.Header{
		"Ratelimit-Policy":      {multiPolicy},
		"Ratelimit":             {`"slow";r=4;t=1, "rpd";r=999;t=87`},
		"X-Ratelimit-Limit":     {"100"},
		"X-Ratelimit-Remaining": {"4"},
		"X-Ratelimit-Reset":     {"1"},
	}
	s.expect(t, "authz multi", a, want, 200)
	// /v1/authz takes the tier from the caller alone: a service whose
	// default tier is the single-limit one.
	s1 := startService(t, svcOptions{config: strings.Replace(headerConfig, "default_tier: multi", "default_tier: single", 1)})
	a = s1.do(t, "GET", "/v1/authz", "", "X-User-ID", "u1")
	want = http.Header{
		"Ratelimit-Policy":      {singlePolicy},
		"Ratelimit":             {`"burst";r=29;t=1`},
		"X-Ratelimit-Limit":     {"30"}, // the burst: Remaining never above Limit
		"X-Ratelimit-Remaining": {"29"},
		"X-Ratelimit-Reset":     {"1"},
	}
	s.expect(t, "authz single", a, want, 200)
}

func (s *svc) expect(t *testing.T, what string, a answer, want http.Header, status int) {
	t.Helper()
	if a.status != status {
		t.Errorf("%s: status %d, want %d: %s", what, a.status, status, a.raw)
	}
	if got := fieldsOf(a.header); !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got %v\nwant %v", what, got, want)
	}
	ratelimittest.Check(t, a.header)
}
