package region_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/redisstore"
	"github.com/sluice-io/sluice/region"
)

// The asynchronous mode's settings in these tests: counts delivered
// every 100ms, and a region that could not deliver a count for 1s
// answers by its failure policy (the default): the interval plus the
// longest round trip, 300ms, plus another round trip, which the first
// delivery over a connection takes to load its script (NOSCRIPT, then
// EVAL), plus 300ms for a loaded host's late rounds (first deliveries
// measured 400-810ms under -race at load 7; with 600ms, eu answered 96
// calls by its policy in its first second). δ, the
// longest a count goes undelivered, is then at most asyncStale whatever
// the faults: the bound's delay.
const (
	asyncInterval = 100 * time.Millisecond
	asyncStale    = time.Second
)

// asyncWorld is the harness's three regions where the global keys whose
// name holds "async/" are asynchronous, and the others exact.
func asyncWorld(t *testing.T, o worldOpts) *world {
	t.Helper()
	o.home = "eu"
	o.region = func(opts *region.Options) {
		opts.Async = func(req *sluice.Request) bool { return strings.Contains(req.Key, "async/") }
		opts.SyncInterval = asyncInterval
		opts.StaleAfter = asyncStale
	}
	return newWorld(t, o)
}

// maxIn is the most admissions region name made in any span d: an
// admission is made between a call's start and its return, so every
// admitted call whose [at, at+took] meets the span counts.
func (r run) maxIn(name string, d time.Duration) int64 {
	var adm []event
	for _, e := range r.events {
		if e.allowed && e.region == name {
			adm = append(adm, e)
		}
	}
	var best int64
	for _, a := range adm {
		x := a.at + a.took // spans starting at an admission's latest instant
		var n int64
		for _, e := range adm {
			if e.at <= x+d && e.at+e.took >= x {
				n++
			}
		}
		best = max(best, n)
	}
	return best
}

// asyncExtra is the asynchronous bound's excess over the limit, Σ_j
// A_j(δ): what each region admitted at most in a span δ.
func (r run) asyncExtra(d time.Duration) (sum int64, per map[string]int64) {
	per = map[string]int64{}
	for _, name := range regionNames {
		per[name] = r.maxIn(name, d)
		sum += per[name]
	}
	return sum, per
}

// checkAsync asserts the asynchronous bound: admitted ≤ C + r·t + 1 +
// Σ_j A_j(δ) for a bucket, ≤ R + Σ_j A_j(δ) per window for a fixed
// window, δ = asyncStale (docs/regions.md), and logs what the tighter δ
// of a fault-free run, the interval plus the longest round trip, gives.
func checkAsync(t *testing.T, a sluice.Algorithm, lim sluice.Limit, r run) {
	t.Helper()
	extra, per := r.asyncExtra(asyncStale)
	tight, _ := r.asyncExtra(asyncInterval + 2*oneWay("ap", "eu"))
	if a == sluice.FixedWindow {
		ws := checkWindowsOver(t, lim, r, extra)
		var top int64
		for _, n := range ws {
			top = max(top, n)
		}
		t.Logf("windows %v: the fullest %d, bound %d + %d (Σ A_j(δ) %v; %d with δ = interval + RTT)", ws, top, lim.Rate, extra, per, tight)
		return
	}
	admitted := r.admitted(0, math.MaxInt64)
	ideal := float64(lim.Capacity()) + float64(lim.Rate)*r.end.Sub(r.start).Seconds()/lim.Period.Seconds()
	t.Logf("admitted %d, ideal %.0f: excess %.0f, bound + %d (Σ A_j(δ) %v; %d with δ = interval + RTT)", admitted, ideal, float64(admitted)-ideal, extra, per, tight)
	if float64(admitted) > ideal+1+float64(extra) {
		t.Fatalf("admitted %d > ideal %.1f + 1 + %d", admitted, ideal, extra)
	}
}

// wholeUse is what a bucket's run admitted against its ideal, C + r·t.
func wholeUse(lim sluice.Limit, r run) float64 {
	ideal := float64(lim.Capacity()) + float64(lim.Rate)*r.end.Sub(r.start).Seconds()/lim.Period.Seconds()
	return float64(r.admitted(0, math.MaxInt64)) / ideal
}

