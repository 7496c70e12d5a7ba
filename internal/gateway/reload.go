package gateway

import (
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

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

// generation is one Gateway and the requests it is serving. Counting is
// lock-free (two atomic adds a request): a request counts itself in, then
// backs out if it finds the generation retired; retire marks it, then
// closes idle when nothing is counted. Whichever of the two sees the
// other's write last closes idle, once; a request counted in before the
// mark is served whole by this generation.
type generation struct {
	*Gateway
	inFlight atomic.Int64
	retired  atomic.Bool
	idleOnce sync.Once
	idle     chan struct{} // closed once retired with nothing in flight
	// policy caches the Server's Policy for this generation's config.
	policy atomic.Pointer[hostcheck.Policy]
}

func newGeneration(g *Gateway) *generation {
	return &generation{Gateway: g, idle: make(chan struct{})}
}

// enter counts a request in, unless the generation was retired.
func (g *generation) enter() bool {
	g.inFlight.Add(1)
	if g.retired.Load() {
		g.leave()
		return false
	}
	return true
}

func (g *generation) leave() {
	if g.inFlight.Add(-1) == 0 && g.retired.Load() {
		g.idleOnce.Do(func() { close(g.idle) })
	}
}

func (g *generation) retire() {
	g.retired.Store(true)
	if g.inFlight.Load() == 0 {
		g.idleOnce.Do(func() { close(g.idle) })
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
	g := s.enterCurrent()
	defer g.leave()
	g.ServeHTTP(w, r)
}

// enterCurrent counts a request in the generation being served.
func (s *Server) enterCurrent() *generation {
	for {
		if g := s.current(); g.enter() {
			return g
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

// Gatherer gathers the metrics of the Gateway being served (when
// Options.Registerer was nil), for a handler that serves them beside the
// process's own (prometheus.Gatherers).
func (s *Server) Gatherer() prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) { return s.current().gather() })
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

// GuardWith is HostGuard by the names hosts returns, for another listener
// of the same gateway (sluice gateway's metrics listener): refusals are
// counted in the metrics of the Gateway being served.
func (s *Server) GuardWith(hosts func() *hostcheck.Policy, next http.Handler) http.Handler {
	return s.guard(hosts, next)
}

// ownHosts returns this machine's names, read once.
func (s *Server) ownHosts() []string {
	s.ownOnce.Do(func() { s.own = hostcheck.OwnHosts() })
	return s.own
}
