// Package hostcheck keeps DNS rebinding out of sluice's HTTP listeners.
//
// A page on evil.example whose name the attacker then points at sluice's
// address is, to the browser, same-origin with it: its requests carry
// Host: evil.example and an Origin equal to it, so they pass every
// cross-origin check. Such a page could read the console's API and
// /metrics, and spend anyone's limit. A request that a browser made (it
// carries Origin, Referer or a Sec-Fetch-* header) is therefore served
// only when its Host is one the listener is known by:
//
//   - an IP address (a page's origin is then the service itself: DNS is
//     not involved),
//   - localhost and *.localhost (browsers resolve those themselves),
//   - the host of a listen address and this machine's host name,
//   - the config's allowed_hosts, where "*.example.com" allows the
//     subdomains and "*" turns the check off.
//
// Clients that are not browsers (curl, SDKs, proxies with a Host of their
// own) send none of those headers and pass whatever their Host.
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

// Refused reports whether r is a browser's request whose Host p does not
// allow: one to refuse.
func (p *Policy) Refused(r *http.Request) bool {
	return FromBrowser(r.Header) && !p.Allows(r.Host)
}

// Message is the reason given with a refusal of a request to host, for a
// listener whose allowed names are set by the config field field (such as
// "allowed_hosts" or "gateway.allowed_hosts").
func Message(host, field string) string {
	return fmt.Sprintf("host %q is not allowed for a browser's request (DNS rebinding protection); if this is a name you reach sluice by, add it to %s in the config", Truncate(host, 100), field)
}

// Guard returns a handler that refuses, with refuse, a browser's request
// whose Host the policy of the moment (read at each request, so that a
// reload applies) does not allow, and hands every other request to next.
// exempt, when not nil, names requests that are never checked.
func Guard(next http.Handler, policy func() *Policy, exempt func(*http.Request) bool, refuse func(http.ResponseWriter, *http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if (exempt == nil || !exempt(r)) && FromBrowser(r.Header) && !policy().Allows(r.Host) {
			refuse(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// OwnHosts returns this machine's host name, short and long, lower case.
func OwnHosts() []string {
	name, err := os.Hostname()
	if err != nil || name == "" {
		return nil
	}
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	out := []string{name}
	if short, _, ok := strings.Cut(name, "."); ok {
		out = append(out, short)
	}
	return out
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