// The asynchronous mode in the scenarios of TestGlobalBound (even, 90%
// in one region, a client hopping regions every 100ms; twice the limit
// for 3s): every region decides on its own store, the bound Σ A_j(δ)
// over the limit holds, and for GCRA the use is at least the exact
// mode's, measured in the same world just before.
func TestAsyncBound(t *testing.T) {
	w := asyncWorld(t, worldOpts{})
	bucket := sluice.Limit{Rate: 400, Period: time.Second, Burst: 100}
	window := sluice.Limit{Rate: 400, Period: time.Second}
	for _, c := range []struct {
		name    string
		a       sluice.Algorithm
		lim     sluice.Limit
		share   func(time.Duration) []float64
		compare bool // also run the exact mode and compare the use
	}{
		{"gcra/even", sluice.GCRA, bucket, even, true},
		{"gcra/skewed", sluice.GCRA, bucket, skewed, true},
		{"gcra/hopping", sluice.GCRA, bucket, hopping, false},
		{"tokenbucket/even", sluice.TokenBucket, bucket, even, false},
		{"fixedwindow/even", sluice.FixedWindow, window, even, false},
		{"fixedwindow/skewed", sluice.FixedWindow, window, skewed, false},
		{"fixedwindow/hopping", sluice.FixedWindow, window, hopping, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := 3 * time.Second
			if soak() {
				d = time.Minute
			}
			var exact float64
			if c.compare {
				req := sluice.Request{Key: w.global + "exact/" + c.name, Algorithm: c.a, Limit: c.lim, Cost: 1}
				var held1 int64
				r := w.run(t, load{req: req, rate: 2 * float64(c.lim.Rate), d: d, share: c.share, during: func(_ context.Context, start time.Time) {
					time.Sleep(time.Until(start.Add(time.Second))) // the measure's schedule
					held1 = w.held(t, req.Key)
				}})
				// Use is what was admitted of the ideal over the whole
				// run, in both modes: what the exact mode's shares hold is
				// charged but not admitted, and its first fetches take a
				// round trip, where each region of the asynchronous mode
				// spends a burst at once.
				exact = wholeUse(c.lim, r)
				t.Logf("exact: %s; admitted %.3f of the ideal; after 1s %.3f of the limit with what shares grew by", r, exact, utilization(c.lim, r, held1, w.held(t, req.Key)))
			}
			req := sluice.Request{Key: w.global + "async/" + c.name, Algorithm: c.a, Limit: c.lim, Cost: 1}
			r := w.run(t, load{req: req, rate: 2 * float64(c.lim.Rate), d: d, share: c.share})
			t.Logf("async: %s", r)
			t.Logf("degraded at %v", r.degradedAt())
			for _, name := range regionNames {
				for _, s := range w.inst[name] {
					t.Logf("%s: %+v", name, s.Stats())
				}
			}
			if n, err := r.errs(); n > 0 {
				t.Fatalf("%d errors, first: %v", n, err)
			}
			if n := r.count("", 0, math.MaxInt64, func(e event) bool { return e.src == sluice.FromShare }); n > 0 {
				t.Fatalf("%d decisions from shares: an asynchronous key is decided by the region's store", n)
			}
			checkAsync(t, c.a, c.lim, r)
			if c.a == sluice.FixedWindow {
				return
			}
			u := wholeUse(c.lim, r)
			t.Logf("async: admitted %.3f of the ideal (exact %.3f); after 1s %.3f of the limit", u, exact, utilization(c.lim, r, 0, 0))
			if c.compare && r.offered(t, 2*float64(c.lim.Rate), time.Second) && u < exact {
				t.Fatalf("async use %.3f < the exact mode's %.3f", u, exact)
			}
		})
	}
}

// degradedAt lists, by region, when decisions were answered by the
// failure policy.
func (r run) degradedAt() map[string][]time.Duration {
	m := map[string][]time.Duration{}
	for _, e := range r.events {
		if e.degraded {
			m[e.region] = append(m[e.region], e.at.Round(10*time.Millisecond))
		}
	}
	return m
}

