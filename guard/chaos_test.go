package guard_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/guard"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/redisstore"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// The chaos harness: three guarded Redis stores on one Redis are three
// sluice instances. Every policy has its own hot key, hammered by 64
// callers spread over the instances; 12 more callers spread over 1,000
// cold keys. A fault is injected under that load, then lifted.

const (
	hotCallers  = 64
	coldCallers = 12
	coldKeys    = 1000
	// pace spaces one caller's calls, so that 268 callers leave the two
	// cores of a CI machine (under -race) to Redis and the guards.
	pace = 100 * time.Millisecond
	// timeout is the guards' deadline: 250ms rather than the default 50ms,
	// so that the healthy phases stay healthy on a CI machine shared with
	// other builds under -race; the faults last 2s, far beyond it.
	timeout = 250 * time.Millisecond
	// heartbeat is the guards' heartbeat interval (TTL three of them,
	// 1.5s): the 2s faults outlast the TTL, so the instances come back
	// lapsed, while a starved machine's late heartbeats do not.
	heartbeat = 500 * time.Millisecond
)

// hotLimit is the hot keys' limit: 300 per 10s, burst 300, which the hot
// callers exhaust in the healthy phase.
var hotLimit = sluice.Limit{Rate: 300, Period: 10 * time.Second, Burst: 300}

var policies = []guard.Policy{guard.Local, guard.FailOpen, guard.FailClosed, guard.ReturnError}

type fleet struct {
	t      testing.TB
	guards []*guard.Guard
	prefix string
	tally  [5]policyTally // by guard.Policy

	worstHealthy atomic.Int64 // slowest call before any fault, ns
	worst        atomic.Int64 // slowest call since the fault, ns
	lag          atomic.Int64 // latest wake-up of a timer in the round, ns (callers' pauses, watchLag)
	faulted      atomic.Bool
	coldDegraded atomic.Int64 // cold decisions that were degraded, since reset
	coldCalls    atomic.Int64
}

type policyTally struct {
	admitted         atomic.Int64
	first, last      atomic.Int64 // Unix ns of the first and last call
	degraded, errors atomic.Int64
}

