package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/memstore"
)

// Policy decides what a call answers when Redis fails, times out, or the
// circuit is open. Every such answer has Decision.Degraded set and is
// counted in Stats.Degraded.
type Policy uint8

// The failure policies.
const (
	// FailOpen admits every request: availability over enforcement.
	FailOpen Policy = iota + 1
	// FailClosed denies every request, with RetryAfter the time until the
	// circuit probes Redis again.
	FailClosed
	// Local enforces the limit ÷ Options.Instances in an embedded memory
	// store, so that the fleet as a whole stays near the limit.
	Local
	// ReturnError returns an error wrapping ErrUnavailable, for callers that
	// decide themselves.
	ReturnError
)

var policyNames = [...]string{FailOpen: "fail_open", FailClosed: "fail_closed", Local: "local", ReturnError: "error"}

func (p Policy) valid() bool { return p >= FailOpen && p <= ReturnError }

// String returns the policy's configuration name, such as "fail_open".
func (p Policy) String() string {
	if p.valid() {
		return policyNames[p]
	}
	return fmt.Sprintf("policy(%d)", p)
}

// ParsePolicy reads a policy name as String writes it; dashes work too.
func ParsePolicy(s string) (Policy, error) {
	name := strings.ReplaceAll(strings.ToLower(strings.TrimSpace(s)), "-", "_")
	for p := FailOpen; p <= ReturnError; p++ {
		if policyNames[p] == name {
			return p, nil
		}
	}
	return 0, fmt.Errorf("redisstore: unknown failure policy %q; valid: fail_open, fail_closed, local, error", s)
}

// degrade answers reqs by the store's policy after cause.
func (s *Store) degrade(ctx context.Context, op sluice.Op, reqs []sluice.Request, cause error) ([]sluice.Decision, error) {
	if s.policy == ReturnError {
		return nil, fmt.Errorf("redisstore: %w", cause)
	}
	s.degraded.Add(uint64(len(reqs)))
	if s.policy == Local {
		if ds, err := s.localApply(ctx, op, reqs); err == nil {
			return ds, nil
		}
		// a cost beyond the local share of the burst: deny, as FailClosed
	}
	admit := s.policy == FailOpen || (op != sluice.OpAllow && op != sluice.OpPeek)
	ds := make([]sluice.Decision, len(reqs))
	for i := range reqs {
		d := sluice.Decision{Allowed: admit, Limit: reqs[i].Limit, Degraded: true}
		if admit {
			d.Remaining = reqs[i].Capacity() - reqs[i].Cost
		} else {
			d.RetryAfter = s.br.retryAfter()
			d.ResetAfter = d.RetryAfter
		}
		ds[i] = d
	}
	return ds, nil
}

// localApply runs reqs on the embedded memory store at limit ÷ Instances.
func (s *Store) localApply(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	s.localOnce.Do(func() {
		s.local, s.localErr = memstore.New(memstore.Options{Clock: s.localClk, MaxKeys: s.localMaxKeys})
	})
	if s.localErr != nil {
		return nil, s.localErr
	}
	scaled := make([]sluice.Request, len(reqs))
	for i, r := range reqs {
		r.Limit = share(r.Limit, s.instances)
		scaled[i] = r
	}
	ds, err := s.local.ApplyAll(ctx, op, scaled)
	if err != nil {
		return nil, err
	}
	for i := range ds {
		ds[i].Degraded = true
	}
	return ds, nil
}

// share is one instance's part of l when n instances share it.
func share(l sluice.Limit, n int) sluice.Limit {
	if n <= 1 {
		return l
	}
	l.Rate = max(1, l.Rate/int64(n))
	if l.Burst > 0 {
		l.Burst = max(1, l.Burst/int64(n))
	}
	return l
}

// Circuit states.
const (
	closed int32 = iota
	open
	halfOpen
)

// breaker opens after threshold failures in a row; then, once per
// cooldown, it lets one call through to probe Redis. A success closes it.
type breaker struct {
	threshold int32
	cooldown  time.Duration
	log       *slog.Logger

	state  atomic.Int32
	fails  atomic.Int32
	opens  atomic.Uint64
	mu     sync.Mutex
	until  time.Time // when an open circuit may probe
	probin bool
}

func newBreaker(threshold int, cooldown time.Duration, log *slog.Logger) *breaker {
	return &breaker{threshold: int32(threshold), cooldown: cooldown, log: log}
}

// allow reports whether a call may go to Redis.
func (b *breaker) allow() bool {
	if b.state.Load() == closed {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state.Load() {
	case closed:
		return true
	case open:
		if time.Now().Before(b.until) {
			return false
		}
		b.state.Store(halfOpen)
		b.probin = true
		return true
	}
	return false // half open: one probe is in flight
}

// healthy reports a closed circuit with no recent failure.
func (b *breaker) healthy() bool { return b.state.Load() == closed && b.fails.Load() == 0 }

// success records a call that Redis answered.
func (b *breaker) success() {
	if b.state.Load() == closed {
		if b.fails.Load() != 0 {
			b.fails.Store(0)
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state.Load() != closed {
		b.state.Store(closed)
		b.fails.Store(0)
		b.probin = false
		b.log.Info("redisstore: redis is back; circuit closed")
	}
}

// release gives back a probe whose caller gave up before Redis answered.
func (b *breaker) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state.Load() == halfOpen && b.probin {
		b.state.Store(open)
		b.probin = false
	}
}

// failure records a failed call.
func (b *breaker) failure(err error) {
	n := b.fails.Add(1)
	st := b.state.Load()
	if st == closed && n < b.threshold {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state.Load() == open {
		return
	}
	b.state.Store(open)
	b.probin = false
	b.until = time.Now().Add(b.cooldown)
	b.opens.Add(1)
	var re interface{ Error() string }
	if errors.As(err, &re) {
		b.log.Warn("redisstore: redis failing; circuit open", "failures", n, "retry_in", b.cooldown, "err", re.Error())
	}
}

// retryAfter is the time until the circuit probes Redis again, or the
// cooldown when it is not open.
func (b *breaker) retryAfter() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if d := time.Until(b.until); b.state.Load() == open && d > 0 {
		return d
	}
	return b.cooldown
}

func (b *breaker) stateName() string {
	return [...]string{"closed", "open", "half_open"}[b.state.Load()]
}