// ap's link to eu is cut for 2s (the 60s, scaled down; a minute
// in make soak-regions) of a run at twice the limit spread evenly: ap's
// counts stop reaching eu, and once the oldest is StaleAfter old, ap
// answers by its failure policy (fail_closed) while eu and us go on; after
// the heal ap delivers what it held and decides again. The bound holds
// throughout: what eu did not hear of is at most what ap admitted in
// StaleAfter.
func TestAsyncPartition(t *testing.T) {
	w := asyncWorld(t, worldOpts{})
	for _, c := range []struct {
		a   sluice.Algorithm
		lim sluice.Limit
	}{
		{sluice.GCRA, sluice.Limit{Rate: 400, Period: time.Second, Burst: 100}},
		{sluice.FixedWindow, sluice.Limit{Rate: 400, Period: time.Second}},
	} {
		t.Run(c.a.String(), func(t *testing.T) {
			cutAt, healAt, d := time.Second, 3*time.Second, 7*time.Second
			if soak() {
				cutAt, healAt, d = 5*time.Second, 65*time.Second, 75*time.Second
			}
			link := w.link[[2]string{"ap", "eu"}]
			req := sluice.Request{Key: w.global + "async/partition/" + c.a.String(), Algorithm: c.a, Limit: c.lim, Cost: 1}
			r := w.run(t, load{req: req, rate: 800, d: d, share: even, during: func(ctx context.Context, start time.Time) {
				// The fault's schedule, not a synchronisation.
				time.Sleep(time.Until(start.Add(cutAt)))
				link.Partition()
				time.Sleep(time.Until(start.Add(healAt)))
				link.Heal()
			}})
			t.Log(r)
			deg := r.degradedAt()
			for _, name := range regionNames {
				if n := len(deg[name]); n > 0 {
					t.Logf("%s degraded %d times, %s to %s", name, n, deg[name][0], deg[name][n-1])
				}
				for _, s := range w.inst[name] {
					t.Logf("%s: %+v", name, s.Stats())
				}
			}
			if n, err := r.errs(); n > 0 {
				t.Fatalf("%d errors, first: %v", n, err)
			}
			checkAsync(t, c.a, c.lim, r)
			degraded := func(e event) bool { return e.degraded }
			if n := r.count("ap", cutAt, healAt, degraded); n == 0 {
				t.Fatal("ap's failure policy never answered during the partition")
			}
			// eu and us are not cut off: their counts reach every region.
			// A loaded host delays a delivery past StaleAfter at times
			// (eu: 4-32 of 3700 decisions under -race at load 7-11, at the
			// start or around the cut), and the policy answers then, as it
			// must; a partition that leaked to them would put them under
			// it for the whole 2s (~1200 decisions).
			others := r.count("", 0, math.MaxInt64, func(e event) bool { return e.region != "ap" })
			if n := r.count("", 0, math.MaxInt64, func(e event) bool { return e.degraded && e.region != "ap" }); n > others/50 {
				t.Fatalf("%d degraded decisions of %d outside the partitioned region", n, others)
			}
			// After the heal, ap's deliveries in flight in the partition
			// fail when the link closes them, the next round redials and
			// delivers (TCP, HELLO, the script: round trips of 300ms):
			// 3.5s is the exact mode's margin for a loaded host.
			back := healAt + 3500*time.Millisecond
			if n := r.count("ap", back, math.MaxInt64, degraded); n > 0 && r.offered(t, 800, 0) {
				t.Fatalf("ap still degraded %s after the heal (%d decisions)", back-healAt, n)
			}
			if n := r.count("ap", back, math.MaxInt64, func(e event) bool { return e.allowed }); n == 0 {
				t.Fatal("ap admitted nothing after the heal")
			}
		})
	}
}

