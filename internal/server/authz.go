package server

import (
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/httplimit"
)

// handleAuthz is the forward-auth endpoint for NGINX auth_request, Traefik
// ForwardAuth, Caddy forward_auth and Envoy ext_authz (HTTP). It derives the
// caller from the request's headers, charges one request (or ?cost=N) to the
// caller's tier (or ?tier= / ?policy=), and answers 200, or the deny status
// with Retry-After, always with the rate-limit headers.
//
// The caller is, in order: an API key from the configured headers (keyed by
// its hash, limited by its tier); a user id from the user header; the client
// IP, from X-Forwarded-For when the peer is a trusted proxy. The last two
// get the default tier.
func (s *Server) handleAuthz(w http.ResponseWriter, r *http.Request) {
	cfg := s.cfg.Load()
	q := r.URL.Query()
	item := checkItem{Policy: q.Get("policy"), Tier: q.Get("tier")}
	if v := q.Get("cost"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			writeError(w, http.StatusBadRequest, "cost %q must be a whole number, 1 or more", v)
			return
		}
		item.Cost = &n
	}
	if key := apiKeyFrom(r.Header, cfg.Authz.APIKeyHeaders); key != "" {
		item.APIKey = key
	} else {
		if cfg.Authz.UserHeader != "" {
			if u := r.Header.Get(cfg.Authz.UserHeader); u != "" {
				item.Key = "user:" + u
			}
		}
		if item.Key == "" {
			ip, err := httplimit.ClientIP(r, cfg.Authz.TrustedProxies)
			if err != nil {
				writeError(w, http.StatusBadRequest, "cannot tell the client address")
				return
			}
			item.Key = ipIdentity(ip)
		}
		if item.Policy == "" && item.Tier == "" {
			if cfg.Authz.DefaultTier == nil {
				w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
				writeError(w, http.StatusUnauthorized, "an API key is required")
				return
			}
			item.Tier = cfg.Authz.DefaultTier.Name
		}
	}
	targets, status, err := resolve(cfg, &item, nil)
	if err != nil {
		if status == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
		}
		writeError(w, status, "%v", err)
		return
	}
	res, err := s.decide(r, sluice.OpAllow, targets)
	if err != nil {
		writeDecideError(w, err)
		return
	}
	h := w.Header()
	h.Set("X-Sluice-Tier", targets[0].tier)
	h.Set("X-Sluice-Identity", targets[0].identity)
	s.writeDecision(w, res, cfg.Authz.DenyStatus, true)
}

// apiKeyFrom returns the first API key found in the headers, stripping a
// "Bearer " prefix.
func apiKeyFrom(h http.Header, names []string) string {
	for _, name := range names {
		v := strings.TrimSpace(h.Get(name))
		if v == "" {
			continue
		}
		if rest, ok := cutPrefixFold(v, "Bearer "); ok {
			v = strings.TrimSpace(rest)
		} else if strings.EqualFold(name, "Authorization") {
			continue // Basic and other schemes carry no API key
		}
		if v != "" {
			return v
		}
	}
	return ""
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix) {
		return s[len(prefix):], true
	}
	return s, false
}

// ipIdentity keys IPv4 clients by address and IPv6 clients by their /64,
// the block one subscriber usually holds.
func ipIdentity(a netip.Addr) string {
	if a.Is6() {
		p, _ := a.Prefix(64)
		return "ip:" + p.String()
	}
	return "ip:" + a.String()
}
