package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/yamlconf"
)

func TestExampleConfig(t *testing.T) {
	cfg, err := Load("../../examples/sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]sluice.Limit{
		"free":       sluice.PerMinute(10),
		"pro":        sluice.PerMinute(100),
		"enterprise": sluice.PerMinute(1000),
	}
	for tier, l := range want {
		tr := cfg.Tiers[tier]
		if tr == nil || tr.Policies[0].Limit != l || tr.Policies[0].Algorithm != sluice.TokenBucket {
			t.Errorf("tier %s = %+v, want first policy token_bucket %s", tier, tr, l)
		}
	}
	k := cfg.Keys[sluice.HashKey("sk-pro-demo-0002")]
	if k == nil || k.Tier.Name != "pro" {
		t.Fatalf("demo pro key: %+v", k)
	}
	ent := cfg.Keys[sluice.HashKey("sk-enterprise-demo-0003")]
	if got := cfg.LimitFor(cfg.Policies["enterprise"], "key:"+ent.Hash, ent); got != sluice.PerMinute(2000) {
		t.Errorf("enterprise override = %s", got)
	}
	if got := cfg.LimitFor(cfg.Policies["free"], "user:batch-importer", nil); got != sluice.PerMinute(60) {
		t.Errorf("identity override = %s", got)
	}
	if got := cfg.LimitFor(cfg.Policies["free"], "user:other", nil); got != sluice.PerMinute(10) {
		t.Errorf("no override = %s", got)
	}
	if !cfg.Policies["daily"].Shadow || cfg.Policies["anonymous"].Limit.Burst != 10 {
		t.Errorf("daily/anonymous policies: %+v %+v", cfg.Policies["daily"], cfg.Policies["anonymous"])
	}
	if cfg.Listen != ":8080" || cfg.Store.URL != "memory" || cfg.Store.Timeout != 50*time.Millisecond || cfg.Store.FailurePolicy != FailLocal {
		t.Errorf("defaults: %+v %+v", cfg.Listen, cfg.Store)
	}
	if cfg.Authz.DefaultTier.Name != "anonymous" || !cfg.Authz.RejectUnknownKeys || len(cfg.Authz.TrustedProxies) != 2 || cfg.Authz.DenyStatus != 429 {
		t.Errorf("authz: %+v", cfg.Authz)
	}
}

