package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/metrics"
)

// Circuit breaker settings: after breakerThreshold consecutive store
// failures the guard stops calling the store for breakerCooldown and lets
// the failure policy answer; then one probe call decides whether to close.
const (
	breakerThreshold = 5
	breakerCooldown  = 2 * time.Second
)

// ErrCircuitOpen means the store is not being called because it failed
// repeatedly; the failure policy answers instead.
var ErrCircuitOpen = errors.New("server: store circuit open")

// Pinger is implemented by stores that can report whether they are
// reachable. /readyz uses it.
type Pinger interface {
	Ping(ctx context.Context) error
}

// SelfGuarded is implemented by stores that apply a timeout, a circuit
// breaker and the failure policy themselves, such as the Redis store; the
// guard then passes their calls through and exports their counters.
type SelfGuarded interface {
	// StoreStats reports the store's counters and circuit state.
	StoreStats() metrics.StoreStats
	// Ping reports whether the store can be reached now.
	Ping(ctx context.Context) error
}

// guard wraps the store with a timeout, a circuit breaker and the
// configured failure policy, unless the store does that itself.
type guard struct {
	store    sluice.Store
	self     SelfGuarded // nil unless the store guards itself
	fallback sluice.Store
	policy   string
	timeout  time.Duration
	clk      clock.Clock
	log      *slog.Logger

	fails     atomic.Int32
	openUntil atomic.Int64 // Unix ns; zero when closed
	probing   atomic.Bool

	calls, errs, degraded, opens atomic.Uint64
}

func newGuard(store, fallback sluice.Store, sc config.StoreSection, m *metrics.Metrics, clk clock.Clock, log *slog.Logger) *guard {
	g := &guard{store: store, fallback: fallback, policy: sc.FailurePolicy, clk: clk, log: log}
	if !sc.IsMemory() {
		g.timeout = sc.Timeout
	}
	if sg, ok := store.(SelfGuarded); ok {
		g.self = sg
		m.SetStoreStats(sg.StoreStats)
	} else {
		m.SetStoreStats(g.stats)
	}
	return g
}

// stats reports the guard's own counters.
func (g *guard) stats() metrics.StoreStats {
	st := metrics.StoreStats{Calls: g.calls.Load(), Errors: g.errs.Load(), Degraded: g.degraded.Load(), CircuitOpens: g.opens.Load()}
	if g.openUntil.Load() != 0 {
		st.Circuit = metrics.CircuitOpen
		if g.probing.Load() {
			st.Circuit = metrics.CircuitHalfOpen
		}
	}
	return st
}

// applyAll validates reqs, then asks the store, or the failure policy when
// the store fails or its circuit is open.
func (g *guard) applyAll(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	if g.self != nil {
		return g.store.ApplyAll(ctx, op, reqs)
	}
	for i := range reqs {
		if err := reqs[i].Validate(op); err != nil {
			return nil, err
		}
	}
	if !g.admitCall() {
		return g.degrade(ctx, op, reqs, ErrCircuitOpen)
	}
	if g.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.timeout)
		defer cancel()
	}
	g.calls.Add(1)
	ds, err := g.store.ApplyAll(ctx, op, reqs)
	if err == nil {
		g.succeeded()
		return ds, nil
	}
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// The client went away; that says nothing about the store. If this
		// call was the half-open probe, let the next call probe instead.
		g.probing.Store(false)
		return nil, err
	}
	g.errs.Add(1)
	g.failed(err)
	return g.degrade(ctx, op, reqs, err)
}

// degrade answers by the failure policy, every decision marked Degraded.
func (g *guard) degrade(ctx context.Context, op sluice.Op, reqs []sluice.Request, cause error) ([]sluice.Decision, error) {
	g.degraded.Add(uint64(len(reqs)))
	switch {
	case g.policy == config.FailLocal && g.fallback != nil:
		ds, err := g.fallback.ApplyAll(context.WithoutCancel(ctx), op, reqs)
		if err != nil {
			return nil, fmt.Errorf("server: local fallback after %v: %w", cause, err)
		}
		for i := range ds {
			ds[i].Degraded = true
		}
		return ds, nil
	case g.policy == config.FailClosed:
		ds := make([]sluice.Decision, len(reqs))
		for i, r := range reqs {
			ds[i] = sluice.Decision{Limit: r.Limit, RetryAfter: retryAfter, ResetAfter: r.Limit.Period, Degraded: true}
		}
		return ds, nil
	default: // fail_open, and local without a fallback
		ds := make([]sluice.Decision, len(reqs))
		for i, r := range reqs {
			ds[i] = sluice.Decision{Allowed: true, Limit: r.Limit, Remaining: r.Capacity(), Degraded: true}
		}
		return ds, nil
	}
}

// admitCall reports whether the store may be called: the circuit is
// closed, or it is half-open and this call is the probe.
func (g *guard) admitCall() bool {
	until := g.openUntil.Load()
	if until == 0 {
		return true
	}
	if g.clk.Now() < until {
		return false
	}
	return g.probing.CompareAndSwap(false, true)
}

func (g *guard) succeeded() {
	if g.fails.Load() != 0 {
		g.fails.Store(0)
	}
	if g.openUntil.Load() != 0 {
		g.openUntil.Store(0)
		g.probing.Store(false)
		g.log.Info("store circuit closed: the store answers again")
	}
}

func (g *guard) failed(err error) {
	n := g.fails.Add(1)
	if n < breakerThreshold && g.openUntil.Load() == 0 {
		return
	}
	wasOpen := g.openUntil.Load() != 0
	g.openUntil.Store(g.clk.Now() + int64(breakerCooldown))
	g.probing.Store(false)
	if !wasOpen {
		g.opens.Add(1)
		g.log.Warn("store circuit open: the failure policy answers", "failures", n, "policy", g.policy, "err", err)
	}
}

// ready reports whether the store can be used: not while the circuit is
// open, nor when the store's Ping fails.
func (g *guard) ready(ctx context.Context) error {
	if g.self != nil {
		if g.self.StoreStats().Circuit == metrics.CircuitOpen {
			return ErrCircuitOpen
		}
		if err := g.self.Ping(ctx); err != nil {
			return fmt.Errorf("server: store ping: %w", err)
		}
		return nil
	}
	if until := g.openUntil.Load(); until != 0 && g.clk.Now() < until {
		return ErrCircuitOpen
	}
	if p, ok := g.store.(Pinger); ok {
		if err := p.Ping(ctx); err != nil {
			return fmt.Errorf("server: store ping: %w", err)
		}
	}
	return nil
}
