package rlqs_test

import (
	"context"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/envoyrls"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/internal/rlqs"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/redisstore"
)

func TestMain(m *testing.M) { redistest.Main(m) }

const (
	fleetLimit    = 500 // requests per second, for the whole fleet
	fleetInterval = time.Second
	fleetEnvoys   = 5
)

func fleetConfig() *rlqs.Config {
	return &rlqs.Config{
		ReportInterval: fleetInterval,
		Domains: []rlqs.Domain{{Domain: "envoy", Policies: []rlqs.Policy{
			{Name: "blocked", Match: map[string]string{"route": "admin"}, Denied: true},
			{Name: "per-route", Match: map[string]string{"route": "*"}, RequestsPerUnit: fleetLimit, Unit: "second"},
		}}},
	}
}

// instance is one sluice serving RLS and RLQS on its Envoy gRPC port
// (envoyrls.Runner, as sluice serve wires it), restartable on its address.
type instance struct {
	t      *testing.T
	store  sluice.Store
	prefix string
	dir    string
	cfg    *rlqs.Config          // default fleetConfig()
	log    *slog.Logger          // default discarded
	reg    prometheus.Registerer // default none
	global *rlqs.Global          // the other regions, for global policies
	q      *rlqs.Server          // the running quota server
	addr   string
	cancel context.CancelFunc
	done   chan error
}

func (in *instance) start() {
	in.t.Helper()
	svc, err := envoyrls.New(envoyrls.Options{Store: in.store, ConfigDir: in.dir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		in.t.Fatal(err)
	}
	cfg, log := in.cfg, in.log
	if cfg == nil {
		cfg = fleetConfig()
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	q, err := rlqs.New(rlqs.Options{Store: in.store, Config: cfg, Prefix: in.prefix, Logger: log, Registerer: in.reg, Global: in.global})
	if err != nil {
		in.t.Fatal(err)
	}
	in.q = q
	addr := in.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	listening := make(chan string, 1)
	r := &envoyrls.Runner{Service: svc, GRPCAddr: addr, Extras: []envoyrls.Extra{q},
		OnListen: func(_ string, a net.Addr) { listening <- a.String() }}
	ctx, cancel := context.WithCancel(context.Background())
	in.cancel, in.done = cancel, make(chan error, 1)
	go func() { in.done <- r.Run(ctx) }()
	select {
	case in.addr = <-listening:
	case err := <-in.done:
		in.t.Fatalf("instance: %v", err)
	}
}

// stop stops the instance as sluice serve does: Drain, then the graceful
// stop, which must not wait for the open streams.
func (in *instance) stop() {
	in.cancel()
	if err := <-in.done; err != nil {
		in.t.Errorf("instance stop: %v", err)
	}
}

func rlsDir(t *testing.T) string {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rls.yaml"), []byte("domain: rls\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// fleetCase is one way a fleet of Envoys meets the service.
type fleetCase struct {
	name   string
	phase  func(i int) time.Duration // when envoy i first reports, from the start
	demand float64                   // the fleet's demand, × the limit
	faults bool                      // a stream cut and an instance restart at 4 s, Redis paused 2 s at 4.2 s
	move   bool                      // at 3 s the 60 % moves from envoy 0 to envoy 1
}

var fleetCases = []fleetCase{
	// All started together: every report of every Envoy at the same
	// instant, the race a peek-then-take lost (#36).
	{name: "coincident/4x", phase: func(int) time.Duration { return 0 }, demand: 4},
	{name: "coincident/1.5x", phase: func(int) time.Duration { return 0 }, demand: 1.5},
	{name: "staggered/4x", phase: func(i int) time.Duration { return time.Duration(i) * fleetInterval / fleetEnvoys }, demand: 4},
	{name: "staggered/4x/moved", phase: func(i int) time.Duration { return time.Duration(i) * fleetInterval / fleetEnvoys }, demand: 4, move: true},
	{name: "staggered/4x/faults", phase: func(i int) time.Duration { return time.Duration(i) * fleetInterval / fleetEnvoys }, demand: 4, faults: true},
	{name: "random/1.5x", phase: func(i int) time.Duration {
		return time.Duration(rand.New(rand.NewPCG(36, uint64(i))).Int64N(int64(fleetInterval)))
	}, demand: 1.5},
}

// TestFleetRedis: five simulated Envoys, one with 60 % of the demand,
// against three sluice instances sharing one real Redis, each Envoy's
// stream landing on any instance (each dials the instances in its own
// order, as a round-robin balancer would send them). In every window of
// one second the fleet admits at most the documented bound; once the
// shares have settled (two report intervals after the first demand is
// known) at least 95 % of the limit, the large Envoy its share by demand.
func TestFleetRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := rlsDir(t)
	for _, fc := range fleetCases {
		t.Run(fc.name, func(t *testing.T) {
			t.Parallel()
			srv := srv
			if fc.faults {
				srv = redistest.NewStandalone(t) // its own, to pause
			}
			prefix := redistest.Prefix(t)
			var ins []*instance
			var addrs []string
			for range 3 {
				st, err := redisstore.New(context.Background(), redisstore.Options{URL: srv.URL(), DisableDenyCache: true})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = st.Close() })
				in := &instance{t: t, store: st, prefix: prefix, dir: dir}
				in.start()
				t.Cleanup(in.stop)
				ins = append(ins, in)
				addrs = append(addrs, in.addr)
			}
			runFleet(t, fc, addrs, func() {
				ins[0].stop()
				ins[0].start()
				time.Sleep(200 * time.Millisecond) // the scenario's schedule
				if _, err := srv.Do(context.Background(), "CLIENT", "PAUSE", "2000", "ALL"); err != nil {
					t.Error(err)
				}
			})
		})
	}
}

