package server

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// This file serves the console's view of the AI gateway's spend
// (GET /ui/api/spend, admin token): every dollar budget of its keys, teams
// and orgs against what its window has spent. The gateway's budgets live
// in its store under keys that only its config maps to names, so the view
// is served where the gateway runs inside `sluice serve` (a gateway:
// section): the same process, the same store. A gateway run on its own
// (`sluice gateway`) has no console; its spend shows per key on its
// GET /v1/status and fleet-wide in its metrics.

// SpendFunc reads the gateway's spend; its answer is written as JSON.
type SpendFunc func(ctx context.Context) (any, error)

// spendReuse is how long one read of the spend serves the console's
// callers: a read peeks every client's budgets, a store call each.
const spendReuse = 5 * time.Second

// gatewaySource is one of the gateway's views, read at most once a reuse
// whatever the number of consoles polling it.
type gatewaySource struct {
	mu    sync.Mutex
	read  SpendFunc
	reuse time.Duration
	at    time.Time
	last  any
}

// set gives the source its reader.
func (g *gatewaySource) set(f SpendFunc, reuse time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.read, g.reuse, g.last = f, reuse, nil
}

// serve answers the view (what names it in the log and the errors), read
// anew when the last read is older than reuse.
func (g *gatewaySource) serve(s *Server, w http.ResponseWriter, r *http.Request, what string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.read == nil {
		writeError(w, http.StatusNotFound, "no gateway runs in this process: the %s view needs a gateway: section in this config", what)
		return
	}
	now := time.Now()
	if g.last == nil || now.Sub(g.at) >= g.reuse || now.Before(g.at) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		v, err := g.read(ctx)
		cancel()
		if err != nil {
			s.log.Warn("console: reading the gateway's "+what, "err", err)
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable, "the store cannot be read now")
			return
		}
		g.last, g.at = v, now
	}
	writeAny(w, g.last)
}

// SetGatewaySpend gives the console the gateway's spend; `sluice serve`
// calls it (through Deps) when its config runs the gateway.
func (s *Server) SetGatewaySpend(f SpendFunc) { s.spend.set(f, spendReuse) }

func (s *Server) handleSpend(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.authorizeConsole(w, r, "spend"); !ok {
		return
	}
	s.spend.serve(s, w, r, "spend")
}
