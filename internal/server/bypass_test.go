package server

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
)

// The API keys of the bypass tests.
const (
	bypassFree = "sk-bypass-free"
	bypassEnt  = "sk-bypass-enterprise"
)

// bypassConfig is the config of TestBypass. Every policy name ends in {S},
// a suffix unique to one row of one run, so that rows and runs sharing a
// Redis server never share state. tight{S} (3/h) is the free tier, the
// limit the tricks try to get past; login{S} (2/h) is what the routes add.
const bypassConfig = `
policies:
  tight{S}: {limit: 3/h}
  loose{S}: {limit: 1000/h}
  daily{S}: {algorithm: fixed_window, limit: 1000/day, shadow: true}
  lonely{S}: {limit: 1000/h, shadow: true}
  anon{S}: {algorithm: token_bucket, limit: 3/h}
  login{S}: {limit: 2/h}
  roomy{S}: {limit: 1000/h}
tiers:
  free: {policies: [tight{S}]}
  enterprise: {policies: [loose{S}]}
  anonymous: {policies: [anon{S}]}
  watch: {policies: [lonely{S}]}
keys:
  - {name: free, hash: ` + "{FREE}" + `, tier: free}
  - {name: ent, hash: ` + "{ENT}" + `, tier: enterprise}
authz:
  user_header: X-User-ID
  trusted_proxies: [127.0.0.1/32, "::1"]
  default_tier: anonymous
  selectable_policies: [login{S}, roomy{S}, daily{S}]
  routes:
    - {path_prefix: /login, policies: [login{S}]}
    - {path: /admin, methods: [POST], host: api.example.com, policies: [login{S}]}
max_body_bytes: 4096
`

// bypassReq is one request of a trick.
type bypassReq struct {
	method, target, body string
	// hdr holds name, value pairs, added in order (a name may repeat).
	hdr []string
	// units is what an admission of the request is charged; 0 means 1.
	units int64
}

// bypassTrick is one row of TestBypass: requests a hostile caller sends
// to get past the limit of its identity.
type bypassTrick struct {
	name string
	// limit is the most the identity may be admitted, in units.
	limit int64
	// want is what it is admitted (the trick is refused or ignored).
	want int64
	// untrusted makes the test client's address (127.0.0.1) an untrusted
	// peer.
	untrusted bool
	// config, if set, edits the row's config (before {S} and the key
	// hashes are filled in).
	config func(cfg string) string
	// prime requests are sent first and not counted.
	prime []bypassReq
	n     int
	req   func(s string, i int) bypassReq
}

func authzReq(target string, hdr ...string) bypassReq {
	return bypassReq{method: "GET", target: target, hdr: hdr}
}

func checkReq(body string) bypassReq {
	return bypassReq{method: "POST", target: "/v1/check", body: body}
}

func rotate[T any](vs []T, i int) T { return vs[i%len(vs)] }

