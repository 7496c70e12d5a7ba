package overrides

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
)

// fullReloadEvery is how many polls pass between full reloads.
const fullReloadEvery = 40

// DefaultPollInterval is how often a Manager asks a shared backend whether
// the overrides changed.
const DefaultPollInterval = 250 * time.Millisecond

// DefaultTimeout bounds each call a Manager makes to its backend.
const DefaultTimeout = time.Second

// Options configure a Manager. Backend is required.
type Options struct {
	// Backend keeps the overrides.
	Backend Backend
	// Clock tells expiry; nil means the system clock.
	Clock clock.Clock
	// Logger receives the audit lines; nil means slog.Default().
	Logger *slog.Logger
	// PollInterval is how often Run polls a shared backend's version;
	// zero means DefaultPollInterval.
	PollInterval time.Duration
	// Timeout bounds each backend call (a poll, a reload, a change), so
	// that a paused store fails a change with ErrUnavailable rather than
	// holding it, and a listing waits at most for one poll; zero means
	// DefaultTimeout.
	Timeout time.Duration
}

// Manager serves the overrides of one instance: Lookup from a compiled
// snapshot, changes through the backend with an audit line each, and Run
// following other replicas' changes. It is safe for concurrent use.
type Manager struct {
	b     Backend
	clk   clock.Clock
	log   *slog.Logger
	poll  time.Duration
	limit time.Duration // Options.Timeout
	set   atomic.Pointer[Set]
	mu    sync.Mutex // serialises reloads
	ver   int64      // the version of set; -1 before the first load
	ready atomic.Bool
}

// New validates opts and returns a Manager holding no overrides until its
// first Refresh (Run refreshes at once).
func New(opts Options) (*Manager, error) {
	if opts.Backend == nil {
		return nil, errors.New("overrides: Options.Backend is required")
	}
	if opts.Clock == nil {
		opts.Clock = clock.NewSystem()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = DefaultPollInterval
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	m := &Manager{b: opts.Backend, clk: opts.Clock, log: opts.Logger, poll: opts.PollInterval, limit: opts.Timeout, ver: -1}
	m.set.Store(NewSet(nil))
	return m, nil
}

// Shared reports whether the overrides are the fleet's (Redis) rather
// than this instance's (memory).
func (m *Manager) Shared() bool { return m.b.Shared() }

// Now is the manager's clock, in Unix ns.
func (m *Manager) Now() int64 { return m.clk.Now() }

// Set returns the current snapshot.
func (m *Manager) Set() *Set { return m.set.Load() }

// Apply returns the limit for policy and identity (keyName: its API key's
// configured name, or ""), given l, the limit the configuration gives: an
// override's when one applies. It costs one atomic load when there are no
// overrides.
func (m *Manager) Apply(identity, keyName, policy string, l sluice.Limit) (sluice.Limit, bool) {
	s := m.set.Load()
	if s.Len() == 0 {
		return l, false
	}
	o := s.Lookup(identity, keyName, policy, m.clk.Now())
	if o == nil {
		return l, false
	}
	return o.Apply(l), true
}

// Refresh reloads the overrides when the backend's version moved (or
// always, with force).
func (m *Manager) Refresh(ctx context.Context, force bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, m.limit)
	defer cancel()
	if !force && m.ver >= 0 {
		v, err := m.b.Version(ctx)
		if err != nil {
			return err
		}
		if v == m.ver {
			return nil
		}
	}
	list, v, err := m.b.Load(ctx)
	if err != nil {
		return err
	}
	kept := list[:0]
	for _, o := range list {
		if o.compile() == nil {
			kept = append(kept, o)
		}
	}
	m.set.Store(NewSet(kept))
	m.ver = v
	m.ready.Store(true)
	return nil
}

// compile parses the limit of an override read back from a backend; the
// bounds were checked when it was set.
func (o *Override) compile() error {
	if err := ValidatePattern(o.Identity); err != nil {
		return err
	}
	if o.Limit == "" {
		if !(o.Scale >= MinScale && o.Scale <= MaxScale) {
			return fmt.Errorf("%w: bad scale", ErrInvalid)
		}
		return nil
	}
	l, err := sluice.ParseLimit(o.Limit)
	o.limit = l
	return err
}

