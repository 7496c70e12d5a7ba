package server

import (
	"net/http"
	"net/netip"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/httplimit"
	"github.com/sluice-io/sluice/internal/config"
)

// selectionConfig is the config FuzzAuthz and FuzzResolve select in: tiers
// with shadow policies, looser selectable and routed policies, per-key and
// per-identity overrides. {UNKNOWN} and {DEFAULT} vary the unknown-key and
// default-tier settings.
const selectionConfig = `
policies:
  tight: {limit: 3/h}
  loose: {limit: 1000/h}
  shadow: {limit: 1/h, shadow: true}
  bigshadow: {limit: 1000000/h, shadow: true}
  login: {limit: 2/h}
  roomy: {limit: 100000/s}
  anon: {algorithm: token_bucket, limit: 1/min}
tiers:
  free: {policies: [tight, shadow]}
  ent: {policies: [loose]}
  anonymous: {policies: [anon]}
  shadowy: {policies: [bigshadow]}
keys:
  - {name: free, hash: ` + "{FREE}" + `, tier: free, overrides: {loose: 5000/h}}
  - {name: ent, hash: ` + "{ENT}" + `, tier: ent}
overrides:
  - {key: "user:vip", policy: anon, limit: 10/min}
  - {key: "user:vip", policy: roomy, limit: 1/h}
authz:
  user_header: X-User-ID
  trusted_proxies: [10.0.0.0/8, "::1"]
  {DEFAULT}
  {UNKNOWN}
  selectable_policies: [roomy, bigshadow, login]
  routes:
    - {path_prefix: /login, policies: [login, roomy]}
    - {path: /admin, methods: [POST], host: api.example.com, policies: [bigshadow]}
`

// selectionConfigs are selectionConfig with keys only, with a default
// tier, and with unknown keys on the default tier.
func selectionConfigs(tb testing.TB) []*config.Config {
	tb.Helper()
	var out []*config.Config
	for _, v := range [][2]string{
		{"", ""},
		{"default_tier: anonymous", ""},
		{"default_tier: anonymous", "unknown_keys: default_tier"},
	} {
		doc := strings.NewReplacer("{FREE}", sluice.HashKey("k-free"), "{ENT}", sluice.HashKey("k-ent"), "{DEFAULT}", v[0], "{UNKNOWN}", v[1]).Replace(selectionConfig)
		cfg, err := config.Parse("selection.yaml", []byte(doc))
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, cfg)
	}
	return out
}

// boundTier returns the tier and key an identity's own limit comes from.
func boundTier(t *testing.T, cfg *config.Config, identity string) (*config.Tier, *config.Key) {
	t.Helper()
	if hash, ok := strings.CutPrefix(identity, "key:"); ok {
		if k := cfg.Keys[hash]; k != nil {
			return k.Tier, k
		}
		if cfg.Authz.RejectUnknownKeys || cfg.Authz.DefaultTier == nil {
			t.Fatalf("unknown key %s admitted though unknown keys are rejected", identity)
		}
		return cfg.Authz.DefaultTier, nil
	}
	if cfg.Authz.DefaultTier == nil {
		t.Fatalf("identity %q without a key admitted though there is no default tier", identity)
	}
	return cfg.Authz.DefaultTier, nil
}

// assertNoLooser fails unless targets charge every policy of the tier
// bound to their identity, with that identity's limit and the same store
// key, and add only policies the config lets a request add.
func assertNoLooser(t *testing.T, cfg *config.Config, targets []target, extra func(*config.Policy) bool) {
	t.Helper()
	if len(targets) == 0 {
		t.Fatal("no targets")
	}
	id := targets[0].identity
	if id == "" || len(id) > config.MaxKeyLen {
		t.Fatalf("identity %q", id)
	}
	tier, key := boundTier(t, cfg, id)
	seen := map[string]bool{}
	for _, tg := range targets {
		if tg.identity != id {
			t.Fatalf("targets for %q and %q", id, tg.identity)
		}
		if seen[tg.req.Key] {
			t.Fatalf("store key %q twice", tg.req.Key)
		}
		seen[tg.req.Key] = true
		if tg.req.Key != storeKey(id, tg.policy) || tg.req.Algorithm != tg.policy.Algorithm {
			t.Fatalf("target %+v is not policy %s of %q", tg.req, tg.policy.Name, id)
		}
		if want := cfg.LimitFor(tg.policy, id, key); tg.req.Limit != want {
			t.Fatalf("policy %s: limit %s, want %s", tg.policy.Name, tg.req.Limit, want)
		}
		if tg.req.Cost < 1 || tg.req.Cost != targets[0].req.Cost {
			t.Fatalf("cost %d (first %d)", tg.req.Cost, targets[0].req.Cost)
		}
		if !slices.Contains(tier.Policies, tg.policy) && !extra(tg.policy) {
			t.Fatalf("policy %s added though no rule allows it", tg.policy.Name)
		}
	}
	for _, p := range tier.Policies {
		if !seen[storeKey(id, p)] {
			t.Fatalf("identity %q of tier %s escaped its policy %s", id, tier.Name, p.Name)
		}
	}
	if targets[0].tier != tier.Name {
		t.Fatalf("reported tier %s, bound tier %s", targets[0].tier, tier.Name)
	}
}

