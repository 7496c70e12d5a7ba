package server

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/httplimit"
	"github.com/sluice-io/sluice/internal/config"
)

// Bounds on what a forward-auth request may carry.
const (
	// maxForwardedValues bounds the values of each of the original URI,
	// method and host headers (all their lines and comma-separated parts
	// together); a request with more gets 400.
	maxForwardedValues = 16
	// maxSelected bounds the ?policy= parameters of one request.
	maxSelected = 16
	// authzPath is the forward-auth endpoint; a path below it (Envoy's
	// ext_authz path_prefix) carries the original request's path.
	authzPath = "/v1/authz"
)

// handleAuthz is the forward-auth endpoint for NGINX auth_request, Traefik
// ForwardAuth, Caddy forward_auth and Envoy ext_authz (HTTP). It derives the
// caller from the request's headers, charges one request (or ?cost=N) to the
// caller's tier, plus the policies of the matching authz.routes and of
// ?policy= (from authz.selectable_policies), and answers 200, or the deny
// status with Retry-After, always with the rate-limit headers.
func (s *Server) handleAuthz(w http.ResponseWriter, r *http.Request) {
	cfg := s.cfg.Load()
	targets, status, err := authzTargets(cfg, r, s.fromBrowser(r))
	if err != nil {
		if status == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
		}
		writeError(w, status, "%v", err)
		return
	}
	release := s.waitSlot(cfg, targets)
	defer release()
	res, err := s.decide(r, sluice.OpAllow, targets)
	if err != nil {
		s.writeDecideError(w, err)
		return
	}
	if !s.hold(w, r, res) {
		return
	}
	h := w.Header()
	h.Set("X-Sluice-Tier", targets[0].tier)
	h.Set("X-Sluice-Identity", targets[0].identity)
	setDecidedBy(h, res) // regions.go
	s.writeDecision(w, res, cfg.Authz.DenyStatus, true)
}

