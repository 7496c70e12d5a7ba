// Package hostcheck keeps DNS rebinding out of sluice's HTTP listeners.
//
// A page on evil.example whose name the attacker then points at sluice's
// address is, to the browser, same-origin with it: its requests carry
// Host: evil.example, so they pass every cross-origin check. Such a page
// could read the console's API, /v1/status and /metrics, and spend
// anyone's limit. A browser need not mark such a request: Chromium sends
// no Origin, Referer or Sec-Fetch-* header on a same-origin GET over plain
// http from a page whose referrer policy is no-referrer. So a listener
// decides by the Host alone for every request that could read state (each
// listener says which, with a Rule), browser marks or not, and serves it
// only when its Host is one the listener is known by:
//
//   - an IP address, v4 or v6 (a page's origin is then the address
//     itself: a rebinding needs a DNS name the attacker controls),
//   - localhost and *.localhost (browsers resolve those themselves),
//   - the host of a listen address and this machine's host name,
//   - the Kubernetes Service names the chart gives the pod (KubeNames:
//     <svc>, <svc>.<ns>, <svc>.<ns>.svc, <svc>.<ns>.svc.cluster.local),
//   - the config's allowed_hosts, where "*.example.com" allows the
//     subdomains and "*" turns the check off.
//
// Requests whose method is neither GET nor HEAD may be checked only when
// they carry a browser's marks (IfBrowser): a browser adds Origin to every
// such request (the Fetch standard, "append a request Origin header"; "null"
// under no-referrer), and clients that are not browsers (SDKs posting
// /v1/check, proxies with a Host of their own) then pass whatever their
// Host.
package hostcheck

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
)

// MaxAllowed bounds allowed_hosts.
const MaxAllowed = 256

// ErrEntry means an allowed_hosts entry is malformed.
var ErrEntry = errors.New("want a host name (no port, no scheme), *.domain, an IP address, or *")

// Policy is what a listener is known by, beyond IP addresses and
// localhost.
type Policy struct {
	// Listen are listen addresses ("host:port"); their hosts are allowed.
	Listen []string
	// Allowed are allowed_hosts entries, normalized by Normalize.
	Allowed []string
	// Own are this machine's names (OwnHosts).
	Own []string
}

// Allows reports whether the Host header host names the listener, as the
// package comment says.
func (p *Policy) Allows(host string) bool {
	name := HostName(host)
	if name == "" {
		return false
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return true
	}
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	for _, l := range p.Listen {
		if h, _, err := net.SplitHostPort(l); err == nil && strings.EqualFold(strings.TrimSuffix(h, "."), name) {
			return true
		}
	}
	for _, o := range p.Own {
		if o == name {
			return true
		}
	}
	for _, a := range p.Allowed {
		switch {
		case a == "*" || a == name:
			return true
		case strings.HasPrefix(a, "*.") && strings.HasSuffix(name, a[1:]):
			return true
		}
	}
	return false
}

// FromBrowser reports whether h carries what browsers add to the requests
// of pages: Origin, Referer or a Fetch Metadata header (Sec-Fetch-Site,
// -Mode, -Dest, -User).
func FromBrowser(h http.Header) bool {
	if len(h["Origin"]) > 0 || len(h["Referer"]) > 0 {
		return true
	}
	for name := range h {
		if strings.HasPrefix(name, "Sec-Fetch-") {
			return true
		}
	}
	return false
}

// Check is how Guard treats a request.
type Check uint8

const (
	// Always checks the Host whatever the request carries: every read of
	// state, since a browser may send a GET with no mark at all.
	Always Check = iota
	// IfBrowser checks the Host only when the request carries a browser's
	// marks (FromBrowser): for requests a browser always marks (any method
	// but GET and HEAD carries Origin) that other clients send with Hosts
	// of their own.
	IfBrowser
	// Skip never checks: the handler decides (forward auth).
	Skip
)

// ByMethod is the rule of a listener whose every GET or HEAD may read
// state: those are checked Always, other methods IfBrowser, since a
// browser adds Origin to every request whose method is neither GET nor
// HEAD (the Fetch standard, "append a request Origin header").
func ByMethod(r *http.Request) Check {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return Always
	}
	return IfBrowser
}

// Refused reports whether r is a request to refuse under rule: one whose
// Host p does not allow and that rule checks.
func (p *Policy) Refused(r *http.Request, rule Check) bool {
	switch rule {
	case Skip:
		return false
	case IfBrowser:
		if !FromBrowser(r.Header) {
			return false
		}
	}
	return !p.Allows(r.Host)
}

