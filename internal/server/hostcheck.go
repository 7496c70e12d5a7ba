package server

import (
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"

	"github.com/sluice-io/sluice/internal/config"
)

// This file keeps DNS rebinding out. A page on evil.example whose name
// the attacker then points at the service's address is, to the browser,
// same-origin with it: its requests carry Host: evil.example and pass the
// cross-origin check (sameOrigin), so it could read the console's API and
// /metrics and spend anyone's limit with POST /v1/check. A request that a
// browser made (it carries Origin, Referer or a Sec-Fetch-* header) is
// served only when its Host is one the service is known by:
//
//   - an IP address (a page's origin is then the service itself: DNS is
//     not involved),
//   - localhost and *.localhost (browsers resolve those themselves),
//   - the host of the listen address and this machine's host name,
//   - the config's allowed_hosts (read at each request: a reload applies),
//     where "*.example.com" allows the subdomains and "*" turns the check
//     off.
//
// Clients that are not browsers (curl, SDKs, proxies with a Host of their
// own) send none of those headers and pass whatever their Host. The
// forward-auth endpoint (/v1/authz) is not checked: proxies forward their
// clients' headers to it, browser's marks and all, with the Host of the
// site; what a rebound page could do there (charge the browser's own
// identity) a plain cross-site request can do already.

// hostGuard refuses, with 403, a browser's request whose Host is not
// allowed, before next sees it.
func (s *Server) hostGuard(next http.Handler) http.Handler {
	own := ownHosts()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !isForwardAuth(r.URL.Path) && fromBrowser(r.Header) {
			cfg := s.cfg.Load()
			if !hostAllowed(r.Host, cfg, own) {
				s.m.Requests.WithLabelValues("other", "403").Inc()
				writeError(w, http.StatusForbidden, "host %q is not allowed for a browser's request (DNS rebinding protection); if this is a name you reach sluice by, add it to allowed_hosts in the config", truncate(r.Host, 100))
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// isForwardAuth reports whether path is /v1/authz or below it.
func isForwardAuth(path string) bool {
	return path == authzPath || strings.HasPrefix(path, authzPath+"/")
}

// fromBrowser reports whether h carries what browsers add to the requests
// of pages: Origin, Referer or a Fetch Metadata header (Sec-Fetch-Site,
// -Mode, -Dest, -User).
func fromBrowser(h http.Header) bool {
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

// ownHosts returns this machine's host name, short and long, lower case.
func ownHosts() []string {
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

// hostAllowed reports whether the Host header host names the service, as
// the comment at the top of this file says.
func hostAllowed(host string, cfg *config.Config, own []string) bool {
	name := hostName(host)
	if name == "" {
		return false
	}
	if _, err := netip.ParseAddr(name); err == nil {
		return true
	}
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	if l, _, err := net.SplitHostPort(cfg.Listen); err == nil && strings.EqualFold(strings.TrimSuffix(l, "."), name) {
		return true
	}
	for _, o := range own {
		if o == name {
			return true
		}
	}
	for _, a := range cfg.AllowedHosts {
		switch {
		case a == "*" || a == name:
			return true
		case strings.HasPrefix(a, "*.") && strings.HasSuffix(name, a[1:]):
			return true
		}
	}
	return false
}

// hostName returns the host of a Host header, lower case, without port,
// brackets or a trailing dot; "" when it is malformed.
func hostName(host string) string {
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

// truncate shortens s to at most n bytes for an error message.
func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