var bypassTricks = []bypassTrick{
	// Forward-auth.
	{name: "authz/baseline", limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-API-Key", bypassFree)
	}},
	{name: "authz/tier query", limit: 3, want: 0, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz?tier=enterprise", "X-API-Key", bypassFree)
	}},
	{name: "authz/looser selectable policy adds", limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz?policy=roomy"+s, "X-API-Key", bypassFree)
	}},
	{name: "authz/shadow policy adds", limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz?policy=daily"+s, "X-API-Key", bypassFree)
	}},
	{name: "authz/policy not selectable", limit: 3, want: 0, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz?policy=loose"+s, "X-API-Key", bypassFree)
	}},
	{name: "authz/repeated policies", limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		return authzReq(fmt.Sprintf("/v1/authz?policy=roomy%s&policy=roomy%s&policy=daily%s", s, s, s), "X-API-Key", bypassFree)
	}},
	{name: "authz/Envoy path carries the client's query", limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz/api/x?tier=enterprise&policy=loose"+s+"&cost=0", "X-API-Key", bypassFree)
	}},
	// "+1" is 1, as strconv reads it: the one admission.
	{name: "authz/cost tricks", limit: 3, want: 1, n: 9, req: func(s string, i int) bypassReq {
		c := rotate([]string{"0", "-1", "9223372036854775808", "1e3", "0x10", "%2B1", "1.0", "", "1&cost=0"}, i)
		return authzReq("/v1/authz?cost="+c, "X-API-Key", bypassFree)
	}},
	{name: "authz/cost above the burst", limit: 3, want: 0, n: 4, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz?cost="+rotate([]string{"4", "9223372036854775807"}, i), "X-API-Key", bypassFree)
	}},
	{name: "authz/cost 2", limit: 3, want: 2, n: 4, req: func(s string, i int) bypassReq {
		r := authzReq("/v1/authz?cost=2", "X-API-Key", bypassFree)
		r.units = 2
		return r
	}},
	{name: "authz/Bearer spellings are one key", limit: 3, want: 3, n: 8, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", rotate([][]string{
			{"Authorization", "Bearer " + bypassFree}, {"Authorization", "bearer " + bypassFree},
			{"Authorization", "BEARER   " + bypassFree}, {"Authorization", "bEaReR\t" + bypassFree},
			{"X-API-Key", bypassFree}, {"X-API-Key", "Bearer " + bypassFree}, {"X-API-Key", " " + bypassFree + " "},
		}, i)...)
	}},
	{name: "authz/two keys in duplicated headers", limit: 3, want: 0, n: 4, req: func(s string, i int) bypassReq {
		k := []string{bypassFree, bypassEnt}
		return authzReq("/v1/authz", "X-API-Key", k[i%2], "X-API-Key", k[1-i%2])
	}},
	{name: "authz/fresh unknown keys", limit: 3, want: 0, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-API-Key", fmt.Sprintf("sk-made-up-%d-%s", i, strings.Repeat("x", 8000*(i%2))))
	}},
	{name: "authz/route not dodged by a second URI header", limit: 2, want: 2, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-API-Key", bypassEnt, "X-Original-URI", "/login/form", "X-Forwarded-Uri", "/public")
	}},
	{name: "authz/route not dodged by path spellings", limit: 2, want: 2, n: 12, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-API-Key", bypassEnt, "X-Forwarded-Uri", rotate([]string{
			"/login", "//login", "/./login", "/x/../login", "/%6cogin", "/LOGIN", "/login;jsessionid=1",
			`\login`, "/%2e%2e/login", "http://evil.example/login?x", "/%256cogin", "/Login/../Login/",
		}, i))
	}},
	{name: "authz/route not dodged below /v1/authz/ (Envoy)", limit: 2, want: 2, n: 6, req: func(s string, i int) bypassReq {
		return authzReq(rotate([]string{"/v1/authz/login", "/v1/authz/LOGIN/x", "/v1/authz/%6Cogin", "/v1/authz/login;x=1"}, i), "X-API-Key", bypassEnt)
	}},
	{name: "authz/route method and host spellings", limit: 2, want: 2, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-API-Key", bypassEnt, "X-Forwarded-Uri", "/admin",
			"X-Forwarded-Method", rotate([]string{"post", "POST", "Post"}, i),
			"X-Original-Method", "GET", // a second method header cannot hide the first
			"X-Forwarded-Host", rotate([]string{"API.Example.com:443", "api.example.com.", "evil.example, api.example.com"}, i))
	}},
	{name: "authz/user header from an untrusted peer", untrusted: true, limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-User-ID", fmt.Sprintf("user-%d", i))
	}},
	{name: "authz/X-Forwarded-For from an untrusted peer", untrusted: true, limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i))
	}},
	{name: "authz/X-Forwarded-For prepended", limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d, 203.0.113.7", i))
	}},
	{name: "authz/X-Forwarded-For in duplicated headers", limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i), "X-Forwarded-For", "203.0.113.7")
	}},
	{name: "authz/X-Forwarded-For malformed last hop", limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-Forwarded-For", fmt.Sprintf("203.0.113.7, garbage-%d", i))
	}},
	{name: "authz/IPv6 addresses of one /64", limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-Forwarded-For", fmt.Sprintf("2001:db8:1:2::%x", i+1))
	}},
	{name: "authz/duplicated user headers", limit: 3, want: 0, n: 4, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-User-ID", "u", "X-User-ID", fmt.Sprintf("u%d", i))
	}},
	{name: "authz/long user id", limit: 3, want: 0, n: 4, req: func(s string, i int) bypassReq {
		return authzReq("/v1/authz", "X-User-ID", fmt.Sprintf("%d%s", i, strings.Repeat("u", 600)))
	}},

	// /v1/check.
	{name: "check/baseline", limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		return checkReq(`{"api_key":"` + bypassFree + `"}`)
	}},
	{name: "check/tier beside api_key", limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		return checkReq(`{"api_key":"` + bypassFree + `","tier":"enterprise"}`)
	}},
	{name: "check/policy beside api_key", limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		return checkReq(`{"api_key":"` + bypassFree + `","policy":"loose` + s + `"}`)
	}},
	{name: "check/shadow policy beside api_key", limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		return checkReq(`{"api_key":"` + bypassFree + `","policy":"daily` + s + `"}`)
	}},
	{name: "check/shadow-only tier beside api_key", limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		return checkReq(`{"api_key":"` + bypassFree + `","tier":"watch"}`)
	}},
	{name: "check/field name case and escapes", limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		return checkReq(rotate([]string{
			`{"API_KEY":"` + bypassFree + `","Tier":"enterprise"}`,
			`{"api_key":"sk\u002dbypass-free"}`,
			`{"api_key":"\u0073k-bypass-free","policy":"roomy` + s + `"}`,
		}, i))
	}},
	{name: "check/cost tricks", limit: 3, want: 0, n: 10, req: func(s string, i int) bypassReq {
		c := rotate([]string{"-1", "0", "9223372036854775807", "9223372036854775808", "1e3", "1.0", `"1"`, "99999999999999999999", "-9223372036854775808", "4"}, i)
		return checkReq(`{"api_key":"` + bypassFree + `","cost":` + c + `}`)
	}},
	{name: "check/batch repeats one key", limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		if i%2 == 1 {
			return checkReq(`{"api_key":"` + bypassFree + `"}`)
		}
		r := checkReq(`{"checks":[{"api_key":"` + bypassFree + `"},{"api_key":"` + bypassFree + `","tier":"free"}]}`)
		r.units = 2
		return r
	}},
	{name: "check/batch too large", limit: 3, want: 0, n: 2, req: func(s string, i int) bypassReq {
		items := strings.TrimSuffix(strings.Repeat(`{"api_key":"`+bypassFree+`"},`, 17), ",")
		return checkReq(`{"checks":[` + items + `]}`)
	}},
	{name: "check/batch costs that would wrap", limit: 3, want: 0, n: 2, req: func(s string, i int) bypassReq {
		return checkReq(`{"checks":[{"api_key":"` + bypassFree + `","cost":4611686018427387904},{"api_key":"` + bypassFree + `","cost":4611686018427387904}]}`)
	}},
	{name: "check/invalid UTF-8 keys", limit: 3, want: 0, n: 6, req: func(s string, i int) bypassReq {
		k := rotate([]string{"\xff", "\xfe", `\ud800`, `\udfff`, `\ud800\u0041`, "a\xc0\xafb"}, i)
		return checkReq(`{"policy":"tight` + s + `","key":"` + k + `"}`)
	}},
	{name: "check/key escapes are the same key", limit: 3, want: 3, n: 6, req: func(s string, i int) bypassReq {
		k := rotate([]string{"k\u00e9", `k\u00e9`, `\u006b\u00E9`}, i)
		return checkReq(`{"policy":"tight` + s + `","key":"` + k + `"}`)
	}},
	{name: "check/long key", limit: 3, want: 0, n: 2, req: func(s string, i int) bypassReq {
		return checkReq(`{"policy":"tight` + s + `","key":"` + strings.Repeat("k", 513+i) + `"}`)
	}},

	// /v1/status: a peek of an exhausted key never says allowed.
	{name: "status/tier beside the API key", limit: 0, want: 0, n: 3,
		prime: []bypassReq{checkReq(`{"api_key":"` + bypassFree + `","cost":3}`)},
		req: func(s string, i int) bypassReq {
			q := rotate([]string{"?tier=enterprise", "?policy=loose" + s, "?policy=daily" + s}, i) + "&cost=1"
			return bypassReq{method: "GET", target: "/v1/status" + q, hdr: []string{"X-API-Key", bypassFree}}
		}},
}

