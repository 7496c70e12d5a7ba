package server

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strings"
	"sync"
	"time"
)

// This file keeps the console's data for operators. The page's JSON API
// (/ui/api/*, but the simulator, which reads no state) answers an admin:
// a request with the admin token, or with the cookie of an admin session,
// which POST /ui/api/session makes of the token. The cookie is HttpOnly
// (the page's scripts never see it), SameSite=Strict (no other site's
// page or link sends it), Path=/ui, Secure on TLS, and bound to the Host
// it was issued for: a session made at 127.0.0.1:8080 is not one at
// localhost:8080, nor at another port of the same host (cookies are not
// bound to ports). It expires after sessionTTL; at most maxSessions are
// held, in memory (a replica's sessions are its own: behind a load
// balancer, sign in again or use sticky sessions). console.public_read
// serves the data to anyone who reaches the listener, as before; override
// reasons and authors stay an admin's.

// Bounds of the console's sessions.
const (
	// sessionCookie names the cookie.
	sessionCookie = "sluice_console"
	// sessionTTL is how long a session lasts from its sign-in.
	sessionTTL = 8 * time.Hour
	// maxSessions bounds the sessions held; past it a sign-in drops the
	// expired ones, then the one closest to expiry.
	maxSessions = 1024
)

// consoleSession is one admin session.
type consoleSession struct {
	name    string // the admin token's name, for the audit log
	host    string // the Host it was issued for, lower case
	expires int64  // the server clock's nanoseconds
}

// consoleSessions holds the sessions by the SHA-256 of their cookie value
// (a memory dump holds no usable cookie).
type consoleSessions struct {
	mu sync.Mutex
	m  map[[sha256.Size]byte]consoleSession
}

func (ss *consoleSessions) add(id [sha256.Size]byte, s consoleSession, now int64) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.m == nil {
		ss.m = map[[sha256.Size]byte]consoleSession{}
	}
	if len(ss.m) >= maxSessions {
		for k, v := range ss.m {
			if v.expires <= now {
				delete(ss.m, k)
			}
		}
	}
	for len(ss.m) >= maxSessions {
		var oldest [sha256.Size]byte
		first := true
		for k, v := range ss.m {
			if first || v.expires < ss.m[oldest].expires {
				oldest, first = k, false
			}
		}
		delete(ss.m, oldest)
	}
	ss.m[id] = s
}

// get returns the session of id for host at now.
func (ss *consoleSessions) get(id [sha256.Size]byte, host string, now int64) (consoleSession, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s, ok := ss.m[id]
	switch {
	case !ok:
		return s, false
	case s.expires <= now:
		delete(ss.m, id)
		return s, false
	case s.host != strings.ToLower(host):
		return s, false
	}
	return s, true
}

func (ss *consoleSessions) remove(id [sha256.Size]byte) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.m, id)
}

// sessionID returns the key of r's session cookie.
func sessionID(r *http.Request) ([sha256.Size]byte, bool) {
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" || len(c.Value) > 128 {
		return [sha256.Size]byte{}, false
	}
	return sha256.Sum256([]byte(c.Value)), true
}

// consoleAdmin reports whether r is an admin's: an admin session's
// cookie for its Host, or the admin token (a wrong one counts towards
// the client's backoff, as on the admin endpoints).
func (s *Server) consoleAdmin(r *http.Request) bool {
	if _, ok := s.session(r); ok {
		return true
	}
	return s.isAdmin(r)
}

// session returns r's admin session, if it has one for its Host.
func (s *Server) session(r *http.Request) (consoleSession, bool) {
	id, ok := sessionID(r)
	if !ok {
		return consoleSession{}, false
	}
	return s.sessions.get(id, r.Host, s.clk.Now())
}

// authorizeConsole is authorizeAdmin for the console's own endpoints,
// where an admin session stands for the token.
func (s *Server) authorizeConsole(w http.ResponseWriter, r *http.Request, what string) (string, bool) {
	if sess, ok := s.session(r); ok {
		return sess.name, true
	}
	return s.authorizeAdmin(w, r, what)
}

// consoleRead serves h, which reads the console's data, to an admin, or
// to anyone under console.public_read; else 401.
func (s *Server) consoleRead(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if cc := consoleOf(s.cfg.Load()); (cc != nil && cc.PublicRead) || s.consoleAdmin(r) {
			h(w, r)
			return
		}
		if !s.adminEnabled() {
			writeError(w, http.StatusForbidden, "the console's data needs an admin session, and no admin token is configured: set admin_tokens (or SLUICE_ADMIN_TOKEN), or console.public_read: true to show it to whoever reaches this listener")
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="sluice admin"`)
		writeError(w, http.StatusUnauthorized, "the console's data needs an admin session: sign in with the admin token (POST /ui/api/session with Authorization: Bearer <admin token>)")
	}
}

// handleSessionStart exchanges the admin token for a session cookie.
func (s *Server) handleSessionStart(w http.ResponseWriter, r *http.Request) {
	name, ok := s.authorizeAdmin(w, r, "the console's sign-in")
	if !ok {
		return
	}
	var raw [32]byte
	_, _ = rand.Read(raw[:]) // crypto/rand.Read never fails (Go 1.24)
	value := base64.RawURLEncoding.EncodeToString(raw[:])
	now := s.clk.Now()
	s.sessions.add(sha256.Sum256([]byte(value)), consoleSession{name: name, host: strings.ToLower(r.Host), expires: now + int64(sessionTTL)}, now)
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: value, Path: "/ui",
		MaxAge: int(sessionTTL / time.Second), HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
	s.log.Info("console session started", "by", name)
	writeAny(w, map[string]any{"admin": true, "by": name, "expires_in_s": int64(sessionTTL / time.Second)})
}

// handleSessionEnd ends r's session and clears its cookie.
func (s *Server) handleSessionEnd(w http.ResponseWriter, r *http.Request) {
	if id, ok := sessionID(r); ok {
		s.sessions.remove(id)
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/ui", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	w.WriteHeader(http.StatusNoContent)
}