// Run follows the backend until ctx is done: for a shared backend it polls
// the version every PollInterval and reloads on a change. It logs failures
// and keeps the last snapshot meanwhile.
func (m *Manager) Run(ctx context.Context) error {
	failing := false
	t := time.NewTicker(m.poll)
	defer t.Stop()
	for n := 0; ; n++ {
		// A full reload now and then: should Redis lose its data (a
		// restart without persistence, a failover to a lagging replica)
		// its counter can come back to a version seen before.
		err := m.Refresh(ctx, n%fullReloadEvery == 0)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			m.log.Warn("overrides: cannot reload from the store; keeping the last ones", "err", err)
			failing = true
		case err == nil && failing:
			m.log.Info("overrides: reloading from the store again")
			failing = false
		}
		if !m.b.Shared() && err == nil {
			<-ctx.Done()
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Put validates o, stamps it with by and the time, stores it and applies
// it here at once (other replicas within their PollInterval). ttl, when
// positive, sets Until to now+ttl. It logs one audit line. policyExists
// rejects unknown policies when not nil.
func (m *Manager) Put(ctx context.Context, by string, o Override, ttl time.Duration, policyExists func(string) bool) (before *Override, after Override, err error) {
	now := m.clk.Now()
	if ttl < 0 || ttl > MaxDuration {
		return nil, o, fmt.Errorf("%w: ttl must be between 0 and %s", ErrInvalid, MaxDuration)
	}
	if ttl > 0 {
		if !o.Until.IsZero() {
			return nil, o, fmt.Errorf("%w: give until or ttl, not both", ErrInvalid)
		}
		o.Until = time.Unix(0, now+int64(ttl)).UTC()
	}
	o.By, o.At = by, time.Unix(0, now).UTC().Truncate(time.Millisecond)
	if err := o.Validate(now, policyExists); err != nil {
		return nil, o, err
	}
	m.purge(ctx, now)
	bctx, cancel := context.WithTimeout(ctx, m.limit)
	before, err = m.b.Put(bctx, o)
	cancel()
	if err != nil {
		m.unknown("put", by, o.Identity, o.Policy, &o, err)
		return nil, o, err
	}
	m.audit("put", by, o.Identity, o.Policy, before, &o)
	if err := m.Refresh(ctx, true); err != nil {
		m.log.Warn("overrides: stored, but reloading failed; it applies at the next poll", "err", err)
	}
	return before, o, nil
}

// Delete removes the override of identity for policy and logs an audit
// line.
func (m *Manager) Delete(ctx context.Context, by, identity, policy string) (*Override, error) {
	if err := ValidatePattern(identity); err != nil {
		return nil, err
	}
	bctx, cancel := context.WithTimeout(ctx, m.limit)
	before, err := m.b.Delete(bctx, ID(identity, policy))
	cancel()
	if err != nil {
		m.unknown("delete", by, identity, policy, nil, err)
		return nil, err
	}
	m.audit("delete", by, identity, policy, before, nil)
	if err := m.Refresh(ctx, true); err != nil {
		m.log.Warn("overrides: deleted, but reloading failed; it applies at the next poll", "err", err)
	}
	return before, nil
}

// purge deletes expired overrides, so that they do not count against the
// bounds. Failures are left for the next change: the first one ends the
// purge, so an unreachable store costs a change one Timeout here.
func (m *Manager) purge(ctx context.Context, now int64) {
	ctx, cancel := context.WithTimeout(ctx, m.limit)
	defer cancel()
	for _, o := range m.set.Load().All() {
		if !o.Active(now) {
			_, err := m.b.Delete(ctx, o.ID())
			switch {
			case err == nil:
				m.audit("expire", "sluice", o.Identity, o.Policy, o, nil)
			case !errors.Is(err, ErrNotFound):
				return
			}
		}
	}
}

// unknown logs the audit line of a change whose store call failed with
// ErrUnavailable: a call that timed out may still be applied when a paused
// store resumes, so the trail records the attempt.
func (m *Manager) unknown(action, by, identity, policy string, after *Override, err error) {
	if !errors.Is(err, ErrUnavailable) {
		return
	}
	if policy == "" {
		policy = "*"
	}
	m.log.Warn("override "+action+" outcome unknown", "audit", true, "by", by, "action", action,
		"identity", LogPattern(identity), "policy", policy, "after", after.Summary(),
		"applied", "unknown", "shared", m.b.Shared(), "err", err)
}

// audit logs one change: who (the admin token's name), what, before and
// after. Patterns name identities, never API keys (a "key:" pattern holds
// a hash, shortened here).
func (m *Manager) audit(action, by, identity, policy string, before, after *Override) {
	if policy == "" {
		policy = "*"
	}
	m.log.Info("override "+action, "audit", true, "by", by, "action", action,
		"identity", LogPattern(identity), "policy", policy,
		"before", before.Summary(), "after", after.Summary(), "shared", m.b.Shared())
}
