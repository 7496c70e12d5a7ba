package server

import (
	"container/list"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/sluice-io/sluice/httplimit"
	"github.com/sluice-io/sluice/internal/config"
)

// This file authenticates operators. Each admin token has a name (the
// config's admin_tokens, stored as SHA-256 like API keys; admin_token and
// SLUICE_ADMIN_TOKEN are the tokens named "admin_token" and
// "SLUICE_ADMIN_TOKEN"), and audit lines say the name, never the token.
// A presented token is hashed and compared with every configured hash in
// constant time. Guessing is slowed per client: each wrong token puts its
// client in backoff (adminBackoffBase, doubling to adminBackoffCap), and
// while in backoff every token it presents, the right one too, is refused
// with 429 and Retry-After unread, so a guesser learns nothing faster. A
// right token whose form is weak (config.WeakToken: the config only holds
// hashes, so this is where a weak one is seen) is refused with 403.

// Bounds of the admin backoff.
const (
	// adminBackoffBase is the backoff after a client's first wrong token;
	// each further wrong one doubles it.
	adminBackoffBase = 500 * time.Millisecond
	// adminBackoffCap bounds the backoff: a guesser gets at most one
	// guess per adminBackoffCap from one client.
	adminBackoffCap = time.Minute
	// adminForget is how long after its last wrong token a client starts
	// over from adminBackoffBase.
	adminForget = 15 * time.Minute
	// maxAdminPeers bounds the clients remembered; past it the one that
	// failed longest ago is forgotten.
	maxAdminPeers = 4096
)

// adminVerdict is what checkAdmin found.
type adminVerdict int

const (
	adminNone    adminVerdict = iota // no bearer token
	adminOK                          // a configured token, strong
	adminWrong                       // no configured token
	adminBackoff                     // not read: the client is in backoff
	adminWeak                        // a configured token, weak
)

// adminTokens returns the admin tokens in force: the config's, with
// SLUICE_ADMIN_TOKEN's in place of admin_token's when it is set.
func (s *Server) adminTokens() []config.AdminToken {
	ts := s.cfg.Load().AdminTokens
	if s.admin == "" {
		return ts
	}
	out := make([]config.AdminToken, 0, len(ts)+1)
	out = append(out, config.AdminToken{Name: config.EnvAdminTokenName, Hash: s.adminHash})
	for _, t := range ts {
		if t.Name != config.LegacyAdminTokenName {
			out = append(out, t)
		}
	}
	return out
}

// adminEnabled reports whether any admin token is configured.
func (s *Server) adminEnabled() bool { return s.admin != "" || len(s.cfg.Load().AdminTokens) > 0 }

// checkAdmin reads r's bearer token against the admin tokens. It returns
// the token's name for adminOK and adminWeak, and how long the client
// must wait for adminBackoff and adminWrong.
func (s *Server) checkAdmin(r *http.Request) (string, adminVerdict, time.Duration) {
	got, ok := bearerToken(r.Header.Get("Authorization"))
	if !ok || got == "" {
		return "", adminNone, 0
	}
	// Compared as SHA-256 digests, of one length whatever was sent:
	// ConstantTimeCompare answers at once when the lengths differ, which
	// would tell a guesser the token's length. Every hash is compared.
	sum := sha256.Sum256([]byte(got))
	tokens := s.adminTokens()
	peer := s.adminPeer(r)
	now := s.clk.Now()
	name, wait, read := s.backoff.check(peer, now, func() string {
		match := ""
		for _, t := range tokens {
			if subtle.ConstantTimeCompare(sum[:], t.Hash[:]) == 1 {
				match = t.Name
			}
		}
		return match
	})
	switch {
	case !read:
		return "", adminBackoff, wait
	case name == "":
		return "", adminWrong, wait
	case config.WeakToken(got) != "":
		return name, adminWeak, 0
	}
	return name, adminOK, 0
}

// adminPeer keys r's client for the backoff: its address (from
// X-Forwarded-For when the peer is one of authz.trusted_proxies), an IPv6
// client by its /64, which one subscriber usually holds whole.
func (s *Server) adminPeer(r *http.Request) string {
	a, err := httplimit.ClientIP(r, s.cfg.Load().Authz.TrustedProxies)
	if err != nil {
		return r.RemoteAddr
	}
	return httplimit.IPBlockKey(a, 64)
}

// isAdmin reports whether r carries a good admin token. A wrong one
// counts towards its client's backoff, as on the admin endpoints: an
// endpoint that only reports whether the token is right would otherwise
// be an oracle free of it.
func (s *Server) isAdmin(r *http.Request) bool {
	_, v, _ := s.checkAdmin(r)
	return v == adminOK
}

