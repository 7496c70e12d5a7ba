package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/overrides"
	"github.com/sluice-io/sluice/redisstore"
)

// This file serves the runtime overrides (PUT/GET/DELETE /v1/overrides,
// package overrides) and applies them to decisions. The overrides apply to
// the policies of /v1/check, /v1/status and /v1/authz; precedence is in
// package overrides and docs/API.md.

// maxOverrideBody bounds the body of PUT /v1/overrides.
const maxOverrideBody = 4 << 10

// applyOverrides replaces the limits of targets that a runtime override
// covers. With no overrides it costs one atomic load.
func (s *Server) applyOverrides(targets []target) {
	set := s.ovr.Set()
	if set.Len() == 0 {
		return
	}
	cfg := s.cfg.Load()
	now := s.ovr.Now()
	for i := range targets {
		t := &targets[i]
		if o := set.Lookup(t.identity, keyNameOf(cfg, t.identity), t.policy.Name, now); o != nil {
			// Fitted as the config's overrides are; one that no longer
			// fits (a reload changed the policy's algorithm) is skipped
			// rather than failing every decision it matches.
			if l, problem := config.FitOverride(t.policy, o.Apply(t.base)); problem == "" {
				t.overrideLimit(l) // delay.go
			}
		}
	}
}

// keyNameOf is the configured name of the API key behind identity, or "".
func keyNameOf(cfg *config.Config, identity string) string {
	if h, ok := strings.CutPrefix(identity, "key:"); ok {
		if k := cfg.Keys[h]; k != nil {
			return k.Name
		}
	}
	return ""
}

// overrideBody is the body of PUT /v1/overrides.
type overrideBody struct {
	overrides.Override
	// TTL, such as "1h", sets Until to now + TTL.
	TTL string `json:"ttl"`
}

// overrideJSON is an override as the API answers it.
type overrideJSON struct {
	*overrides.Override
	Active bool `json:"active"`
}

func (s *Server) handlePutOverride(w http.ResponseWriter, r *http.Request) {
	by, ok := s.authorizeAdmin(w, r, "overrides")
	if !ok {
		return
	}
	var body overrideBody
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxOverrideBody))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "request body larger than %d bytes", maxOverrideBody)
		return
	}
	if err := checkText(raw); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "malformed JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
		return
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, "malformed JSON: data after the object")
		return
	}
	if body.By != "" || !body.At.IsZero() {
		writeError(w, http.StatusBadRequest, `"by" and "at" are set by the server`)
		return
	}
	var ttl time.Duration
	if body.TTL != "" {
		if ttl, err = time.ParseDuration(body.TTL); err != nil || ttl <= 0 {
			writeError(w, http.StatusBadRequest, "ttl %q must be a positive duration such as \"1h\"", body.TTL)
			return
		}
	}
	cfg := s.cfg.Load()
	exists := func(p string) bool { return cfg.Policies[p] != nil }
	if p := cfg.Policies[body.Policy]; p != nil {
		// A limit the policy's algorithm cannot enforce (a calendar limit
		// on a policy other than fixed_window, a sliding log past its
		// bound) would be skipped by every decision it matches: refused
		// here as in the config. A scale is checked on the policy's limit.
		l, err := p.Limit, error(nil)
		if body.Limit != "" {
			l, err = sluice.ParseLimit(body.Limit)
		} else {
			l = body.Override.Apply(l)
		}
		if err == nil {
			if _, problem := config.FitOverride(p, l); problem != "" {
				writeError(w, http.StatusBadRequest, "%s", problem)
				return
			}
		}
	}
	before, after, err := s.ovr.Put(r.Context(), by, body.Override, ttl, exists)
	if err != nil {
		s.writeOverrideError(w, err)
		return
	}
	status := http.StatusOK
	if before == nil {
		status = http.StatusCreated
	}
	b, _ := marshalJSON(map[string]any{"override": overrideJSON{&after, true}, "replaced": before, "shared": s.ovr.Shared()})
	writeJSON(w, status, b)
}

func (s *Server) handleDeleteOverride(w http.ResponseWriter, r *http.Request) {
	by, ok := s.authorizeAdmin(w, r, "overrides")
	if !ok {
		return
	}
	q := r.URL.Query()
	before, err := s.ovr.Delete(r.Context(), by, q.Get("identity"), q.Get("policy"))
	if err != nil {
		s.writeOverrideError(w, err)
		return
	}
	b, _ := marshalJSON(map[string]any{"deleted": before})
	writeJSON(w, http.StatusOK, b)
}

// handleListOverrides lists the overrides this instance applies; with
// ?identity=ID, those whose pattern matches ID (an identity such as
// "tenant:acme", "user:42" or "key_name:NAME").
func (s *Server) handleListOverrides(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.authorizeAdmin(w, r, "overrides"); !ok {
		return
	}
	if err := s.ovr.Refresh(r.Context(), false); err != nil {
		s.log.Warn("overrides: refresh for a listing failed; answering the last ones", "err", err)
	}
	id := r.URL.Query().Get("identity")
	if len(id) > config.MaxKeyLen {
		writeError(w, http.StatusBadRequest, "identity longer than %d bytes", config.MaxKeyLen)
		return
	}
	writeJSON(w, http.StatusOK, s.overridesJSON(id))
}

// overridesJSON answers the overrides matching identity (all when empty).
func (s *Server) overridesJSON(identity string) []byte {
	set := s.ovr.Set()
	list := set.All()
	if identity != "" {
		name, _ := strings.CutPrefix(identity, overrides.KeyNamePrefix)
		if name == identity {
			name = keyNameOf(s.cfg.Load(), identity)
		} else {
			identity = ""
		}
		list = set.Matching(identity, name)
	}
	now := s.ovr.Now()
	out := make([]overrideJSON, len(list))
	for i, o := range list {
		out[i] = overrideJSON{o, o.Active(now)}
	}
	b, _ := marshalJSON(map[string]any{"overrides": out, "shared": s.ovr.Shared(), "count": len(out)})
	return b
}

func (s *Server) writeOverrideError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, overrides.ErrInvalid):
		writeError(w, http.StatusBadRequest, "%s", strings.TrimPrefix(err.Error(), "overrides: invalid override: "))
	case errors.Is(err, overrides.ErrNotFound):
		writeError(w, http.StatusNotFound, "no such override")
	case errors.Is(err, overrides.ErrFull):
		writeError(w, http.StatusConflict, "%s", strings.TrimPrefix(err.Error(), "overrides: "))
	default:
		s.log.Warn("overrides: store failed", "err", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "overrides store unavailable; retry later")
	}
}

// overridesComponent follows the overrides of other replicas.
type overridesComponent struct{ m *overrides.Manager }

func (c overridesComponent) Name() string { return "overrides" }

func (c overridesComponent) Run(ctx context.Context) error { return c.m.Run(ctx) }

// newOverrides builds the overrides of a service on store: in Redis when
// the store is (found through Unwrap), so every replica shares them; in
// memory otherwise.
func newOverrides(store sluice.Store, clk clock.Clock, log *slog.Logger) (*overrides.Manager, error) {
	var b overrides.Backend = overrides.NewMemory()
	for s := store; s != nil; {
		if rs, ok := s.(*redisstore.Store); ok {
			b = overrides.NewRedis(rs.Client, "")
			break
		}
		u, ok := s.(interface{ Unwrap() sluice.Store })
		if !ok {
			break
		}
		s = u.Unwrap()
	}
	m, err := overrides.New(overrides.Options{Backend: b, Clock: clk, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	return m, nil
}