func newFleet(t testing.TB, url string) *fleet {
	t.Helper()
	f := &fleet{t: t, prefix: redistest.Prefix(t)}
	for range 3 {
		rs, err := redisstore.New(context.Background(), redisstore.Options{URL: url, InstancesKey: f.prefix + "instances", Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		g, err := guard.New(rs, guard.Options{CloseStore: true, Logger: slog.New(slog.DiscardHandler), Timeout: timeout, ProbeInterval: 100 * time.Millisecond, HeartbeatInterval: heartbeat})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
		f.guards = append(f.guards, g)
	}
	waitUntil(t, "every instance counts 3 instances", 10*time.Second, func() bool {
		for _, g := range f.guards {
			if g.Instances() != 3 {
				return false
			}
		}
		return true
	})
	return f
}

func waitUntil(t testing.TB, what string, within time.Duration, cond func() bool) time.Duration {
	t.Helper()
	return redistest.WaitUntil(t, what, within, cond)
}

// run sends the load until ctx is done.
func (f *fleet) run(ctx context.Context, round string) {
	var wg sync.WaitGroup
	for _, p := range policies {
		tl := &f.tally[p]
		req := sluice.Request{Key: f.prefix + round + ":hot:" + p.String(), Algorithm: sluice.GCRA, Limit: hotLimit, Cost: 1}
		for i := range hotCallers {
			g := f.guards[i%3].WithPolicy(p)
			wg.Go(func() {
				for ctx.Err() == nil {
					now := time.Now()
					tl.first.CompareAndSwap(0, now.UnixNano())
					d, err := g.Apply(context.Background(), sluice.OpAllow, req)
					f.took(time.Since(now))
					tl.last.Store(time.Now().UnixNano())
					switch {
					case err != nil:
						if !errors.Is(err, guard.ErrUnavailable) {
							f.t.Errorf("%s: error %v does not wrap ErrUnavailable", p, err)
						}
						tl.errors.Add(1)
					case d.Allowed:
						tl.admitted.Add(1)
					}
					if d.Degraded {
						tl.degraded.Add(1)
					}
					f.pause(ctx, pace)
				}
			})
		}
	}
	for i := range coldCallers {
		g := f.guards[i%3]
		wg.Go(func() {
			for ctx.Err() == nil {
				req := sluice.Request{Key: fmt.Sprint(f.prefix, "cold:", rand.IntN(coldKeys)), Algorithm: sluice.GCRA, Limit: sluice.PerSecond(1000), Cost: 1}
				now := time.Now()
				d, err := g.Apply(context.Background(), sluice.OpAllow, req)
				f.took(time.Since(now))
				f.coldCalls.Add(1)
				if err != nil || d.Degraded {
					f.coldDegraded.Add(1)
				}
				f.pause(ctx, pace/4)
			}
		})
	}
	wg.Wait()
}

// pause is a caller's sleep between calls; how late it wakes is kept in
// f.lag: the callers' own scheduling delay, which a call woken at its
// deadline suffers too.
func (f *fleet) pause(ctx context.Context, d time.Duration) {
	start := time.Now()
	sleep(ctx, d)
	if ctx.Err() == nil {
		storeMax(&f.lag, time.Since(start)-d)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func (f *fleet) took(d time.Duration) {
	w := &f.worstHealthy
	if f.faulted.Load() {
		w = &f.worst
	}
	storeMax(w, d)
}

func storeMax(w *atomic.Int64, d time.Duration) {
	for {
		old := w.Load()
		if int64(d) <= old || w.CompareAndSwap(old, int64(d)) {
			return
		}
	}
}

// watchLag measures, until stop is closed, how late the machine runs a
// goroutine whose 5ms timer fired, keeping the latest in f.lag (also
// while no caller runs): what a call that returned at its deadline waits
// on top of it, here and now (a CPU-starved phase, other builds on a CI
// machine).
func (f *fleet) watchLag(stop <-chan struct{}) {
	const tick = 5 * time.Millisecond
	t := time.NewTimer(tick)
	defer t.Stop()
	for {
		start := time.Now()
		t.Reset(tick)
		select {
		case <-stop:
			return
		case <-t.C:
			storeMax(&f.lag, time.Since(start)-tick)
		}
	}
}

// ideal is what hotLimit admits over the policy's calls: the burst and
// the refill since the first call.
func (f *fleet) ideal(p guard.Policy) float64 {
	tl := &f.tally[p]
	elapsed := time.Duration(tl.last.Load() - tl.first.Load())
	return float64(hotLimit.Burst) + float64(hotLimit.Rate)*elapsed.Seconds()/hotLimit.Period.Seconds()
}

func (f *fleet) ready() bool {
	for _, g := range f.guards {
		if g.Ready(context.Background()) != nil {
			return false
		}
	}
	return true
}

// fault is one way Redis (or the machine) fails for about 2s.
type fault struct {
	name string
	// inject starts the fault; lift ends it (nil when it ends by itself
	// after 2s) and returns when Redis is back.
	inject func(t testing.TB, srv *redistest.Server)
	lift   func(t testing.TB, srv *redistest.Server)
	// lost: Redis loses its data (a restart without persistence), so the
	// store admits a second burst: the bound grows by one burst.
	lost bool
}

var pauseFor = 2 * time.Second

var faults = []fault{
	{name: "client_pause", inject: func(t testing.TB, srv *redistest.Server) {
		if _, err := srv.Do(context.Background(), "CLIENT", "PAUSE", fmt.Sprint(pauseFor.Milliseconds()), "ALL"); err != nil {
			t.Fatal(err)
		}
	}, lift: func(t testing.TB, srv *redistest.Server) {
		// CLIENT PAUSE ends by itself: wait until Redis answers again.
		waitUntil(t, "pause over", 5*time.Second, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			_, err := srv.Do(ctx, "PING")
			return err == nil
		})
	}},
	{name: "sigstop", inject: func(t testing.TB, srv *redistest.Server) {
		if err := srv.Freeze(); err != nil {
			t.Fatal(err)
		}
	}, lift: func(t testing.TB, srv *redistest.Server) {
		if err := srv.Thaw(); err != nil {
			t.Fatal(err)
		}
	}},
	{name: "kill9_restart", lost: true, inject: func(t testing.TB, srv *redistest.Server) {
		srv.Kill()
	}, lift: func(t testing.TB, srv *redistest.Server) {
		srv.Restart(t)
	}},
	{name: "cpu_starved"}, // inject and lift are the burners, below
}

// TestChaos injects each fault in turn under load and checks, per policy:
// the hot key's admissions against the bound in docs/redis.md, that no
// call waits past its deadline plus slack, that Ready recovers within 1s
// of Redis returning with no traffic at all, and that decisions then come
// from Redis.
func TestChaos(t *testing.T) {
	srv := redistest.NewStandalone(t)
	f := newFleet(t, srv.URL())
	for _, fl := range faults {
		t.Run(fl.name, func(t *testing.T) {
			f.t = t
			for p := range f.tally {
				f.tally[p] = policyTally{}
			}
			f.faulted.Store(false)
			f.worst.Store(0)
			f.lag.Store(0)
			stopLag := make(chan struct{})
			lagDone := make(chan struct{})
			go func() {
				f.watchLag(stopLag)
				close(lagDone)
			}()
			defer func() {
				close(stopLag)
				<-lagDone
			}()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				f.run(ctx, fl.name)
				close(done)
			}()
			sleep(ctx, 700*time.Millisecond) // healthy: every hot key exhausted
			f.faulted.Store(true)
			var burn atomic.Bool
			var burners sync.WaitGroup
			if fl.inject != nil {
				fl.inject(t, srv)
			} else {
				burn.Store(true)
				for range runtime.GOMAXPROCS(0) {
					burners.Go(func() {
						for burn.Load() {
						}
					})
				}
			}
			sleep(ctx, pauseFor-200*time.Millisecond)
			cancel() // no traffic while Redis comes back
			<-done
			switch {
			case fl.lift != nil:
				fl.lift(t, srv)
			case fl.inject == nil:
				time.Sleep(200 * time.Millisecond) // the fault's schedule: the burn's last 200 ms
				burn.Store(false)
				burners.Wait()
			}
			// Within 1s on a quiet machine; a loaded one adds what it adds to
			// any call (measured before the fault, and as the lag of a timer
			// meanwhile).
			back := waitUntil(t, "every instance ready again, without traffic", 10*time.Second, f.ready)
			if within := time.Second + 2*f.healthySlack() + time.Duration(f.lag.Load()); back > within {
				t.Errorf("ready %s after Redis returned; want within %s", back, within)
			}
			// Traffic again: the decisions come from Redis.
			f.coldDegraded.Store(0)
			f.coldCalls.Store(0)
			ctx, cancel = context.WithCancel(context.Background())
			done = make(chan struct{})
			go func() {
				f.run(ctx, fl.name)
				close(done)
			}()
			sleep(ctx, 700*time.Millisecond)
			cancel()
			<-done
			for i, g := range f.guards {
				st := g.Stats()
				t.Logf("instance %d: calls %d errors %d busy %d openings %d degraded %v", i, st.Calls, st.Errors, st.Busy, st.Openings, st.Degraded)
			}
			// Decisions come from Redis again (a loaded machine may still
			// miss a deadline now and then).
			if n, all := f.coldDegraded.Load(), f.coldCalls.Load(); all == n {
				t.Errorf("all %d cold decisions degraded after recovery", n)
			}
			f.check(t, fl)
		})
	}
}

// healthySlack is what the machine adds to a call: at least 250ms, or
// four times the slowest call before any fault (-race, a CI machine shared
// with other builds: its scheduler delays any goroutine).
func (f *fleet) healthySlack() time.Duration {
	return max(250*time.Millisecond, 4*time.Duration(f.worstHealthy.Load()))
}

// check compares each policy's admissions with its bound, and the slowest
// call with the deadline: a call returns at its deadline however long
// Redis is away (2s), give or take what the machine adds to any call and
// how late it ran a goroutine whose timer fired during the round (a
// CPU-starved machine runs a timed-out call late, not the guard).
func (f *fleet) check(t *testing.T, fl fault) {
	t.Helper()
	slack := f.healthySlack() + time.Duration(f.lag.Load())
	t.Logf("slowest call since the fault %s, before %s; timer lag %s", time.Duration(f.worst.Load()), time.Duration(f.worstHealthy.Load()), time.Duration(f.lag.Load()))
	if w := time.Duration(f.worst.Load()); w > timeout+slack {
		t.Errorf("slowest call %s; deadline %s + slack %s (timer lag %s)", w, timeout, slack, time.Duration(f.lag.Load()))
	}
	for _, p := range policies {
		tl := &f.tally[p]
		ideal := f.ideal(p)
		if fl.lost {
			ideal += float64(hotLimit.Burst) // Redis forgot the key
		}
		ratio := float64(tl.admitted.Load()) / ideal
		t.Logf("%-11s admitted %5d, ideal %6.0f, ratio %.2f, degraded %d, errors %d", p, tl.admitted.Load(), ideal, ratio, tl.degraded.Load(), tl.errors.Load())
		var bound float64
		switch p {
		case guard.Local:
			bound = 1.1
		case guard.FailClosed, guard.ReturnError:
			bound = 1.01
		default:
			continue // fail_open has no bound
		}
		if ratio > bound {
			t.Errorf("%s admitted %d, %.2f × what the limit allows (%.0f); bound %.2f", p, tl.admitted.Load(), ratio, ideal, bound)
		}
	}
}

// BenchmarkPauseOverAdmission runs the chaos load through a 2s CLIENT
// PAUSE and reports, per policy, admitted ÷ what the hot key's limit
// allows over the run, beside fail_open, the baseline without a bound.
// make bench runs it; docs/BENCHMARKS.md records the figures.
func BenchmarkPauseOverAdmission(b *testing.B) {
	for range b.N {
		srv := redistest.NewStandalone(b)
		f := newFleet(b, srv.URL())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			f.run(ctx, "bench")
			close(done)
		}()
		sleep(ctx, 700*time.Millisecond)
		faults[0].inject(b, srv)
		sleep(ctx, pauseFor+time.Second) // the pause, then a second of Redis
		cancel()
		<-done
		for _, p := range policies {
			ratio := float64(f.tally[p].admitted.Load()) / f.ideal(p)
			b.ReportMetric(ratio, "ratio_"+p.String())
		}
		b.Logf("admitted ÷ limit over a 2s CLIENT PAUSE (3 instances, %d callers per hot key): local %.2f, fail_closed %.2f, error %.2f; fail_open (baseline) %.2f",
			hotCallers, float64(f.tally[guard.Local].admitted.Load())/f.ideal(guard.Local),
			float64(f.tally[guard.FailClosed].admitted.Load())/f.ideal(guard.FailClosed),
			float64(f.tally[guard.ReturnError].admitted.Load())/f.ideal(guard.ReturnError),
			float64(f.tally[guard.FailOpen].admitted.Load())/f.ideal(guard.FailOpen))
	}
}