// routedOrSelectable reports whether a forward-auth request may add p.
func routedOrSelectable(cfg *config.Config) func(*config.Policy) bool {
	return func(p *config.Policy) bool {
		if cfg.Authz.Selectable[p.Name] == p {
			return true
		}
		for _, r := range cfg.Authz.Routes {
			if slices.Contains(r.Policies, p) {
				return true
			}
		}
		return false
	}
}

// FuzzAuthz holds forward-auth policy selection to its rule: whatever the
// method, path, query, peer, Host and headers, a request is charged every
// policy of the tier bound to its caller with the caller's limits, adds
// only routed or selectable policies, and a client that is not a trusted
// proxy cannot name its user or address.
func FuzzAuthz(f *testing.F) {
	cfgs := selectionConfigs(f)
	for _, s := range [][5]string{
		{"GET", "/v1/authz", "10.0.0.1:5", "sluice", "X-API-Key: k-free"},
		{"GET", "/v1/authz?tier=ent", "10.0.0.1:5", "sluice", "X-API-Key: k-free"},
		{"GET", "/v1/authz?policy=roomy&policy=bigshadow&cost=2", "10.0.0.1:5", "sluice", "Authorization: bearer k-free"},
		{"POST", "/v1/authz/login?policy=loose", "10.0.0.1:5", "api.example.com", "X-API-Key: k-ent"},
		{"GET", "/v1/authz", "10.0.0.1:5", "sluice", "X-Forwarded-Uri: /Login\nX-Original-URI: /x\nX-Forwarded-Method: post\nX-Forwarded-Host: api.example.com"},
		{"GET", "/v1/authz", "203.0.113.1:5", "sluice", "X-User-ID: vip\nX-Forwarded-For: 1.2.3.4"},
		{"GET", "/v1/authz", "10.0.0.1:5", "sluice", "X-User-ID: vip"},
		{"GET", "/v1/authz", "[::1]:5", "sluice", "X-Forwarded-For: 2001:db8::1, 10.1.1.1"},
		{"GET", "/v1/authz?policy=login", "10.0.0.1:5", "sluice", "X-API-Key: k-other"},
		{"GET", "/v1/authz", "10.0.0.1:5", "sluice", "X-API-Key: k-free\nX-API-Key: k-ent"},
		{"GET", "/v1/authz", "[::1%lo]:5", "sluice", "X-Forwarded-For: [2001:db8::1]:443\nX-API-Key: k-other\nAuthorization: Bearer k-free"},
		{"POST", "/v1/authz/items?_method=DELETE", "10.0.0.1:5", "sluice", "X-HTTP-Method-Override: delete\nX-Original-URI: //h/log%C4%B1n"},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4])
	}
	f.Fuzz(func(t *testing.T, method, target, remote, host, headers string) {
		u, err := url.ParseRequestURI(target)
		if err != nil {
			return
		}
		r := &http.Request{Method: method, URL: u, Header: http.Header{}, RemoteAddr: remote, Host: host}
		for line := range strings.SplitSeq(headers, "\n") {
			if name, val, ok := strings.Cut(line, ":"); ok {
				r.Header.Add(textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(name)), strings.TrimSpace(val))
			}
		}
		for _, cfg := range cfgs {
			targets, status, err := authzTargets(cfg, r, false)
			if err != nil {
				if status < 400 || status > 499 {
					t.Fatalf("error %v with status %d", err, status)
				}
				continue
			}
			assertNoLooser(t, cfg, targets, routedOrSelectable(cfg))
			id := targets[0].identity
			peer, perr := netip.ParseAddrPort(remote)
			if perr != nil || strings.HasPrefix(id, "key:") {
				continue
			}
			if !isTrusted(peer.Addr().Unmap().WithZone(""), cfg.Authz.TrustedProxies) && id != "ip:"+httplimit.IPKey(peer.Addr()) {
				t.Fatalf("untrusted peer %s is keyed as %q", remote, id)
			}
		}
	})
}

// FuzzResolve holds /v1/check and /v1/status to the same rule: a check
// with an api_key is charged every policy of the key's tier, with the
// key's limits, whatever policy, tier or cost it names beside it.
func FuzzResolve(f *testing.F) {
	cfgs := selectionConfigs(f)
	f.Add("", "", "", "k-free", int64(1))
	f.Add("roomy", "", "", "k-free", int64(2))
	f.Add("", "ent", "", "k-free", int64(1))
	f.Add("", "shadowy", "", "k-ent", int64(1))
	f.Add("bigshadow", "", "", "k-other", int64(0))
	f.Add("loose", "", "key:x", "", int64(-1))
	f.Fuzz(func(t *testing.T, policy, tier, key, apiKey string, cost int64) {
		for _, cfg := range cfgs {
			c := checkItem{Policy: policy, Tier: tier, Key: key, APIKey: apiKey, Cost: &cost}
			targets, status, err := resolve(cfg, &c, addToKey)
			if err != nil {
				if status < 400 || status > 499 {
					t.Fatalf("error %v with status %d", err, status)
				}
				continue
			}
			if cost < 0 {
				t.Fatalf("negative cost %d resolved", cost)
			}
			if apiKey == "" {
				continue // a key has no tier of its own
			}
			if cost == 0 {
				continue // a peek; handleCheck refuses cost 0
			}
			assertNoLooser(t, cfg, targets, func(p *config.Policy) bool {
				return p.Name == policy || (cfg.Tiers[tier] != nil && slices.Contains(cfg.Tiers[tier].Policies, p))
			})
		}
	})
}