// TestBypass runs each trick against the service on the memory store and
// on a real Redis: the identity is never admitted more than its limit.
func TestBypass(t *testing.T) { runBypass(t, bypassTricks) }

// runBypass runs tricks as TestBypass describes.
func runBypass(t *testing.T, tricks []bypassTrick) {
	run := fmt.Sprintf("%06x", rand.Uint32()&0xffffff)
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			var url string
			if store == "redis" {
				url = redistest.Standalone(t).URL()
			}
			for row, tr := range tricks {
				t.Run(tr.name, func(t *testing.T) {
					s := fmt.Sprintf("_%s_%d", run, row)
					cfg := bypassConfig
					if tr.config != nil {
						cfg = tr.config(cfg)
					}
					cfg = strings.NewReplacer("{S}", s, "{FREE}", sluice.HashKey(bypassFree), "{ENT}", sluice.HashKey(bypassEnt)).Replace(cfg)
					if tr.untrusted {
						cfg = strings.Replace(cfg, `trusted_proxies: [127.0.0.1/32, "::1"]`, `trusted_proxies: [10.0.0.0/8]`, 1)
					}
					o := svcOptions{config: cfg}
					if url != "" {
						o = svcOptions{redis: true, config: cfg + fmt.Sprintf("store: {url: %q, failure_policy: fail_closed, timeout: 1s}\n", url)}
					}
					svc := startService(t, o)
					for _, p := range tr.prime {
						if st, _ := svc.send(t, p); st != 200 {
							t.Fatalf("priming request %s %s: %d", p.method, p.target, st)
						}
					}
					var admitted int64
					statuses := map[int]int{}
					for i := range tr.n {
						r := tr.req(s, i)
						st, allowed := svc.send(t, r)
						statuses[st]++
						if allowed {
							admitted += max(r.units, 1)
						}
					}
					if admitted > tr.limit {
						t.Fatalf("admitted %d units, over the limit %d (statuses %v)", admitted, tr.limit, statuses)
					}
					if admitted != tr.want {
						t.Errorf("admitted %d units, want %d (statuses %v)", admitted, tr.want, statuses)
					}
				})
			}
		})
	}
}