// Message is the reason given with a refusal of a request to host, for a
// listener whose allowed names are set by the config field field (such as
// "allowed_hosts" or "gateway.allowed_hosts").
func Message(host, field string) string {
	return fmt.Sprintf("host %q is not allowed (DNS rebinding protection); if this is a name you reach sluice by, add it to %s in the config", Truncate(host, 100), field)
}

// Guard returns a handler that refuses, with refuse, a request that rule
// checks (nil: every request, Always) and whose Host the policy of the
// moment (read at each request, so that a reload applies) does not allow,
// and hands every other request to next.
func Guard(next http.Handler, policy func() *Policy, rule func(*http.Request) Check, refuse func(http.ResponseWriter, *http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := Always
		if rule != nil {
			c = rule(r)
		}
		// The policy (built per request, from the config of the moment)
		// only when the rule checks this request at all.
		if (c == Always || (c == IfBrowser && FromBrowser(r.Header))) && !policy().Allows(r.Host) {
			refuse(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Environment variables the Helm chart and deploy/kubernetes set from the
// pod's Service and namespace (the downward API), for KubeNames.
const (
	EnvService   = "SLUICE_K8S_SERVICE"
	EnvNamespace = "SLUICE_K8S_NAMESPACE"
	// EnvClusterDomain overrides the cluster's DNS domain, cluster.local.
	EnvClusterDomain = "SLUICE_K8S_CLUSTER_DOMAIN"
)

// OwnHosts returns the names this process is known by without any
// config: this machine's host name, short and long (in Kubernetes, the
// pod's name), and the Kubernetes Service names of KubeNames read from
// the environment, lower case.
func OwnHosts() []string {
	var out []string
	if name, err := os.Hostname(); err == nil && name != "" {
		name = strings.ToLower(strings.TrimSuffix(name, "."))
		out = append(out, name)
		if short, _, ok := strings.Cut(name, "."); ok {
			out = append(out, short)
		}
	}
	return append(out, KubeNames(os.Getenv(EnvService), os.Getenv(EnvNamespace), os.Getenv(EnvClusterDomain))...)
}

// KubeNames returns the names a Kubernetes Service svc in namespace ns
// answers to in the cluster's DNS (domain "" is cluster.local): svc (from
// its own namespace), svc.ns, svc.ns.svc and svc.ns.svc.domain. Nothing
// when svc is empty or either is not a DNS label; svc alone when ns is
// empty.
func KubeNames(svc, ns, domain string) []string {
	svc, ns = strings.ToLower(svc), strings.ToLower(ns)
	domain = strings.ToLower(strings.Trim(domain, "."))
	if domain == "" {
		domain = "cluster.local"
	}
	if !isLabel(svc) {
		return nil
	}
	if !isLabel(ns) {
		return []string{svc}
	}
	if _, err := Normalize(domain); err != nil || strings.HasPrefix(domain, "*") {
		domain = "cluster.local"
	}
	return []string{svc, svc + "." + ns, svc + "." + ns + ".svc", svc + "." + ns + ".svc." + domain}
}

// isLabel reports whether s is one DNS label (RFC 1123: letters, digits
// and hyphens, 1 to 63 of them).
func isLabel(s string) bool {
	return s != "" && len(s) <= 63 && strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789-") == ""
}

// HostName returns the host of a Host header, lower case, without port,
// brackets or a trailing dot; "" when it is malformed.
func HostName(host string) string {
	h := host
	if strings.HasPrefix(h, "[") {
		end := strings.IndexByte(h, ']')
		if end < 0 {
			return ""
		}
		h = h[1:end]
	} else if i := strings.LastIndexByte(h, ':'); i >= 0 {
		if strings.Count(h, ":") > 1 {
			return "" // an IPv6 address needs brackets in Host
		}
		h = h[:i]
	}
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Unmap().String()
	}
	return h
}

// Normalize normalizes an allowed_hosts entry: a host name (lower case,
// without a trailing dot), "*." and a domain (its subdomains), an IP
// address, or "*" (every host: the check is off). A malformed entry's
// error wraps ErrEntry.
func Normalize(h string) (string, error) {
	h = strings.ToLower(strings.TrimSpace(h))
	if h == "*" {
		return h, nil
	}
	h = strings.TrimSuffix(h, ".") // "*." is no "*"
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")); err == nil {
		return a.Unmap().String(), nil
	}
	name := strings.TrimPrefix(h, "*.")
	if name == "" || len(name) > 253 {
		return "", ErrEntry
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 || strings.Trim(label, "abcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
			return "", ErrEntry
		}
	}
	return h, nil
}

// Truncate shortens s to at most n bytes for an error message.
func Truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