func TestDefaults(t *testing.T) {
	cfg, err := Parse("min.yaml", []byte("policies:\n  p:\n    limit: 5/s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Policies["p"].Algorithm != sluice.GCRA || cfg.MaxBodyBytes != DefaultMaxBodyBytes || cfg.MaxChecks != DefaultMaxChecks ||
		cfg.ShutdownTimeout != DefaultShutdownTimeout || cfg.Store.Instances != 0 || cfg.Authz.APIKeyHeaders[0] != "X-API-Key" {
		t.Errorf("defaults not applied: %+v", cfg)
	}
}

// TestBadConfigs loads every testdata/*.bad.yaml; each must fail with
// exactly the problems listed, all in one run, each naming the file, the
// line and the field, and the valid choices where there are any.
func TestBadConfigs(t *testing.T) {
	want := map[string][]string{
		"bad_route": {
			"7: authz.routes[1].path_prefix: \"login\" must be a path starting with '/'",
			"7: authz.routes[1].methods[0]: \"P OST\" is not an HTTP method",
			"7: authz.routes[1].host: \"a b\" is not a host name",
			"7: authz.routes[1].policies[0]: unknown policy \"nope\"; valid: free, login",
			"7: authz.routes[1].policies[2]: policy \"login\" listed twice",
			"8: authz.routes[2]: a route needs path, path_prefix, methods or host",
			"9: authz.routes[3].path: give path or path_prefix, not both",
			"9: authz.routes[3].policies: a route adds at least one policy",
		},
		"bad_selectable":        {"4: authz.selectable_policies[1]: unknown policy \"gold\"; valid: free", "4: authz.selectable_policies[2]: policy \"free\" listed twice"},
		"user_header_untrusted": {"4: authz.user_header: needs authz.trusted_proxies"},
		"bad_algorithm":         {`3: policies.free.algorithm: unknown algorithm "leaky"; valid: gcra, token_bucket`},
		"bad_default_tier":      {`8: authz.default_tier: unknown tier "platinum"; valid: free`},
		"bad_deny_status":       {`2: authz.deny_status: 500; valid: 429, 403`},
		"bad_failure_policy":    {`3: store.failure_policy: unknown failure policy "fail_maybe"; valid: local, fail_open, fail_closed, error`},
		"bad_limit":             {`3: policies.free.limit: invalid limit "10 per minute"`},
		"bad_override":          {`6: overrides[0].policy: unknown policy "premium"; valid: free`},
		"bad_proxy":             {`2: authz.trusted_proxies[1]: "not-an-ip"`},
		"bad_ipv6_prefix":       {`2: authz.ipv6_prefix: 20 is not in 32..64`},
		"bad_store_url":         {`2: store.url: unknown store "postgres://localhost/db"; valid: memory, redis://HOST`},
		"bad_syntax":            {`4: did not find expected key`},
		"bad_timeout":           {"2: store.timeout: cannot use `soon` as time.Duration"},
		"bad_max_bytes":         {"2: store.max_bytes: 4096 must be at least 1048576 (1 MiB), or 0 for the default"},
		"bad_type":              {"4: policies.free.burst: cannot use `lots` as int64"},
		"concurrency":           {`3: policies.slots.algorithm: concurrency`},
		"duplicate_key":         {`4: policies.free: mapping key "free" already defined at line 2`},
		"key_unknown_tier":      {`10: keys[0].tier: unknown tier "gold"; valid: free`},
		"missing_limit":         {`2: policies.free.limit: required`},
		"raw_key":               {`9: keys[0].hash: want the 64 hex digits`},
		"unknown_field":         {`4: policies.free.brust: unknown field; did you mean burst? valid: algorithm, limit, burst, shadow`},
		"unknown_tier_policy":   {`6: tiers.free.policies[1]: unknown policy "pro"; valid: free`},
		"unknown_top":           {`2: polices: unknown field; did you mean policies? valid: listen,`},
		"global_no_region":      {"6: policies.api.scope: global needs store.region and store.regions"},
		"regions": {
			`5: store.regions.eu: is this instance's own region, whose store is store.url`,
			`6: store.regions.us.url: want a redis://`,
			`7: store.global.failure_policy: unknown policy "local"; valid: fail_closed, fail_open`,
			`12: policies.log.scope: not supported for a global key: algorithm sliding_window_log`,
			`16: policies.far.home: unknown region "mars"; valid: eu, us`,
			`19: policies.odd.scope: unknown scope "planetary"; valid: regional, global`,
		},
		"regions_async": {
			`6: store.global.stale_after: 600ms must be at least twice sync_interval (500ms)`,
			`12: policies.homed.home: an async policy has no home`,
			`15: policies.regional.mode: only a policy with scope: global has a mode`,
			`19: policies.eventual.mode: unknown mode "eventual"; valid: exact, async`,
		},
		"many": {
			`2: max_chekcs: unknown field; did you mean max_checks? valid: listen, admin_token,`,
			`5: store.failure_policy: unknown failure policy "fail_sometimes"; valid: local, fail_open, fail_closed, error`,
			"6: store.timeout: cannot use `soon` as time.Duration",
			`10: policies.free.brust: unknown field; did you mean burst? valid: algorithm, limit, burst, shadow`,
			`12: policies.pro.algorithm: unknown algorithm "leaky"; valid: gcra,`,
			`16: tiers.free.policies[1]: unknown policy "premium"; valid: free, pro`,
			`19: keys[0].hash: want the 64 hex digits`,
			`20: keys[0].tier: unknown tier "gold"; valid: free`,
			`22: authz.default_tier: unknown tier "platinum"; valid: free`,
			`25: gateway.upstream.base_url: "ftp://example.com/v1" must be an http or https URL`,
			`28: gateway.tiers.free.rpmm: unknown field; did you mean rpm? valid: rpm, rpm_burst, tpm, tpm_burst, rpd, concurrency, timezone, lease, models, class, weight, budgets`,
			`29: gateway.tiers.free.tpm: -5 must not be negative`,
			`33: gateway.keys[0].tier: unknown tier "gold"; valid: free`,
		},
	}
	files, err := filepath.Glob("testdata/*.bad.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(want) {
		t.Errorf("%d fixtures, %d expectations: every fixture needs a row", len(files), len(want))
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".bad.yaml")
		t.Run(name, func(t *testing.T) {
			_, err := Load(f)
			if err == nil {
				t.Fatal("loaded a bad config")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			subs, ok := want[name]
			if !ok {
				t.Fatalf("no expectation for fixture %s: %v", name, err)
			}
			assertProblems(t, err, f, subs)
		})
	}
}

// assertProblems checks that err lists exactly the problems want, in
// order, each in file f and starting "LINE: PATH: MESSAGE", and that no
// message repeats a package prefix.
func assertProblems(t *testing.T, err error, f string, want []string) {
	t.Helper()
	var ye *yamlconf.Error
	if !errors.As(err, &ye) {
		t.Fatalf("error %v is not a *yamlconf.Error", err)
	}
	for i, p := range ye.Problems {
		if p.File != f {
			t.Errorf("problem %d names file %q, want %q", i, p.File, f)
		}
		got := fmt.Sprintf("%d: %s", p.Line, strings.TrimPrefix(p.Path+": "+p.Msg, ": "))
		if i >= len(want) {
			t.Errorf("unexpected problem %q", got)
			continue
		}
		if !strings.HasPrefix(got, want[i]) {
			t.Errorf("problem %d:\n got %s\nwant %s...", i, got, want[i])
		}
	}
	for _, w := range want[min(len(want), len(ye.Problems)):] {
		t.Errorf("missing problem %q", w)
	}
	for _, bad := range []string{"sluice: ", "config: ", "gateway: ", "yaml: ", "not found in type"} {
		if strings.Contains(strings.TrimPrefix(err.Error(), ErrInvalid.Error()), bad) {
			t.Errorf("error repeats a prefix or raw yaml.v3 text %q:\n%v", bad, err)
		}
	}
}

func TestSeveralErrorsReportedTogether(t *testing.T) {
	_, err := Parse("two.yaml", []byte("policies:\n  a:\n    limit: 0/s\n  b:\n    algorithm: nope\n    limit: 1/s\n"))
	if err == nil || !strings.Contains(err.Error(), "two.yaml:3: policies.a.limit") || !strings.Contains(err.Error(), "two.yaml:5: policies.b.algorithm") {
		t.Fatalf("want both errors, got %v", err)
	}
}

func TestLoadMissingAndEmpty(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "nope.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	p := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty file: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	data, err := os.ReadFile("../../examples/sluice.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte("policies: {a: {limit: 1/s}}\ntiers: {t: {policies: [a, a]}}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		cfg, err := Parse("fuzz.yaml", b)
		if err == nil && cfg == nil {
			t.Fatal("nil config without error")
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("error does not wrap ErrInvalid: %v", err)
		}
	})
}

func TestUnknownStoreErrorHidesPassword(t *testing.T) {
	for _, u := range []string{"redi://user:s3cret-pw@host:6379", "nope//user:s3cret-pw@host"} {
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, []byte("store:\n  url: "+u+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Load(path)
		if err == nil || !strings.Contains(err.Error(), "store.url") {
			t.Fatalf("%s: error %v", u, err)
		}
		if strings.Contains(err.Error(), "s3cret-pw") {
			t.Fatalf("the error shows the password: %v", err)
		}
	}
}

func TestAuthzRoutesCompiled(t *testing.T) {
	_, err := Parse("routes.yaml", []byte(`
policies:
  free: {limit: 10/min}
  login: {limit: 2/min}
authz:
  selectable_policies: [login]
  routes:
    - {path_prefix: /API/v1/./Login/, methods: [post, Get], host: "API.example.com:443", policies: [login, free]}
    - {path: /a%2Fb}
`))
	if err == nil || !strings.Contains(err.Error(), "routes.yaml:9: authz.routes[1].policies: a route adds at least one policy") {
		t.Fatalf("route without policies: %v", err)
	}
	cfg, err := Parse("routes.yaml", []byte(`
policies:
  free: {limit: 10/min}
  login: {limit: 2/min}
authz:
  selectable_policies: [login]
  routes:
    - {path_prefix: /API/v1/./Login/, methods: [post, Get], host: "API.example.com:443", policies: [login, free]}
`))
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Authz.Routes[0]
	if r.PathPrefix != "/api/v1/login" || r.Methods[0] != "POST" || r.Methods[1] != "GET" || r.Host != "api.example.com" || len(r.Policies) != 2 || r.Policies[0].Name != "login" {
		t.Errorf("route compiled as %+v", r)
	}
	if cfg.Authz.Selectable["login"] != cfg.Policies["login"] || len(cfg.Authz.Selectable) != 1 {
		t.Errorf("selectable: %v", cfg.Authz.Selectable)
	}
}

func TestNormalizePath(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"/login", []string{"/login"}},
		{"", []string{"/"}},
		{"/Login/", []string{"/login"}},
		{"//a/./b/../login?x=1#f", []string{"/a/login", "/login"}},
		// A URL parser against a base reads "//host/..." as an authority.
		{"//evil.example/Login", []string{"/evil.example/login", "/login"}},
		{`/\evil.example\login`, []string{"/evil.example/login", "/login"}},
		{"//evil.example", []string{"/evil.example", "/"}},
		{"//%65vil/%6Cogin", []string{"/%65vil/%6cogin", "/evil/login", "/%6cogin", "/login"}},
		{"http://evil.example\\login", []string{"/login"}},
		{`\a\login`, []string{"/a/login"}},
		{"/login;jsessionid=1/x;y", []string{"/login/x"}},
		{"https://host.example:8443/Login?q", []string{"/login"}},
		{"host/login", []string{"/host/login"}},
		{"/%6Cogin", []string{"/%6cogin", "/login"}},
		{"/%252e%252e/login", []string{"/%252e%252e/login", "/login"}},
		{"/a%2Fb", []string{"/a%2fb", "/a/b"}},
		{"/%zz", []string{"/%zz"}},
		// Letters whose upper case is ASCII: a backend comparing by upper
		// case reads them as the ASCII letter.
		{"/logın", []string{"/login"}},
		{"/ſtatus/ÉTÉ", []string{"/status/été"}},
		{"/log%C4%B1n", []string{"/log%c4%b1n", "/login"}},
	} {
		if got := NormalizePath(c.in); !slices.Equal(got, c.want) {
			t.Errorf("NormalizePath(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	for in, want := range map[string]string{"API.Example.COM": "api.example.com", "a.example:443": "a.example", "a.example.": "a.example", "[::1]:80": "::1", "::1": "::1", " h ": "h"} {
		if got := NormalizeHost(in); got != want {
			t.Errorf("NormalizeHost(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestLocalCacheDefault: store.local_cache is on unless the file turns it
// off, with or without a store section.
func TestLocalCacheDefault(t *testing.T) {
	for _, c := range []struct {
		store string
		want  bool
	}{
		{"", true},
		{"store: {url: memory}\n", true},
		{"store: {url: \"redis://127.0.0.1:6379\", timeout: 20ms}\n", true},
		{"store: {local_cache: false}\n", false},
		{"store: {local_cache: true}\n", true},
	} {
		cfg, err := Parse("c.yaml", []byte("policies:\n  p: {limit: 5/s}\n"+c.store))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Store.LocalCache != c.want {
			t.Errorf("%q: local_cache %v, want %v", c.store, cfg.Store.LocalCache, c.want)
		}
	}
}

func TestTooManyRoutes(t *testing.T) {
	doc := "policies: {p: {limit: 1/s}}\nauthz:\n  routes:\n" + strings.Repeat("    - {path: /x, policies: [p]}\n", MaxRoutes+1)
	if _, err := Parse("many.yaml", []byte(doc)); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("many.yaml:3: authz.routes: %d routes; at most %d", MaxRoutes+1, MaxRoutes)) {
		t.Fatalf("too many routes: %v", err)
	}
	doc = "policies: {p: {limit: 1/s}}\nauthz:\n  routes:\n" + strings.Repeat("    - {path: /x, policies: [p]}\n", MaxRoutes)
	if _, err := Parse("many.yaml", []byte(doc)); err != nil {
		t.Fatal(err)
	}
}

// TestPlainWindows: store.plain_windows is on unless set to false (the
// fastest path on Redis is the default), takes a bool only, and warns
// about nothing: on the memory store it does nothing.
func TestPlainWindows(t *testing.T) {
	for _, c := range []struct {
		store string
		want  bool
	}{
		{"store: {url: \"redis://127.0.0.1:6379\"}\n", true},
		{"store: {url: \"redis://127.0.0.1:6379\", plain_windows: true}\n", true},
		{"store: {url: \"redis://127.0.0.1:6379\", plain_windows: false}\n", false},
		{"store: {url: memory}\n", true},
		{"", true}, // no store section at all
	} {
		cfg, err := Parse("c.yaml", []byte("policies:\n  p: {limit: 5/s}\n"+c.store))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Store.PlainWindows != c.want {
			t.Errorf("%q: plain_windows %v, want %v", c.store, cfg.Store.PlainWindows, c.want)
		}
		if w := strings.Join(cfg.Warnings(), "\n"); strings.Contains(w, "store.plain_windows") {
			t.Errorf("%q: warning %q", c.store, w)
		}
	}
	if _, err := Parse("c.yaml", []byte("policies:\n  p: {limit: 5/s}\nstore: {plain_windows: often}\n")); err == nil {
		t.Error("plain_windows: often was accepted")
	}
}

// TestTrustedProxiesMapped: an IPv4-mapped IPv6 prefix in
// authz.trusted_proxies trusts the IPv4 addresses it maps (peers and
// forwarded addresses are compared unmapped); before, it trusted none, and
// every client behind such a proxy was keyed as the proxy.
func TestTrustedProxiesMapped(t *testing.T) {
	cfg, err := Parse("proxies.yaml", []byte(`
policies: {free: {limit: 10/min}}
authz:
  trusted_proxies: ["::ffff:10.0.0.0/104", "::ffff:192.0.2.1", "::FFFF:198.51.100.7/128", "2001:db8::/32", 10.1.2.3]
`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range cfg.Authz.TrustedProxies {
		got = append(got, p.String())
	}
	if want := []string{"10.0.0.0/8", "192.0.2.1/32", "198.51.100.7/32", "2001:db8::/32", "10.1.2.3/32"}; !slices.Equal(got, want) {
		t.Errorf("trusted proxies %q, want %q", got, want)
	}
	_, err = Parse("proxies.yaml", []byte(`
policies: {free: {limit: 10/min}}
authz:
  trusted_proxies: ["::ffff:0:0/80"]
`))
	if err == nil || !strings.Contains(err.Error(), `proxies.yaml:4: authz.trusted_proxies[0]: "::ffff:0:0/80" reaches past the IPv4-mapped addresses`) {
		t.Errorf("a prefix wider than the mapped addresses: %v", err)
	}
}

// An admin token short enough to guess is refused, with its file:line
// and a way to make a good one; none at all disables the admin endpoints.
func TestShortAdminTokenRefused(t *testing.T) {
	_, err := Parse("s.yaml", []byte("admin_token: s3cret\npolicies:\n  p: {limit: 1/s}\n"))
	if err == nil || !strings.Contains(err.Error(), "s.yaml:1") || !strings.Contains(err.Error(), "at least 16") {
		t.Fatalf("a 6-character admin token: %v", err)
	}
	for _, tok := range []string{`""`, "9b1f4c7e2a6d03b8e5f9a1c4"} {
		if _, err := Parse("s.yaml", []byte("admin_token: "+tok+"\npolicies:\n  p: {limit: 1/s}\n")); err != nil {
			t.Fatalf("admin_token %s: %v", tok, err)
		}
	}
}

// A sliding_window_log policy, or an override of one, above MaxLogRate is
// refused at load with its file:line: each decision reads and rewrites the
// whole log, and one hot key would stall the shared Redis.
func TestSlidingLogRateBounded(t *testing.T) {
	for _, y := range []string{
		"policies:\n  p: {algorithm: sliding_window_log, limit: 1000000/min}\n",
		"policies:\n  p: {algorithm: sliding_window_log, limit: 100/min}\noverrides:\n  - {key: k, policy: p, limit: 20000/min}\n",
	} {
		_, err := Parse("s.yaml", []byte(y))
		if err == nil || !strings.Contains(err.Error(), "s.yaml:") || !strings.Contains(err.Error(), "sliding_window_counter") {
			t.Errorf("%s: %v", y, err)
		}
	}
	for _, y := range []string{
		"policies:\n  p: {algorithm: sliding_window_log, limit: 10000/min}\n",
		"policies:\n  p: {algorithm: sliding_window_counter, limit: 1000000/min}\n",
	} {
		if _, err := Parse("s.yaml", []byte(y)); err != nil {
			t.Errorf("%s: %v", y, err)
		}
	}
}