// authzTargets selects what a forward-auth request is charged. The caller
// is, in order: an API key from the configured headers (keyed by its hash,
// limited by its tier); a user id from the user header, when the peer is a
// trusted proxy and the request is not one a browser may have sent
// itself (browser: see fromBrowser); the client IP, from X-Forwarded-For
// when the peer is a trusted proxy. The last two get the default tier.
//
// The caller's tier is always charged whole. The request can only add to
// it: the policies of the authz.routes its original URI, method and host
// match, and ?policy= names from authz.selectable_policies. So no request
// is limited more loosely than its caller, whatever it carries (FuzzAuthz
// holds this). The query is read only on /v1/authz itself: below it, as
// Envoy's path_prefix sends, it is the client's own.
func authzTargets(cfg *config.Config, r *http.Request, browser bool) ([]target, int, error) {
	a := &cfg.Authz
	cost := int64(1)
	var selected []*config.Policy
	if r.URL.Path == authzPath && r.URL.RawQuery != "" {
		q, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			return nil, http.StatusBadRequest, fmt.Errorf("malformed query: %w", err)
		}
		if _, ok := q["tier"]; ok {
			return nil, http.StatusBadRequest, errors.New("?tier= is not accepted: the tier is the caller's (its API key's, else authz.default_tier); add limits with authz.routes or ?policy= from authz.selectable_policies")
		}
		if vs := q["cost"]; len(vs) > 0 {
			n, err := strconv.ParseInt(vs[0], 10, 64)
			if len(vs) > 1 || err != nil || n < 1 {
				return nil, http.StatusBadRequest, fmt.Errorf("cost %q must be one whole number, 1 or more", strings.Join(vs, ","))
			}
			cost = n
		}
		if vs := q["policy"]; len(vs) > 0 {
			if len(vs) > maxSelected {
				return nil, http.StatusBadRequest, fmt.Errorf("%d policies; at most %d", len(vs), maxSelected)
			}
			for _, name := range vs {
				p := a.Selectable[name]
				if p == nil {
					return nil, http.StatusBadRequest, fmt.Errorf("policy %q is not selectable; valid: %s", name, selectableNames(a))
				}
				selected = append(selected, p)
			}
		}
	}

	var identity string
	var tier *config.Tier
	var apiKey *config.Key
	keys, err := apiKeysFrom(r.Header, a.APIKeyHeaders)
	if err != nil {
		return nil, http.StatusBadRequest, err
	}
	if len(keys) > 0 {
		hash := sluice.HashKey(keys[0].key)
		identity = "key:" + hash
		apiKey = cfg.Keys[hash]
		switch {
		case apiKey != nil && len(keys) > 1:
			// Two keys sluice knows: the upstream may check the other
			// one and serve the request as its owner, while sluice
			// charged this one. A known key beside one sluice does not
			// know (a session token in Authorization) is charged.
			for _, o := range keys[1:] {
				if cfg.Keys[sluice.HashKey(o.key)] != nil {
					return nil, http.StatusBadRequest, fmt.Errorf("two different valid API keys, in %s and %s: send one key", keys[0].header, o.header)
				}
			}
			tier = apiKey.Tier
		case apiKey != nil:
			tier = apiKey.Tier
		case a.RejectUnknownKeys || a.DefaultTier == nil:
			return nil, http.StatusUnauthorized, errors.New("unknown api key")
		case len(keys) > 1:
			// An unknown key is its own identity (unknown_keys:
			// default_tier), trusted because the upstream checks keys;
			// but the upstream may check the other header, and a client
			// could then send a fresh key here with each request.
			return nil, http.StatusBadRequest, fmt.Errorf("an unknown API key beside a different one in %s: send one key", keys[1].header)
		default:
			tier = a.DefaultTier
		}
	} else {
		peer, err := peerAddr(r)
		if err != nil {
			return nil, http.StatusBadRequest, errors.New("cannot tell the client address")
		}
		// A page on a trusted proxy's own machine (127.0.0.1), its name
		// rebound to sluice, sends what it likes: the user header is a
		// proxy's word only on a request no browser sent itself.
		if a.UserHeader != "" && !browser && isTrusted(peer, a.TrustedProxies) {
			u, err := singleValue(r.Header, a.UserHeader)
			if err != nil {
				return nil, http.StatusBadRequest, err
			}
			if u != "" {
				identity = "user:" + u
			}
		}
		if identity == "" {
			ip, err := httplimit.ClientIP(r, a.TrustedProxies)
			if err != nil {
				return nil, http.StatusBadRequest, errors.New("cannot tell the client address")
			}
			identity = ipIdentity(ip, a.IPv6Prefix)
		}
		if a.DefaultTier == nil {
			return nil, http.StatusUnauthorized, errors.New("an API key is required")
		}
		tier = a.DefaultTier
	}
	if len(identity) > config.MaxKeyLen {
		return nil, http.StatusBadRequest, fmt.Errorf("key longer than %d bytes", config.MaxKeyLen)
	}

	policies := tier.Policies
	if len(a.Routes) > 0 {
		added, err := routePolicies(a.Routes, r)
		if err != nil {
			return nil, http.StatusBadRequest, err
		}
		policies = addPolicies(policies, added)
	}
	policies = addPolicies(policies, selected)
	out := make([]target, len(policies))
	for i, p := range policies {
		out[i] = newTarget(cfg, p, tier.Name, identity, apiKey, cost)
	}
	return out, 0, nil
}

// addPolicies returns base with the policies of extra it lacks appended;
// base itself is never modified.
func addPolicies(base, extra []*config.Policy) []*config.Policy {
	out := base
	for _, p := range extra {
		if slices.Contains(out, p) {
			continue
		}
		if len(out) == len(base) {
			out = slices.Clip(base)
		}
		out = append(out, p)
	}
	return out
}

