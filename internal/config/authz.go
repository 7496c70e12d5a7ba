package config

import (
	"fmt"
	"net/netip"
	"path"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/sluice-io/sluice/internal/yamlconf"
)

// Bounds of the authz section.
const (
	// MaxRoutes bounds authz.routes.
	MaxRoutes = 1000
)

var (
	unknownKeyModes = []string{"reject", "default_tier"}
	methodRE        = regexp.MustCompile(`^[A-Za-z]{1,32}$`)
	hostRE          = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$`)
)

// Authz is the compiled forward-auth section.
//
// The limit of a forward-auth request is bound to its caller: an API key's
// tier, or the default tier for a user id or a client address. Nothing the
// request carries replaces it. Routes and selectable policies can only add
// policies on top of it, so whatever a request matches or names, it is
// limited at least as tightly as its caller.
type Authz struct {
	// APIKeyHeaders are tried in order.
	APIKeyHeaders []string
	// UserHeader carries a user id set by a trusted proxy; empty disables
	// it. It is believed only from a peer in TrustedProxies.
	UserHeader string
	// TrustedProxies may set X-Forwarded-For and UserHeader.
	TrustedProxies []netip.Prefix
	// DefaultTier applies to callers without a known API key; nil means such
	// callers are rejected.
	DefaultTier *Tier
	// RejectUnknownKeys answers 401 to API keys that are not configured.
	RejectUnknownKeys bool
	// DenyStatus is the status of a denial.
	DenyStatus int
	// Routes add policies to requests whose original URI, method and host
	// (as the proxy forwards them) match.
	Routes []Route
	// Selectable are the policies a request may add with ?policy=NAME, by
	// name.
	Selectable map[string]*Policy
	// IPv6Prefix is the length of the IPv6 block keyed as one client.
	IPv6Prefix int
}

// Route is a compiled entry of authz.routes: the policies it adds to the
// caller's tier for the original requests it matches. An empty matcher
// matches anything; a route has at least one that is not empty.
type Route struct {
	// Path is an exact path, normalized by NormalizePath; empty matches
	// any.
	Path string
	// PathPrefix is a prefix of the normalized path; empty matches any.
	PathPrefix string
	// Methods are upper-case methods; empty matches any.
	Methods []string
	// Host is a host normalized by NormalizeHost; empty matches any.
	Host string
	// Policies are added to the caller's tier.
	Policies []*Policy
}

// MatchPath reports whether the normalized path p matches the route's
// path matchers.
func (r *Route) MatchPath(p string) bool {
	if r.Path != "" && p != r.Path {
		return false
	}
	return r.PathPrefix == "" || strings.HasPrefix(p, r.PathPrefix)
}

// MatchMethod reports whether method (any case) is one of the route's.
func (r *Route) MatchMethod(method string) bool {
	if len(r.Methods) == 0 {
		return true
	}
	for _, m := range r.Methods {
		if strings.EqualFold(m, method) {
			return true
		}
	}
	return false
}

// NormalizePath returns the forms of an original request's URI (a path, or
// a whole request target such as "http://h/a/b?q") that routes are matched
// against: the path without query, fragment, scheme and authority;
// with '\' read as '/' and ";params" removed from each segment, lower-case
// (foldCase), cleaned of "//", "." and ".." (path.Clean), once without percent-decoding
// and once fully decoded. Matching every form errs towards applying a route:
// a caller cannot step around it by spelling its path the way only the
// upstream reads as the same.
func NormalizePath(uri string) []string {
	if i := strings.IndexAny(uri, "?#"); i >= 0 {
		uri = uri[:i]
	}
	if i := strings.Index(uri, "://"); i >= 0 && !strings.Contains(uri[:i], "/") {
		uri = afterAuthority(uri[i+3:])
	}
	forms := pathForms(nil, uri)
	if len(uri) >= 2 && (uri[0] == '/' || uri[0] == '\\') && (uri[1] == '/' || uri[1] == '\\') {
		// "//host/login" (or "/\host/login"): a backend that resolves the
		// request target against a base URL, as WHATWG URL does (Node's
		// docs: new URL(req.url, base)), reads "host" as an authority
		// and serves /login.
		forms = pathForms(forms, afterAuthority(uri[2:]))
	}
	return forms
}

// afterAuthority returns the path after the authority that starts rest,
// "/" when there is none.
func afterAuthority(rest string) string {
	if j := strings.IndexAny(rest, `/\`); j >= 0 {
		return rest[j:]
	}
	return "/"
}

// pathForms appends to forms the forms of the path uri that it lacks:
// cleaned as it is, and cleaned after percent-decoding (up to three
// times).
func pathForms(forms []string, uri string) []string {
	add := func(p string) {
		if !slices.Contains(forms, p) {
			forms = append(forms, p)
		}
	}
	add(cleanPath(uri))
	dec := uri
	for range 3 {
		next := percentDecode(dec)
		if next == dec {
			break
		}
		dec = next
	}
	if dec != uri {
		add(cleanPath(dec))
	}
	return forms
}

func cleanPath(p string) string {
	p = strings.ReplaceAll(p, `\`, "/")
	if strings.IndexByte(p, ';') >= 0 {
		segs := strings.Split(p, "/")
		for i, s := range segs {
			if j := strings.IndexByte(s, ';'); j >= 0 {
				segs[i] = s[:j]
			}
		}
		p = strings.Join(segs, "/")
	}
	return path.Clean("/" + foldCase(p))
}

// foldCase lower-cases s. Outside ASCII it upper-cases first, so that
// letters whose upper case is an ASCII letter meet it: "ı" (dotless i) and
// "ſ" (long s) are "I" and "S" to a backend that compares paths
// case-insensitively by upper case (.NET's OrdinalIgnoreCase, Java's
// equalsIgnoreCase), so "/logın" must meet a "/login" route.
func foldCase(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return strings.ToLower(strings.ToUpper(s))
		}
	}
	return strings.ToLower(s)
}

// percentDecode decodes the valid %XX escapes of s and keeps the rest.
func percentDecode(s string) string {
	if strings.IndexByte(s, '%') < 0 {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
			continue
		}
		b = append(b, s[i])
	}
	return string(b)
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// NormalizeHost returns host lower-case, without port, brackets or a
// trailing dot.
func NormalizeHost(host string) string {
	host = strings.TrimSpace(host)
	if strings.HasPrefix(host, "[") {
		if i := strings.IndexByte(host, ']'); i >= 0 {
			host = host[1:i]
		}
	} else if i := strings.LastIndexByte(host, ':'); i >= 0 && strings.Count(host, ":") == 1 {
		host = host[:i]
	}
	return strings.TrimSuffix(strings.ToLower(host), ".")
}

func (v *validator) compileAuthz(a *AuthzSection, cfg *Config, tierNames []string) {
	out := Authz{APIKeyHeaders: a.APIKeyHeaders, UserHeader: a.UserHeader, DenyStatus: a.DenyStatus, IPv6Prefix: a.IPv6Prefix}
	switch {
	case out.IPv6Prefix == 0:
		out.IPv6Prefix = 64
	case out.IPv6Prefix < 32 || out.IPv6Prefix > 64:
		v.addf("authz.ipv6_prefix", "%d is not in 32..64: an IPv6 client is keyed by the block of that many leading bits", a.IPv6Prefix)
	}
	if len(out.APIKeyHeaders) == 0 {
		out.APIKeyHeaders = []string{"X-API-Key", "Authorization"}
	}
	for i, p := range a.TrustedProxies {
		pfx, err := netip.ParsePrefix(p)
		if err != nil {
			addr, aerr := netip.ParseAddr(p)
			if aerr != nil {
				v.addf(fmt.Sprintf("authz.trusted_proxies[%d]", i), "%q is neither a CIDR nor an IP address", p)
				continue
			}
			pfx = netip.PrefixFrom(addr, addr.BitLen())
		}
		if a := pfx.Addr(); a.Is4In6() {
			// Peers and forwarded addresses are compared unmapped, and an
			// IPv4 address is in no IPv6 prefix: "::ffff:10.0.0.0/104"
			// would trust no proxy, and key every client as its proxy.
			if pfx.Bits() < 96 {
				v.addf(fmt.Sprintf("authz.trusted_proxies[%d]", i), "%q reaches past the IPv4-mapped addresses; give IPv4 and IPv6 prefixes apart", p)
				continue
			}
			pfx = netip.PrefixFrom(a.Unmap(), pfx.Bits()-96)
		}
		out.TrustedProxies = append(out.TrustedProxies, pfx.Masked())
	}
	if a.UserHeader != "" && len(a.TrustedProxies) == 0 {
		v.addf("authz.user_header", "needs authz.trusted_proxies: the user id is believed only from a trusted proxy, else any client could name itself a fresh user")
	}
	if a.DefaultTier != "" {
		t, ok := cfg.Tiers[a.DefaultTier]
		if !ok {
			v.addf("authz.default_tier", "unknown tier %q; %s", a.DefaultTier, yamlconf.Valid("tiers", tierNames))
		}
		out.DefaultTier = t
	}
	switch a.UnknownKeys {
	case "", "reject":
		out.RejectUnknownKeys = true
	case "default_tier":
		if a.DefaultTier == "" {
			v.addf("authz.unknown_keys", "default_tier needs authz.default_tier to be set")
		}
	default:
		v.addf("authz.unknown_keys", "unknown mode %q; valid: %s", a.UnknownKeys, strings.Join(unknownKeyModes, ", "))
	}
	switch out.DenyStatus {
	case 0:
		out.DenyStatus = 429
	case 429, 403, 401, 503:
	default:
		v.addf("authz.deny_status", "%d; valid: 429, 403, 401, 503", out.DenyStatus)
	}
	policyNames := cfg.PolicyNames()
	for i, name := range a.SelectablePolicies {
		path := fmt.Sprintf("authz.selectable_policies[%d]", i)
		p, ok := cfg.Policies[name]
		switch {
		case !ok:
			v.addf(path, "unknown policy %q; %s", name, yamlconf.Valid("policies", policyNames))
		case out.Selectable[name] != nil:
			v.addf(path, "policy %q listed twice", name)
		default:
			if out.Selectable == nil {
				out.Selectable = map[string]*Policy{}
			}
			out.Selectable[name] = p
		}
	}
	if len(a.Routes) > MaxRoutes {
		v.addf("authz.routes", "%d routes; at most %d", len(a.Routes), MaxRoutes)
	}
	for i, rs := range a.Routes {
		if r, ok := v.compileRoute(fmt.Sprintf("authz.routes[%d]", i), rs, cfg, policyNames); ok {
			out.Routes = append(out.Routes, r)
		}
	}
	cfg.Authz = out
}

func (v *validator) compileRoute(at string, rs RouteSection, cfg *Config, policyNames []string) (Route, bool) {
	var r Route
	ok := true
	bad := func(field, format string, args ...any) {
		v.addf(at+field, format, args...)
		ok = false
	}
	if rs.Path == "" && rs.PathPrefix == "" && len(rs.Methods) == 0 && rs.Host == "" {
		bad("", "a route needs path, path_prefix, methods or host")
	}
	if rs.Path != "" && rs.PathPrefix != "" {
		bad(".path", "give path or path_prefix, not both")
	}
	for _, fp := range [2][2]string{{".path", rs.Path}, {".path_prefix", rs.PathPrefix}} {
		field, p := fp[0], fp[1]
		if p == "" {
			continue
		}
		if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "?#") {
			bad(field, "%q must be a path starting with '/', without query or fragment", p)
			continue
		}
		forms := pathForms(nil, p)
		norm := forms[len(forms)-1] // decoded
		if field == ".path" {
			r.Path = norm
		} else {
			r.PathPrefix = norm
		}
	}
	for j, m := range rs.Methods {
		if !methodRE.MatchString(m) {
			bad(fmt.Sprintf(".methods[%d]", j), "%q is not an HTTP method", m)
			continue
		}
		r.Methods = append(r.Methods, strings.ToUpper(m))
	}
	if rs.Host != "" {
		h := NormalizeHost(rs.Host)
		if !hostRE.MatchString(h) {
			bad(".host", "%q is not a host name", rs.Host)
		}
		r.Host = h
	}
	if len(rs.Policies) == 0 {
		bad(".policies", "a route adds at least one policy; %s", yamlconf.Valid("policies", policyNames))
	}
	seen := map[string]bool{}
	for j, name := range rs.Policies {
		p, found := cfg.Policies[name]
		switch {
		case !found:
			bad(fmt.Sprintf(".policies[%d]", j), "unknown policy %q; %s", name, yamlconf.Valid("policies", policyNames))
		case seen[name]:
			bad(fmt.Sprintf(".policies[%d]", j), "policy %q listed twice", name)
		default:
			r.Policies = append(r.Policies, p)
		}
		seen[name] = true
	}
	return r, ok
}