// send sends r and reports its status and whether it was admitted: a
// charging request answered 200, or a peek answering "allowed": true.
func (s *svc) send(t *testing.T, r bypassReq) (int, bool) {
	t.Helper()
	req, err := http.NewRequest(r.method, s.url+r.target, strings.NewReader(r.body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(r.hdr); i += 2 {
		req.Header.Add(r.hdr[i], r.hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(r.target, "/v1/status") {
		var body struct{ Allowed bool }
		_ = json.Unmarshal(raw, &body)
		return resp.StatusCode, resp.StatusCode == 200 && body.Allowed
	}
	return resp.StatusCode, resp.StatusCode == 200
}

// TestKeysAreBytes: keys that differ in a byte that is not valid UTF-8
// never share a limit, on either store: user ids and API keys from
// headers, keys in /v1/status queries. (JSON bodies refuse such bytes:
// see the "check/invalid UTF-8 keys" trick.)
func TestKeysAreBytes(t *testing.T) {
	run := fmt.Sprintf("%06x", rand.Uint32()&0xffffff)
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			s := "_bytes_" + run
			cfg := strings.NewReplacer("{S}", s, "{FREE}", sluice.HashKey(bypassFree), "{ENT}", sluice.HashKey(bypassEnt)).Replace(bypassConfig)
			cfg = strings.Replace(cfg, "authz:\n", "authz:\n  unknown_keys: default_tier\n", 1)
			o := svcOptions{config: cfg}
			if store == "redis" {
				o = svcOptions{redis: true, config: cfg + fmt.Sprintf("store: {url: %q, failure_policy: fail_closed, timeout: 1s}\n", redistest.Standalone(t).URL())}
			}
			svc := startService(t, o)
			for _, hdr := range []string{"X-User-ID", "X-API-Key"} {
				for _, v := range []string{"u\xff", "u\xfe", "u\uFFFD"} {
					for i := range 4 {
						st, _ := svc.send(t, authzReq("/v1/authz", hdr, v))
						if want := map[bool]int{true: 200, false: 429}[i < 3]; st != want {
							t.Fatalf("%s %q request %d: %d, want %d (a fresh limit of 3)", hdr, v, i, st, want)
						}
					}
				}
			}
			// Use up the key U+FFFD; the keys 0xFF and 0xFE keep their limit.
			if st, _ := svc.send(t, checkReq(`{"policy":"tight`+s+`","key":"\ufffd","cost":3}`)); st != 200 {
				t.Fatalf("charging the key U+FFFD: %d", st)
			}
			for _, k := range []string{"%FF", "%FE", "%EF%BF%BD"} {
				st, allowed := svc.send(t, bypassReq{method: "GET", target: "/v1/status?policy=tight" + s + "&cost=1&key=" + k})
				if want := k != "%EF%BF%BD"; st != 200 || allowed != want {
					t.Errorf("status of key %s: %d allowed %v, want %v", k, st, allowed, want)
				}
			}
		})
	}
}
