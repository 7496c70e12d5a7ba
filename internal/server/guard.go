package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/guard"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/metrics"
	"github.com/sluice-io/sluice/lease"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/redisstore"
	"github.com/sluice-io/sluice/region"
)

// The service's store failure handling is package guard: a per-call
// deadline, a circuit per store node, a per-key in-flight cap, a
// background probe, and the failure policy. This file wires it to the
// configuration, so that each call uses the policy of the configuration
// it loaded, and to the metrics.

// memoryProbeInterval is the guard's probe period on the memory store,
// which never fails: long, so that an idle service sleeps.
const memoryProbeInterval = time.Hour

// newGuard wraps store in a guard configured by sc. The service closes it.
func newGuard(store sluice.Store, sc config.StoreSection, clk clock.Clock, log *slog.Logger) (*guard.Guard, error) {
	policy, err := parsePolicy(sc.FailurePolicy)
	if err != nil {
		return nil, err
	}
	o := guard.Options{Policy: policy, Timeout: sc.Timeout, Instances: sc.Instances, LocalMaxKeys: sc.MaxKeys, LocalMaxBytes: sc.MaxBytes, Logger: log, Clock: clk}
	if sc.IsMemory() {
		o.Timeout = -1 // memory answers at once; no deadline to keep
	}
	if isMemstore(store) {
		// Nor can it fail: New's probe finds it ready, and a background
		// probe every 200 ms only woke an idle process five times a
		// second (TestServeIdle). A store wrapped by something that may
		// fail (no Unwrap down to the memory store) keeps the probe.
		o.ProbeInterval = memoryProbeInterval
	}
	g, err := guard.New(store, o)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	return g, nil
}

// isMemstore reports whether store is the memory store, seen through
// wrappers that Unwrap (tracing).
func isMemstore(store sluice.Store) bool {
	for st := store; st != nil; {
		if _, ok := st.(*memstore.Store); ok {
			return true
		}
		u, ok := st.(interface{ Unwrap() sluice.Store })
		if !ok {
			return false
		}
		st = u.Unwrap()
	}
	return false
}

// parsePolicy reads a config's failure policy; the empty one is the
// default, local.
func parsePolicy(name string) (guard.Policy, error) {
	switch name {
	case "", config.FailLocal:
		return guard.Local, nil
	case config.FailOpen:
		return guard.FailOpen, nil
	case config.FailClosed:
		return guard.FailClosed, nil
	}
	p, err := guard.ParsePolicy(name)
	if err != nil {
		return 0, fmt.Errorf("server: %w", err)
	}
	return p, nil
}

// storeGuard is the guard as the server uses it: every call with the
// failure policy of the configuration being served.
type storeGuard struct {
	g   *guard.Guard
	cfg func() *config.Config
	// store is the guard following the configuration, as a sluice.Store.
	store sluice.Store
}

func newStoreGuard(g *guard.Guard, cfg func() *config.Config) *storeGuard {
	sg := &storeGuard{g: g, cfg: cfg}
	sg.store = policyStore{sg}
	return sg
}

// view is the guard with the served configuration's policy.
func (s *storeGuard) view() *guard.Guard {
	p, err := parsePolicy(s.cfg().Store.FailurePolicy)
	if err != nil {
		return s.g
	}
	return s.g.WithPolicy(p)
}

func (s *storeGuard) applyAll(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	return s.view().ApplyAll(ctx, op, reqs)
}

// ready reports whether the store answers, from the guard's background
// probe: correct without traffic. The served configuration's policy says
// whether the instance count must be known (local's cold start).
func (s *storeGuard) ready(ctx context.Context) error { return s.view().Ready(ctx) }

// stats exports the guard's counters, the lease store's and the Redis
// store's.
func (s *storeGuard) stats() metrics.StoreStats {
	st := s.g.Stats()
	out := metrics.StoreStats{Calls: st.Calls, Errors: st.Errors, Degraded: st.DegradedTotal(), CircuitOpens: st.Openings, StarvedLate: st.StarvedLate, LateAnswers: st.LateAnswers, Instances: st.Instances}
	if st.Open > 0 {
		out.Circuit = metrics.CircuitOpen
	}
	out.DegradedBy = make(map[string]uint64, len(st.Degraded))
	for p, n := range st.Degraded {
		if n != 0 {
			out.DegradedBy[guard.Policy(p).String()] = n
		}
	}
	out.Nodes = make([]metrics.NodeStats, len(st.Nodes))
	for i, n := range st.Nodes {
		out.Nodes[i] = metrics.NodeStats{Node: n.Node, Calls: n.Calls, Errors: n.Errors, Openings: n.Openings, Open: n.Open}
	}
	AddStoreStats(&out, s.g.Unwrap())
	return out
}

// AddStoreStats adds to out the counters of st and of the stores it
// wraps: a region store's, a lease store's and a Redis store's (Calls and
// Errors are the guard's, which stands before them in serve).
func AddStoreStats(out *metrics.StoreStats, st sluice.Store) {
	if rs, ok := st.(*region.Store); ok {
		out.Region = regionStats(rs)
		st = rs.Unwrap()
	}
	if ls, ok := st.(*lease.Store); ok {
		lst := ls.Stats()
		out.LeaseHits, out.LeaseFetches, out.LeaseReturns = lst.Hits, lst.Fetches, lst.Returns
		st = ls.Unwrap()
	}
	if rs, ok := st.(*redisstore.Store); ok {
		rst := rs.Stats()
		out.CacheHits = rst.CacheHits
		out.Plain, out.PlainLate, out.Groups, out.Grouped = rst.Plain, rst.PlainLate, rst.Groups, rst.Grouped
	}
}

// policyStore is a sluice.Store that follows the configuration's failure
// policy, for the components plugged into the service.
type policyStore struct{ s *storeGuard }

func (p policyStore) Apply(ctx context.Context, op sluice.Op, req sluice.Request) (sluice.Decision, error) {
	return p.s.view().Apply(ctx, op, req)
}

func (p policyStore) ApplyAll(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	return p.s.view().ApplyAll(ctx, op, reqs)
}

// Unwrap returns the guard, through which sluice.Reservation finds the
// store's clock.
func (p policyStore) Unwrap() sluice.Store { return p.s.g }

// guardOf returns the guard a store passed to New already is, or wraps it
// in one (whose probe then runs for the life of the process: Run passes
// its own guard and closes it).
func guardOf(store sluice.Store, sc config.StoreSection, clk clock.Clock, log *slog.Logger) (*guard.Guard, error) {
	if g, ok := store.(*guard.Guard); ok {
		return g, nil
	}
	return newGuard(store, sc, clk, log)
}