func selectableNames(a *config.Authz) string {
	if len(a.Selectable) == 0 {
		return "none (authz.selectable_policies is empty)"
	}
	names := make([]string, 0, len(a.Selectable))
	for n := range a.Selectable {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// routePolicies returns the policies of the routes the original request
// matches. The original URI, method and host are whatever the proxies
// forward: X-Forwarded-Uri and X-Original-URI (Traefik, Caddy, NGINX), the
// path below /v1/authz/ (Envoy), X-Forwarded-Method and X-Original-Method,
// or the method itself below /v1/authz/, X-Forwarded-Host and the Host;
// and the methods the upstream may serve the request as instead
// (methodOverrideHeaders, ?_method= in the original URI).
// A route applies when any of these values matches it, so a client that
// adds a header of its own can only add routes, never escape one the proxy
// reports.
func routePolicies(routes []config.Route, r *http.Request) ([]*config.Policy, error) {
	below, isBelow := strings.CutPrefix(r.URL.EscapedPath(), authzPath+"/")
	var uris []string
	if isBelow {
		uris = append(uris, "/"+below)
	}
	uris = append(uris, r.Header.Values("X-Forwarded-Uri")...)
	uris = append(uris, r.Header.Values("X-Original-Uri")...)
	if len(uris) > maxForwardedValues {
		return nil, fmt.Errorf("%d original URIs; at most %d", len(uris), maxForwardedValues)
	}
	var paths []string
	for _, u := range uris {
		paths = append(paths, config.NormalizePath(u)...)
	}
	var methods []string
	if isBelow {
		methods = append(methods, r.Method)
		methods = appendMethodParams(methods, r.URL.RawQuery)
	}
	methods = appendValues(methods, r.Header, "X-Forwarded-Method")
	methods = appendValues(methods, r.Header, "X-Original-Method")
	for _, name := range methodOverrideHeaders {
		methods = appendValues(methods, r.Header, name)
	}
	for _, u := range uris {
		if _, q, ok := strings.Cut(u, "?"); ok {
			methods = appendMethodParams(methods, q)
		}
	}
	hosts := []string{config.NormalizeHost(r.Host)}
	for _, h := range appendValues(nil, r.Header, "X-Forwarded-Host") {
		hosts = append(hosts, config.NormalizeHost(h))
	}
	if len(methods) > maxForwardedValues || len(hosts) > maxForwardedValues+1 {
		return nil, fmt.Errorf("more than %d original methods or hosts", maxForwardedValues)
	}
	var out []*config.Policy
	for i := range routes {
		rt := &routes[i]
		if rt.Path != "" || rt.PathPrefix != "" {
			if !slices.ContainsFunc(paths, rt.MatchPath) {
				continue
			}
		}
		if len(rt.Methods) > 0 && !slices.ContainsFunc(methods, rt.MatchMethod) {
			continue
		}
		if rt.Host != "" && !slices.Contains(hosts, rt.Host) {
			continue
		}
		out = addPolicies(out, rt.Policies)
	}
	return out, nil
}

// methodOverrideHeaders carry the method a POST stands for, as Rails
// (Rack::MethodOverride), Symfony and Laravel, ASP.NET Core's
// UseHttpMethodOverride and Express's method-override read them: the
// upstream serves a POST with "X-HTTP-Method-Override: DELETE" as a
// DELETE, so a route for DELETE must apply to it.
var methodOverrideHeaders = []string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// appendMethodParams appends the values of the _method parameters of the
// query q (Laravel, and Rails and Symfony for forms, read the method of a
// POST from it), unescaped, empty ones left out.
func appendMethodParams(dst []string, q string) []string {
	q, _, _ = strings.Cut(q, "#")
	for part := range strings.SplitSeq(q, "&") {
		k, v, _ := strings.Cut(part, "=")
		if k, err := url.QueryUnescape(k); err != nil || k != "_method" {
			continue
		}
		if v, err := url.QueryUnescape(v); err == nil && strings.TrimSpace(v) != "" {
			dst = append(dst, strings.TrimSpace(v))
		}
	}
	return dst
}

// appendValues appends the comma-separated parts of every line of header
// name, trimmed, empty ones left out.
func appendValues(dst []string, h http.Header, name string) []string {
	for _, line := range h.Values(name) {
		for part := range strings.SplitSeq(line, ",") {
			if part = strings.TrimSpace(part); part != "" {
				dst = append(dst, part)
			}
		}
	}
	return dst
}

// singleValue returns the value of header name; several different values
// are an error, since the proxy and sluice might each read another.
func singleValue(h http.Header, name string) (string, error) {
	vs := h.Values(name)
	for _, v := range vs[min(1, len(vs)):] {
		if v != vs[0] {
			return "", fmt.Errorf("several different %s headers", name)
		}
	}
	if len(vs) == 0 {
		return "", nil
	}
	return vs[0], nil
}

// sentKey is an API key a request carries and the header it is in.
type sentKey struct {
	header, key string
}

// apiKeysFrom returns the different API keys the headers carry, each with
// the first header that carries it, in the order of names: the first is
// the request's key. "Authorization" carries one only with the Bearer
// scheme (in any case, RFC 9110); in the other headers a Bearer scheme is
// removed too. Several lines of one header with different keys are an
// error: the proxy and sluice might each read another.
func apiKeysFrom(h http.Header, names []string) ([]sentKey, error) {
	var out []sentKey
	for _, name := range names {
		k, err := headerKey(h, name)
		if err != nil {
			return nil, err
		}
		if k != "" && !slices.ContainsFunc(out, func(s sentKey) bool { return s.key == k }) {
			out = append(out, sentKey{name, k})
		}
	}
	return out, nil
}

// headerKey returns the API key that header name carries, or "".
func headerKey(h http.Header, name string) (string, error) {
	key := ""
	for _, v := range h.Values(name) {
		k, isBearer := bearerToken(v)
		if !isBearer {
			if strings.EqualFold(name, "Authorization") {
				continue // Basic and other schemes carry no API key
			}
			k = trimKey(v)
		}
		if k == "" {
			continue
		}
		if key != "" && k != key {
			return "", fmt.Errorf("several different API keys in %s headers", name)
		}
		key = k
	}
	return key, nil
}

// bearerToken returns the credentials of a header value in the Bearer
// scheme, whose name is case-insensitive (RFC 9110, section 11.1), and
// whether the value is in that scheme at all.
func bearerToken(v string) (string, bool) {
	v = strings.TrimLeft(v, " \t")
	const scheme = "Bearer"
	if len(v) < len(scheme) || !strings.EqualFold(v[:len(scheme)], scheme) {
		return "", false
	}
	rest := v[len(scheme):]
	if rest != "" && rest[0] != ' ' && rest[0] != '\t' {
		return "", false // another scheme, such as "Bearerx"
	}
	return trimKey(rest), true
}

// trimKey removes the white space around an API key: Unicode's (as Go's
// strings.TrimSpace, .NET's Trim and Python's strip have it) and U+FEFF
// (which JavaScript's trim removes too). An upstream that checks keys
// after trimming so accepts "K\u00a0" as K; unless sluice trims as much,
// under unknown_keys: default_tier each such spelling would be a fresh
// key with a fresh limit. Keys hold no white space of their own.
func trimKey(s string) string {
	return strings.TrimFunc(s, func(r rune) bool { return unicode.IsSpace(r) || r == '\uFEFF' })
}

// peerAddr returns the address of the connection's peer.
func peerAddr(r *http.Request) (netip.Addr, error) {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err == nil {
		return ap.Addr().Unmap().WithZone(""), nil // a zoned address is in no prefix
	}
	a, err := netip.ParseAddr(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("server: remote address %q: %w", r.RemoteAddr, err)
	}
	return a.Unmap().WithZone(""), nil
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ipIdentity keys IPv4 clients by address and IPv6 clients by their
// block of v6bits (authz.ipv6_prefix, 64 by default: the block one
// subscriber usually holds).
func ipIdentity(a netip.Addr, v6bits int) string {
	return "ip:" + httplimit.IPBlockKey(a, v6bits)
}