// TestFleetMemory: the same Envoys, reports coincident, against one
// instance on the memory store (a single sluice: it is not shared).
func TestFleetMemory(t *testing.T) {
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	in := &instance{t: t, store: st, prefix: "rlqs:", dir: rlsDir(t)}
	in.start()
	defer in.stop()
	runFleet(t, fleetCases[0], []string{in.addr}, nil)
}

// runFleet drives five Envoys for 6.5 s and checks the bound and the
// utilization.
func runFleet(t *testing.T, fc fleetCase, addrs []string, faults func()) {
	t.Helper()
	const length = 6500 * time.Millisecond
	start := time.Now().Add(200 * time.Millisecond)
	rec := newRecorder(start, length)
	big := newRecorder(start, length) // envoy 0's admissions
	envoys := make([]*simEnvoy, fleetEnvoys)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range envoys {
		share := 0.1
		if i == 0 {
			share = 0.6
		}
		record := rec.record
		if i == 0 {
			record = func(at time.Time) { rec.record(at); big.record(at) }
		}
		envoys[i] = &simEnvoy{addrs: rotate(addrs, i), domain: "envoy", id: map[string]string{"route": "api"}, interval: fleetInterval, record: record, starved: rec.markStarved}
		d := share * fc.demand * fleetLimit
		demand := func() float64 { return d }
		if fc.move && i <= 1 {
			// envoy 0 and 1 swap their demands at 3 s
			other := (0.7 - share) * fc.demand * fleetLimit
			demand = func() float64 {
				if time.Since(start) >= 3*time.Second {
					return other
				}
				return d
			}
		}
		wg.Add(1)
		go func() { defer wg.Done(); envoys[i].run(ctx, start, fc.phase(i), demand) }()
	}
	defer func() { cancel(); wg.Wait() }()
	if fc.faults && faults != nil {
		time.Sleep(time.Until(start.Add(4 * time.Second))) // the scenario's schedule, not synchronisation
		envoys[2].cut()
		faults()
	}
	time.Sleep(time.Until(start.Add(length)))
	cancel()
	wg.Wait()

	if fc.move {
		// Two report intervals after the move, envoy 1 (now 60 % of the
		// demand) holds at least half of the capacity, envoy 0 (now 10 %)
		// at most a fifth.
		at := start.Add(5*time.Second + 50*time.Millisecond)
		g1, err1 := envoys[1].lastAssigned(at)
		g0, err0 := envoys[0].lastAssigned(at)
		t.Logf("%s: two intervals after the move, envoy 1 holds %d, envoy 0 %d of %d tokens per second", fc.name, g1, g0, fleetLimit)
		if err1 != nil || err0 != nil || g1 < fleetLimit/2 || g0 > fleetLimit/5 {
			t.Errorf("%s: not rebalanced within two report intervals: envoy 1 %d, envoy 0 %d (%v, %v)", fc.name, g1, g0, err1, err0)
		}
	}
	bound := fleetBound(time.Second)
	var worst int64
	var at time.Duration
	for from := time.Duration(0); from+time.Second <= length; from += 10 * time.Millisecond {
		if n := rec.between(from, from+time.Second); n > worst {
			worst, at = n, from
		}
	}
	t.Logf("%s: most in any 1 s window %d at %v (limit %d, bound %d = %.3f × the limit)", fc.name, worst, at, fleetLimit, bound, float64(bound)/fleetLimit)
	if worst > bound {
		t.Errorf("%s: admitted %d in [%v, %v) > bound %d", fc.name, worst, at, at+time.Second, bound)
	}
	// The first report carries no demand (the bucket is new); the next,
	// at 1 s plus the phase, does, and the shares settle within two
	// intervals after it: utilization is checked from 4 s.
	for _, from := range []time.Duration{4 * time.Second, 5 * time.Second} {
		if fc.faults && from >= 4*time.Second {
			continue // the cut stream's and the restarted instance's shares return within the TTL: bound only
		}
		if fc.move && from < 5*time.Second {
			continue // rebalancing: checked above
		}
		n := rec.between(from, from+time.Second)
		b := big.between(from, from+time.Second)
		t.Logf("%s [%v, %v): admitted %d (%.3f of the limit), the large envoy %d", fc.name, from, from+time.Second, n, float64(n)/fleetLimit, b)
		if rec.starvedIn(from-2*fleetInterval, from+time.Second) {
			t.Logf("%s: the simulation was starved of CPU: utilization not checked", fc.name)
			continue
		}
		if n < fleetLimit*95/100 {
			t.Errorf("%s [%v, %v): admitted %d < 95 %% of the limit", fc.name, from, from+time.Second, n)
		}
		// Shares by demand: the large Envoy wants 60 %; it gets at least
		// half of the limit once the shares have settled.
		if b < fleetLimit/2 && !fc.move {
			t.Errorf("%s [%v, %v): the large envoy admitted %d < half the limit", fc.name, from, from+time.Second, b)
		}
	}
	if fc.faults && envoys[2].reconnect < 2 {
		t.Errorf("envoy 2 reconnected %d times, want a reconnect after the cut", envoys[2].reconnect-1)
	}
}

// fleetBound is the most the fleet may admit in a window w (docs/envoy.md):
// the limit's rate over w, and for each change of assignment an Envoy may
// get in the window (one per report, and one at the window's edge), a
// fresh bucket's max_tokens: MinBurst, or BurstFraction of its share, for
// each Envoy.
func fleetBound(w time.Duration) int64 {
	changes := int64((w+fleetInterval-1)/fleetInterval) + 1
	capacity := int64(fleetLimit) // tokens per fill of 1 s
	burst := fleetEnvoys*rlqs.MinBurst + int64(math.Ceil(rlqs.BurstFraction*float64(capacity)))
	return int64(fleetLimit*w/time.Second) + changes*burst
}

func rotate(s []string, i int) []string {
	out := append([]string(nil), s[i%len(s):]...)
	return append(out, s[:i%len(s)]...)
}
