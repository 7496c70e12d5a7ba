package server

import (
	"net/http"
	"strings"

	"github.com/sluice-io/sluice/internal/hostcheck"
)

// This file keeps DNS rebinding out (package hostcheck says how): a
// browser's request whose Host is not one the service is known by (an IP
// address, localhost, the host of listen, this machine's name, or the
// config's allowed_hosts, read at each request so that a reload applies)
// is refused with 403.
//
// The forward-auth endpoint (/v1/authz) is not checked: proxies forward
// their clients' headers to it, browser's marks and all, with the Host of
// the site; what a rebound page could do there (charge the browser's own
// identity) a plain cross-site request can do already.

// hostGuard refuses, with 403, a browser's request whose Host is not
// allowed, before next sees it.
func (s *Server) hostGuard(next http.Handler) http.Handler {
	own := hostcheck.OwnHosts()
	policy := func() *hostcheck.Policy {
		cfg := s.cfg.Load()
		return &hostcheck.Policy{Listen: []string{cfg.Listen}, Allowed: cfg.AllowedHosts, Own: own}
	}
	exempt := func(r *http.Request) bool { return isForwardAuth(r.URL.Path) }
	return hostcheck.Guard(next, policy, exempt, func(w http.ResponseWriter, r *http.Request) {
		s.m.Requests.WithLabelValues("other", "403").Inc()
		writeError(w, http.StatusForbidden, "%s", hostcheck.Message(r.Host, "allowed_hosts"))
	})
}

// isForwardAuth reports whether path is /v1/authz or below it.
func isForwardAuth(path string) bool {
	return path == authzPath || strings.HasPrefix(path, authzPath+"/")
}
