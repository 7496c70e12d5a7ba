package redisstore

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
)

// slack is what a loaded CI machine under -race may add to a deadline.
const slack = 250 * time.Millisecond

// Redis is killed under load and restarted, once per policy: every call
// returns within its deadline, the policy answers while Redis is down, the
// circuit opens, and the store recovers by itself (NOSCRIPT included).
func TestKillAndRestartUnderLoad(t *testing.T) {
	srv := redistest.NewStandalone(t)
	const timeout = 50 * time.Millisecond
	base := newStore(t, Options{URL: srv.URL(), Timeout: timeout, BreakerCooldown: 100 * time.Millisecond, Instances: 4, DisableDenyCache: true})
	for _, p := range []Policy{FailOpen, FailClosed, Local, ReturnError} {
		t.Run(p.String(), func(t *testing.T) {
			s := base.WithPolicy(p)
			req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 1000, Period: time.Second, Burst: 1000}, Cost: 1}
			type event struct {
				d   sluice.Decision
				err error
			}
			events := make(chan event, 1024)
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			// slowest is the slowest call after the kill; healthySlowest
			// the slowest before it, which measures what the loaded machine's
			// scheduler adds to any call.
			var slowest, healthySlowest atomic.Int64
			var killed atomic.Bool
			for range 8 {
				wg.Go(func() {
					for ctx.Err() == nil {
						start := time.Now()
						d, err := s.Apply(context.Background(), sluice.OpAllow, req)
						took := int64(time.Since(start))
						worst := &slowest
						if !killed.Load() {
							worst = &healthySlowest
						}
						for {
							old := worst.Load()
							if took <= old || worst.CompareAndSwap(old, took) {
								break
							}
						}
						select {
						case events <- event{d, err}:
						case <-ctx.Done():
						}
					}
				})
			}
			defer func() {
				cancel()
				wg.Wait()
			}()
			wait := func(what string, match func(event) bool) {
				t.Helper()
				deadline := time.NewTimer(15 * time.Second)
				defer deadline.Stop()
				for {
					select {
					case e := <-events:
						if match(e) {
							return
						}
					case <-deadline.C:
						t.Fatalf("no %s within 15s; stats %+v", what, s.Stats())
					}
				}
			}
			healthy := func(e event) bool { return e.err == nil && !e.d.Degraded && e.d.Allowed }
			for range 50 {
				wait("healthy decision", healthy)
			}
			opensBefore := s.Stats().BreakerOpens
			killed.Store(true)
			srv.Kill()
			for range 20 {
				wait("policy answer", func(e event) bool {
					switch p {
					case ReturnError:
						if e.err != nil && !errors.Is(e.err, ErrUnavailable) {
							t.Fatalf("error %v does not wrap ErrUnavailable", e.err)
						}
						return e.err != nil
					case FailOpen:
						return e.err == nil && e.d.Degraded && e.d.Allowed
					case FailClosed:
						return e.err == nil && e.d.Degraded && !e.d.Allowed && e.d.RetryAfter > 0
					case Local:
						return e.err == nil && e.d.Degraded && e.d.Limit.Rate == 250
					}
					return false
				})
			}
			if st := s.Stats(); st.BreakerOpens == opensBefore || st.Errors == 0 {
				t.Fatalf("circuit never opened or errors not counted: %+v", st)
			}
			srv.Restart(t)
			wait("recovery", healthy)
			if st := s.Stats(); st.Circuit != "closed" {
				t.Fatalf("circuit %s after recovery", st.Circuit)
			}
			limit := timeout + max(slack, 2*time.Duration(healthySlowest.Load()))
			if got := time.Duration(slowest.Load()); got > limit {
				t.Fatalf("slowest call took %s, deadline %s, slowest healthy call %s", got, timeout, time.Duration(healthySlowest.Load()))
			}
		})
	}
}

// While the circuit is open, calls do not wait for Redis at all.
func TestOpenCircuitAnswersAtOnce(t *testing.T) {
	srv := redistest.NewStandalone(t)
	s := newStore(t, Options{URL: srv.URL(), Timeout: 200 * time.Millisecond, BreakerCooldown: time.Minute, Policy: FailClosed})
	srv.Kill()
	req := sluice.Request{Key: "k", Algorithm: sluice.GCRA, Limit: sluice.PerSecond(1), Cost: 1}
	for range DefaultBreakerThreshold {
		if d, err := s.Apply(context.Background(), sluice.OpAllow, req); err != nil || !d.Degraded || d.Allowed {
			t.Fatalf("%+v %v", d, err)
		}
	}
	if st := s.Stats(); st.Circuit != "open" {
		t.Fatalf("circuit %s after %d failures", st.Circuit, DefaultBreakerThreshold)
	}
	calls := s.Stats().Calls
	start := time.Now()
	for range 1000 {
		if d, _ := s.Apply(context.Background(), sluice.OpAllow, req); !d.Degraded || d.Allowed || d.RetryAfter <= 0 {
			t.Fatalf("open circuit answered %+v", d)
		}
	}
	if took := time.Since(start); took > slack || s.Stats().Calls != calls {
		t.Fatalf("1000 calls with the circuit open took %s and made %d Redis calls", took, s.Stats().Calls-calls)
	}
}

// A server turned replica (as after a failover) refuses writes with
// READONLY: the store degrades, and recovers once it is a master again.
func TestReadOnlyAfterFailover(t *testing.T) {
	srv := redistest.NewStandalone(t)
	other := redistest.NewStandalone(t)
	s := newStore(t, Options{URL: srv.URL(), Policy: ReturnError, BreakerCooldown: 10 * time.Millisecond, DisableDenyCache: true})
	ctx := context.Background()
	req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.TokenBucket, Limit: sluice.PerSecond(100), Cost: 1}
	if _, err := s.Apply(ctx, sluice.OpAllow, req); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do(ctx, "REPLICAOF", "127.0.0.1", strconv.Itoa(other.Port)); err != nil {
		t.Fatal(err)
	}
	_, err := s.Apply(ctx, sluice.OpAllow, req)
	if !errors.Is(err, ErrUnavailable) || !isReadOnly(err) {
		t.Fatalf("write to a replica: %v, want READONLY wrapped in ErrUnavailable", err)
	}
	if _, err := srv.Do(ctx, "REPLICAOF", "NO", "ONE"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := s.Apply(ctx, sluice.OpAllow, req)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("after promotion: %v", err)
		}
		<-time.After(10 * time.Millisecond) // the circuit's cooldown
	}
}