// authorizeAdmin checks the request's bearer token against the admin
// tokens; on failure it writes the 403, 401 or 429 answer. what names the
// endpoint in the answer. It returns the token's name for the audit log.
func (s *Server) authorizeAdmin(w http.ResponseWriter, r *http.Request, what string) (string, bool) {
	if !s.adminEnabled() {
		writeError(w, http.StatusForbidden, "%s is disabled: set admin_tokens (or admin_token) in the config, or SLUICE_ADMIN_TOKEN", what)
		return "", false
	}
	name, v, wait := s.checkAdmin(r)
	switch v {
	case adminOK:
		return name, true
	case adminWeak:
		s.log.Warn("admin token refused: too weak", "endpoint", what, "by", name)
		writeError(w, http.StatusForbidden, "admin token %q is too weak (%s): replace it with one made by: %s", name, config.WeakToken(tokenOf(r)), config.MakeAdminToken)
		return "", false
	case adminBackoff:
		s.logRefusal(r, what)
		w.Header().Set("Retry-After", retryAfterSeconds(wait))
		writeError(w, http.StatusTooManyRequests, "%s: too many wrong admin tokens from this client; retry in %s (every token is refused until then)", what, wait.Round(time.Millisecond))
		return "", false
	}
	s.logRefusal(r, what)
	w.Header().Set("WWW-Authenticate", `Bearer realm="sluice admin"`)
	if wait > 0 {
		w.Header().Set("Retry-After", retryAfterSeconds(wait))
	}
	writeError(w, http.StatusUnauthorized, "%s needs Authorization: Bearer <admin token>", what)
	return "", false
}

// tokenOf returns r's bearer token.
func tokenOf(r *http.Request) string {
	t, _ := bearerToken(r.Header.Get("Authorization"))
	return t
}

// retryAfterSeconds is d in whole seconds, rounded up, at least 1.
func retryAfterSeconds(d time.Duration) string {
	return fmt.Sprint(max(1, int64((d+time.Second-1)/time.Second)))
}

// logRefusal logs a request refused for want of the admin token, at most
// once a second with the count of refusals since the last line, so that
// guessing the token shows in the log without flooding it. It names the
// endpoint (what) and the peer, never what the request presented.
func (s *Server) logRefusal(r *http.Request, what string) {
	now := s.clk.Now()
	f := &s.refusals
	f.Lock()
	f.count++
	if f.logged && now-f.last < int64(time.Second) {
		f.Unlock()
		return
	}
	n := f.count
	f.logged, f.last, f.count = true, now, 0
	f.Unlock()
	peer := "unknown"
	if a, err := peerAddr(r); err == nil {
		peer = a.String()
	}
	s.log.Warn("admin token refused", "endpoint", what, "peer", peer, "refused", n)
}

// adminBackoffs remembers the clients that sent wrong admin tokens, at
// most maxAdminPeers, least recently failed first out.
type adminBackoffs struct {
	mu    sync.Mutex
	peers map[string]*list.Element // of *peerBackoff
	lru   list.List                // front: most recent failure
}

// peerBackoff is one client's record.
type peerBackoff struct {
	key      string
	failures int
	last     int64 // Unix ns of the last wrong token
	until    int64 // Unix ns when the backoff ends
}

// backoffAfter is the backoff after n wrong tokens in a row.
func backoffAfter(n int) time.Duration {
	if n > 20 {
		return adminBackoffCap
	}
	return min(adminBackoffCap, adminBackoffBase<<(n-1))
}

// check runs compare unless peer is in backoff at now (read false, and
// wait is what is left of it). A wrong token (compare answers "") starts
// a longer backoff, and its wait is returned; a right one forgets the
// peer. It holds the lock
// through compare, so that concurrent requests from one client get one
// guess between backoffs, not one each.
func (b *adminBackoffs) check(peer string, now int64, compare func() string) (name string, wait time.Duration, read bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.peers[peer]
	var p *peerBackoff
	if e != nil {
		p = e.Value.(*peerBackoff)
		if now-p.last > int64(adminForget) {
			p.failures = 0
		}
		if now < p.until {
			return "", time.Duration(p.until - now), false
		}
	}
	if name = compare(); name != "" {
		if e != nil {
			b.lru.Remove(e)
			delete(b.peers, peer)
		}
		return name, 0, true
	}
	if e == nil {
		if b.peers == nil {
			b.peers = map[string]*list.Element{}
		}
		if len(b.peers) >= maxAdminPeers {
			old := b.lru.Back()
			b.lru.Remove(old)
			delete(b.peers, old.Value.(*peerBackoff).key)
		}
		p = &peerBackoff{key: peer}
		e = b.lru.PushFront(p)
		b.peers[peer] = e
	} else {
		b.lru.MoveToFront(e)
	}
	p.failures++
	p.last, p.until = now, now+int64(backoffAfter(p.failures))
	return "", time.Duration(p.until - now), true
}
