package gateway

import (
	"net/http"
	"sync"

	"github.com/sluice-io/sluice/internal/hostcheck"
)

// A reload (`sluice gateway` watching its file) builds a new Gateway from
// the new config, whole, and hands it to SetGateway; a config that fails
// to parse, validate or build never gets here, and the running Gateway
// keeps serving. Each request is served whole by the Gateway it started
// on; a replaced Gateway is closed (its settlements finished, its
// reservations given back) once its last request is done. The limits'
// state is in the store both share, so a reload spends nothing twice and
// forgets nothing; the gateway's metrics are the new Gateway's (counters
// start over, which Prometheus's rate() reads as a reset).

// generation is one Gateway and the requests it is serving.
type generation struct {
	*Gateway
	mu       sync.Mutex
	inFlight int
	retired  bool
	idle     chan struct{} // closed once retired with nothing in flight
}

func newGeneration(g *Gateway) *generation {
	return &generation{Gateway: g, idle: make(chan struct{})}
}

// enter counts a request in, unless the generation was retired.
func (g *generation) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.retired {
		return false
	}
	g.inFlight++
	return true
}

func (g *generation) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inFlight--; g.inFlight == 0 && g.retired {
		close(g.idle)
	}
}

func (g *generation) retire() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.retired = true
	if g.inFlight == 0 {
		close(g.idle)
	}
}

// current returns the generation being served.
func (s *Server) current() *generation {
	s.curOnce.Do(func() {
		if s.cur.Load() == nil {
			s.cur.Store(newGeneration(s.Gateway))
		}
	})
	return s.cur.Load()
}

// serveGateway hands r to the Gateway being served.
func (s *Server) serveGateway(w http.ResponseWriter, r *http.Request) {
	for {
		g := s.current()
		if g.enter() {
			defer g.leave()
			g.ServeHTTP(w, r)
			return
		}
		// Retired between the load and the count: the next one is in.
	}
}

// MetricsHandler serves the metrics of the Gateway being served (when
// Options.Registerer was nil).
func (s *Server) MetricsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.current().Metrics().ServeHTTP(w, r)
	})
}

// Current returns the Gateway being served.
func (s *Server) Current() *Gateway { return s.current().Gateway }

// SetGateway serves g from now on. The Gateway it replaces gets no new
// request, and is closed in the background once those it is serving are
// done (Run waits for that on stop).
// After Run began to stop, g is closed unused.
func (s *Server) SetGateway(g *Gateway) {
	s.swapMu.Lock()
	defer s.swapMu.Unlock()
	if s.stopped {
		go func() { _ = g.Close() }()
		return
	}
	old := s.current()
	s.cur.Store(newGeneration(g))
	old.retire()
	s.retiring.Add(1)
	go func() {
		defer s.retiring.Done()
		<-old.idle
		_ = old.Close()
	}()
}

// stop makes further SetGateway calls close their Gateway unused, and
// returns the Gateway being served, the last.
func (s *Server) stop() *generation {
	s.swapMu.Lock()
	defer s.swapMu.Unlock()
	s.stopped = true
	return s.current()
}

// waitRetired waits until every replaced Gateway is closed.
func (s *Server) waitRetired() { s.retiring.Wait() }

// ownHosts returns this machine's names, read once.
func (s *Server) ownHosts() []string {
	s.ownOnce.Do(func() { s.own = hostcheck.OwnHosts() })
	return s.own
}
