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

// spendSource is the gateway's spend, read at most once a spendReuse.
type spendSource struct {
	mu   sync.Mutex
	read SpendFunc
	at   time.Time
	last any
}

// SetGatewaySpend gives the console the gateway's spend; `sluice serve`
// calls it (through Deps) when its config runs the gateway.
func (s *Server) SetGatewaySpend(f SpendFunc) {
	s.spend.mu.Lock()
	defer s.spend.mu.Unlock()
	s.spend.read, s.spend.last = f, nil
}

func (s *Server) handleSpend(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.authorizeAdmin(w, r, "spend"); !ok {
		return
	}
	sp := &s.spend
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.read == nil {
		writeError(w, http.StatusNotFound, "no gateway runs in this process: the spend view needs a gateway: section in this config")
		return
	}
	now := time.Now()
	if sp.last == nil || now.Sub(sp.at) >= spendReuse || now.Before(sp.at) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		v, err := sp.read(ctx)
		cancel()
		if err != nil {
			s.log.Warn("console: reading the gateway's spend", "err", err)
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable, "the store cannot be read now")
			return
		}
		sp.last, sp.at = v, now
	}
	writeAny(w, sp.last)
}
