package server

import (
	"net/http"
	"strings"

	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/hostcheck"
)

// This file keeps DNS rebinding out (package hostcheck says how): a
// request whose Host is not one the service is known by (an IP address,
// localhost, the host of listen, this machine's and its Kubernetes
// Service's names, or the config's allowed_hosts, read at each request so
// that a reload applies) is refused with 403 before any handler reads or
// spends state, browser marks or not (hostRule says which requests).
//
// The forward-auth endpoint (/v1/authz) is not refused: proxies forward
// their clients' headers to it, browser's marks and all, some with the
// Host of the site. A request to it that a browser may have sent itself
// (fromBrowser) is charged as an untrusted peer's instead: its user
// header is not believed (authz.go).

// hostPolicy returns the names the service is known by, from the config
// of the moment.
func (s *Server) hostPolicy() *hostcheck.Policy {
	cfg := s.cfg.Load()
	if c := s.hostPol.Load(); c != nil && c.cfg == cfg {
		return c.policy
	}
	p := &hostcheck.Policy{Listen: []string{cfg.Listen}, Allowed: cfg.AllowedHosts, Own: s.ownHosts}
	s.hostPol.Store(&hostPolicy{cfg: cfg, policy: p})
	return p
}

// hostPolicy is the policy of one config, built once per config (a
// reload's config builds its own at its first request).
type hostPolicy struct {
	cfg    *config.Config
	policy *hostcheck.Policy
}

// hostGuard refuses, with 403, a request that hostRule checks and whose
// Host is not allowed, before next sees it.
func (s *Server) hostGuard(next http.Handler) http.Handler {
	return hostcheck.Guard(next, s.hostPolicy, hostRule, func(w http.ResponseWriter, r *http.Request) {
		s.m.Requests.WithLabelValues("other", "403").Inc()
		writeError(w, http.StatusForbidden, "%s", hostcheck.Message(r.Host, "allowed_hosts"))
	})
}

// hostRule: every request is checked by its Host, browser marks or not
// (the console, the admin endpoints, /v1/status, /metrics: a rebound
// page's GET may carry no mark), but
//   - /v1/authz, which decides itself (fromBrowser);
//   - POST /v1/check, which SDKs send with Hosts of their own, and whose
//     browser requests always carry Origin (hostcheck.ByMethod);
//   - the health probes, which read nothing.
func hostRule(r *http.Request) hostcheck.Check {
	switch {
	case isForwardAuth(r.URL.Path):
		return hostcheck.Skip
	case r.URL.Path == "/v1/check" && r.Method == http.MethodPost,
		r.URL.Path == "/healthz", r.URL.Path == "/readyz":
		return hostcheck.IfBrowser
	}
	return hostcheck.Always
}

// fromBrowser reports whether a forward-auth request may come from a
// browser rather than a proxy: it carries a browser's marks (Origin,
// Referer, Sec-Fetch-*), or its Host is not a name the service is known
// by (a rebound page's is its own). The documented proxies send their own
// Host (NGINX's proxy_pass, Traefik's address) and pass no browser header
// (authRequestHeaders, allowed_headers, proxy_pass_request_headers off).
func (s *Server) fromBrowser(r *http.Request) bool {
	return hostcheck.FromBrowser(r.Header) || !s.hostPolicy().Allows(r.Host)
}

// isForwardAuth reports whether path is /v1/authz or below it.
func isForwardAuth(path string) bool {
	return path == authzPath || strings.HasPrefix(path, authzPath+"/")
}