// eu's redis-server (persisted, as in TestGlobalHomeRestart) is killed
// and restarted mid-run: eu's calls fail while it is down, the others'
// deliveries to it fail and are retried, and the bound holds.
func TestAsyncHomeRestart(t *testing.T) {
	w := asyncWorld(t, worldOpts{persist: true})
	lim := sluice.Limit{Rate: 400, Period: time.Second, Burst: 100}
	req := sluice.Request{Key: w.global + "async/restart", Algorithm: sluice.GCRA, Limit: lim, Cost: 1}
	r := w.run(t, load{req: req, rate: 800, d: 3 * time.Second, share: even, during: func(ctx context.Context, start time.Time) {
		time.Sleep(time.Until(start.Add(time.Second))) // the fault's schedule
		w.srv["eu"].Restart(t)
	}})
	t.Log(r)
	t.Logf("degraded at %v", r.degradedAt())
	if n := r.count("", 0, math.MaxInt64, func(e event) bool { return e.err != nil && e.region != "eu" }); n > 0 {
		t.Fatalf("%d errors outside the restarted region", n)
	}
	checkAsync(t, sluice.GCRA, lim, r)
	if n := r.count("", 2500*time.Millisecond, math.MaxInt64, func(e event) bool { return e.err != nil }); n > 0 {
		t.Fatalf("%d errors long after the restart", n)
	}
}