// TestRoutePolicies shows which original requests a route matches.
func TestRoutePolicies(t *testing.T) {
	cfg := selectionConfigs(t)[1]
	for _, c := range []struct {
		target  string
		method  string
		headers []string
		want    []string
	}{
		{"/v1/authz", "GET", nil, nil},
		{"/v1/authz", "GET", []string{"X-Forwarded-Uri", "/login"}, []string{"login", "roomy"}},
		{"/v1/authz", "GET", []string{"X-Original-URI", "/LOGIN/../login?x=1"}, []string{"login", "roomy"}},
		{"/v1/authz", "GET", []string{"X-Forwarded-Uri", "/%4cogin"}, []string{"login", "roomy"}},
		{"/v1/authz", "GET", []string{"X-Forwarded-Uri", "/logout"}, nil},
		{"/v1/authz/login/x", "GET", nil, []string{"login", "roomy"}},
		{"/v1/authz", "GET", []string{"X-Forwarded-Uri", "/admin", "X-Forwarded-Method", "POST", "X-Forwarded-Host", "api.example.com"}, []string{"bigshadow"}},
		{"/v1/authz", "POST", []string{"X-Forwarded-Uri", "/admin", "X-Forwarded-Host", "api.example.com"}, nil}, // the proxy's own method
		{"/v1/authz/admin", "POST", []string{"X-Forwarded-Host", "api.example.com:8443"}, []string{"bigshadow"}},
		{"/v1/authz", "GET", []string{"X-Forwarded-Uri", "/admin", "X-Forwarded-Method", "POST", "X-Forwarded-Host", "other.example"}, nil},
	} {
		r := &http.Request{Method: c.method, URL: &url.URL{Path: c.target}, Header: http.Header{}, Host: "sluice:8080"}
		if p, err := url.PathUnescape(c.target); err == nil {
			r.URL.Path = p
		}
		for i := 0; i+1 < len(c.headers); i += 2 {
			r.Header.Add(c.headers[i], c.headers[i+1])
		}
		ps, err := routePolicies(cfg.Authz.Routes, r)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, p := range ps {
			got = append(got, p.Name)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s %s %q: %v, want %v", c.method, c.target, c.headers, got, c.want)
		}
	}
	r := &http.Request{Method: "GET", URL: &url.URL{Path: "/v1/authz"}, Header: http.Header{}}
	for range maxForwardedValues + 1 {
		r.Header.Add("X-Forwarded-Uri", "/x")
	}
	if _, err := routePolicies(cfg.Authz.Routes, r); err == nil {
		t.Error("unbounded X-Forwarded-Uri values accepted")
	}
}

// TestAuthzBounds: the counts a forward-auth request controls are bounded.
func TestAuthzBounds(t *testing.T) {
	cfg := selectionConfigs(t)[1]
	for _, c := range []struct {
		name   string
		target string
		hdr    []string
		n      int
	}{
		{"policies", "/v1/authz?" + strings.Repeat("policy=login&", maxSelected+1), nil, 0},
		{"URIs", "/v1/authz", []string{"X-Original-URI", "/x"}, maxForwardedValues + 1},
		{"methods", "/v1/authz", []string{"X-Forwarded-Method", "GET, POST"}, maxForwardedValues/2 + 1},
		{"hosts", "/v1/authz", []string{"X-Forwarded-Host", "a.example"}, maxForwardedValues + 1},
	} {
		u, _ := url.ParseRequestURI(c.target)
		r := &http.Request{Method: "GET", URL: u, Header: http.Header{}, RemoteAddr: "10.0.0.1:1"}
		r.Header.Set("X-API-Key", "k-free")
		for range c.n {
			r.Header.Add(c.hdr[0], c.hdr[1])
		}
		if _, status, err := authzTargets(cfg, r, false); err == nil || status != http.StatusBadRequest {
			t.Errorf("%s over the bound: %d %v", c.name, status, err)
		}
		// One fewer is within it.
		if c.n > 0 {
			r.Header.Del(c.hdr[0])
			for range c.n - 1 {
				r.Header.Add(c.hdr[0], c.hdr[1])
			}
		} else {
			r.URL, _ = url.ParseRequestURI("/v1/authz?" + strings.Repeat("policy=login&", maxSelected))
		}
		if _, _, err := authzTargets(cfg, r, false); err != nil {
			t.Errorf("%s within the bound: %v", c.name, err)
		}
	}
}