// One region (us) of an asynchronous key and another (eu), each its own
// redis-server (eu's persisted, so that it comes back with what it was
// charged), every clock the fake one, rounds run by the test: what us
// admits is charged to eu's store by the next round; a count that cannot
// be delivered for StaleAfter puts the key under the failure policy in us
// until a round delivers it.
func TestAsyncCountsDelivered(t *testing.T) {
	clk := clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	usSrv, euSrv := redistest.NewStandalone(t), redistest.NewStandalone(t, "--appendonly", "yes", "--appendfsync", "always")
	open := func(url string) *redisstore.Store {
		s, err := redisstore.New(context.Background(), redisstore.Options{URL: url, Clock: clk, Timeout: time.Second, DisableDenyCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	local, eu := open(usSrv.URL()), open(euSrv.URL())
	s, err := region.New(region.Options{
		Region:       "us",
		Regions:      map[string]sluice.Store{"us": local, "eu": eu},
		Ledger:       local.Client(),
		Global:       func(*sluice.Request) bool { return true },
		Async:        func(*sluice.Request) bool { return true },
		Clock:        clk,
		LedgerClock:  clk,
		SweepEvery:   -1,
		SyncInterval: -1,
		StaleAfter:   time.Second,
		FetchTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	// 10 at once, refilled at 10 a minute: refill is negligible here.
	req := sluice.Request{Key: redistest.Prefix(t) + "async", Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 10, Period: time.Minute, Burst: 10}, Cost: 1}
	allow := func(want bool) sluice.Decision {
		t.Helper()
		d, err := s.Apply(ctx, sluice.OpAllow, req)
		if err != nil || d.Allowed != want {
			t.Fatalf("allow: %+v %v, want allowed %v", d, err, want)
		}
		return d
	}
	euLeft := func() int64 {
		t.Helper()
		p := req
		p.Cost = 0
		d, err := eu.Apply(ctx, sluice.OpPeek, p)
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}
	for range 3 {
		if d := allow(true); d.Source != sluice.FromStore || d.Degraded {
			t.Fatalf("decided by %v, degraded %v: want us's store", d.Source, d.Degraded)
		}
	}
	if n := euLeft(); n != 10 {
		t.Fatalf("eu has %d left before a round, want 10", n)
	}
	s.Sync(ctx)
	if n := euLeft(); n != 7 {
		t.Fatalf("eu has %d left after a round, want 7 (us admitted 3)", n)
	}
	// eu goes down: us still decides, and holds its counts.
	euSrv.Kill()
	allow(true)
	allow(true)
	s.Sync(ctx)
	if st := s.Stats(); st.SyncErrors == 0 || st.Synced != 3 {
		t.Fatalf("stats %+v: want a failed delivery and 3 units delivered", st)
	}
	clk.Advance(999 * time.Millisecond)
	allow(true) // the oldest count undelivered is 999ms old: not stale yet
	clk.Advance(2 * time.Millisecond)
	d, _ := s.Apply(ctx, sluice.OpAllow, req)
	if d.Allowed || !d.Degraded || d.Fallback != "fail_closed" {
		t.Fatalf("with a count undelivered for over StaleAfter: %+v, want the failure policy's denial", d)
	}
	// eu is back with what it was charged: the round delivers the three
	// units us held, and us decides again.
	euSrv.Restart(t)
	redistest.WaitUntil(t, "a round delivers to eu", 10*time.Second, func() bool {
		s.Sync(ctx)
		return s.Stats().Synced == 6
	})
	if n := euLeft(); n != 4 {
		t.Fatalf("eu has %d left, want 4 (us admitted 6)", n)
	}
	allow(true)

	// An instance tracking MaxKeys already cannot count a new key's
	// admissions for delivery: fail_closed denies it.
	one, err := region.New(region.Options{
		Region: "us", Regions: map[string]sluice.Store{"us": local, "eu": eu}, Ledger: local.Client(),
		Global: func(*sluice.Request) bool { return true }, Async: func(*sluice.Request) bool { return true },
		Clock: clk, LedgerClock: clk, SweepEvery: -1, SyncInterval: -1, MaxKeys: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = one.Close() })
	if d, err := one.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed {
		t.Fatalf("first key: %+v %v", d, err)
	}
	other := req
	other.Key += ":other"
	if d, err := one.Apply(ctx, sluice.OpAllow, other); err != nil || d.Allowed || !d.Degraded {
		t.Fatalf("a key past MaxKeys: %+v %v, want fail_closed's denial", d, err)
	}
}

// TestAsyncKeyFloodForgotten: an instance tracking MaxKeys asynchronous
// keys (here one, filled by one client's key) forgets a key two sync
// rounds after its last use once its counts are delivered, so a flood of
// new keys holds the table for 2 × SyncInterval, not IdleAfter (an hour
// here): another client's new key is then counted, not answered by the
// failure policy.
func TestAsyncKeyFloodForgotten(t *testing.T) {
	clk := clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	usSrv, euSrv := redistest.NewStandalone(t), redistest.NewStandalone(t)
	open := func(url string) *redisstore.Store {
		s, err := redisstore.New(context.Background(), redisstore.Options{URL: url, Clock: clk, Timeout: time.Second, DisableDenyCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	local, eu := open(usSrv.URL()), open(euSrv.URL())
	s, err := region.New(region.Options{
		Region: "us", Regions: map[string]sluice.Store{"us": local, "eu": eu}, Ledger: local.Client(),
		Global: func(*sluice.Request) bool { return true }, Async: func(*sluice.Request) bool { return true },
		Clock: clk, LedgerClock: clk, SweepEvery: -1, MaxKeys: 1, IdleAfter: time.Hour,
		// The loop runs too (by the real clock); the test's own rounds
		// are the ones that count, on the fake clock.
		SyncInterval: 50 * time.Millisecond, StaleAfter: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	lim := sluice.Limit{Rate: 10, Period: time.Minute, Burst: 10}
	flood := sluice.Request{Key: redistest.Prefix(t) + "flood:1", Algorithm: sluice.GCRA, Limit: lim, Cost: 1}
	if d, err := s.Apply(ctx, sluice.OpAllow, flood); err != nil || !d.Allowed {
		t.Fatalf("the flood's key: %+v %v", d, err)
	}
	other := flood
	other.Key = redistest.Prefix(t) + "other"
	if d, err := s.Apply(ctx, sluice.OpAllow, other); err != nil || d.Allowed || !d.Degraded {
		t.Fatalf("a key past MaxKeys while the flood's is held: %+v %v, want the failure policy", d, err)
	}
	clk.Advance(200 * time.Millisecond)
	s.Sync(ctx) // delivers the flood key's count
	s.Sync(ctx) // nothing left, unused for two rounds: forgotten
	if d, err := s.Apply(ctx, sluice.OpAllow, other); err != nil || !d.Allowed || d.Degraded {
		t.Fatalf("another client's key two rounds after the flood's: %+v %v, want counted and admitted", d, err)
	}
}
