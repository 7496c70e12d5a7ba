package region_test

import (
	"context"
	"math"
	"os"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/region"
)

// soak reports a run of make soak-regions: faults and loads at the
// issue's real lengths (a minute), not the suite's seconds.
func soak() bool { return os.Getenv("SLUICE_REGIONS_SOAK") != "" }

// count counts a run's events of region r in [from, to) that pass f.
func (r run) count(region string, from, to time.Duration, f func(event) bool) (n int) {
	for _, e := range r.events {
		if (region == "" || e.region == region) && e.at >= from && e.at < to && f(e) {
			n++
		}
	}
	return n
}

// ap, 150ms from the home, is partitioned from it for a second of a
// 6.5-second run at twice the limit spread evenly: it spends the shares
// it holds, then its failure policy (fail_closed) denies; the others go on
// with the whole limit. Once the link heals, ap takes shares again, and
// the bound holds throughout.
func TestGlobalPartition(t *testing.T) {
	w := newWorld(t, worldOpts{home: "eu"})
	for _, c := range []struct {
		a   sluice.Algorithm
		lim sluice.Limit
	}{
		{sluice.GCRA, sluice.Limit{Rate: 400, Period: time.Second, Burst: 100}},
		{sluice.FixedWindow, sluice.Limit{Rate: 400, Period: time.Second}},
	} {
		t.Run(c.a.String(), func(t *testing.T) {
			cutAt, healAt, d := time.Second, 2*time.Second, 6500*time.Millisecond // a second checked after back
			if soak() {
				// make soak-regions: the minute-long partition.
				cutAt, healAt, d = 5*time.Second, 65*time.Second, 75*time.Second
			}
			link := w.link[[2]string{"ap", "eu"}]
			req := sluice.Request{Key: w.global + c.a.String(), Algorithm: c.a, Limit: c.lim, Cost: 1}
			r := w.run(t, load{req: req, rate: 800, d: d, share: even, during: func(ctx context.Context, start time.Time) {
				// The fault's schedule, not a synchronisation.
				time.Sleep(time.Until(start.Add(cutAt)))
				link.Partition()
				time.Sleep(time.Until(start.Add(healAt)))
				link.Heal()
			}})
			t.Log(r)
			if n, err := r.errs(); n > 0 {
				t.Fatalf("%d errors, first: %v", n, err)
			}
			if c.a == sluice.FixedWindow {
				checkWindows(t, c.lim, r)
			} else {
				a, ideal := checkBucket(t, c.lim, r)
				t.Logf("admitted %d of an ideal %.0f", a, ideal)
			}
			degraded := func(e event) bool { return e.degraded }
			fromShare := func(e event) bool { return e.allowed && e.src == sluice.FromShare }
			if n := r.count("ap", cutAt, healAt, degraded); n == 0 {
				t.Fatal("ap's failure policy never answered during the partition")
			}
			if n := r.count("", 0, math.MaxInt64, func(e event) bool { return e.degraded && e.region != "ap" }); n > 0 {
				t.Fatalf("%d degraded decisions outside the partitioned region", n)
			}
			// After the heal each instance retries its failed fetch after
			// DownRetry (500ms), on a new connection: TCP, HELLO and the
			// fetch, a round trip (300ms) each. Measured under -race: the
			// two instances back 0.95s and 1.43s after the heal (the
			// second's last attempt was hanging in the partition until
			// the heal). 3.5s leaves a margin for a loaded host (at load
			// 20 under -race the last degraded answer came 2.0-2.5s
			// after the heal); a host that could not even offer the
			// planned calls is too starved to time this, and says so.
			back := healAt + 3500*time.Millisecond
			// ap's fetches reach the home again: no ap decision is
			// degraded from back on (asserted below), which takes a fetch
			// answered by the home. What ap then spends depends on the
			// races it wins there: at twice the limit the home serves
			// fetches as they come, and ap's, 150ms away, lose more of them
			// to eu's own calls and us's fetches (docs/regions.md,
			// fairness; measured: ap's first share 0.9-2.4s after the heal
			// under -race), so it is logged, not asserted.
			t.Logf("ap admitted %d from shares after the heal", r.count("ap", healAt, math.MaxInt64, fromShare))
			var lastDeg, firstShare time.Duration
			for _, e := range r.events {
				if e.region == "ap" && e.degraded {
					lastDeg = e.at
				}
				if e.region == "ap" && e.at > healAt && firstShare == 0 && fromShare(e) {
					firstShare = e.at
				}
			}
			t.Logf("ap: last degraded at %s, first share after the heal at %s", lastDeg, firstShare)
			if n := r.count("ap", back, math.MaxInt64, degraded); n > 0 {
				if !r.offered(t, 800, 0) {
					t.Logf("ap still degraded %s after the heal (%d decisions) on a host too loaded to offer the planned calls: not asserted", back-healAt, n)
				} else {
					t.Fatalf("ap still degraded %s after the heal (%d decisions)", back-healAt, n)
				}
			}
			// During the partition the others use the limit.
			if c.a != sluice.FixedWindow && r.offered(t, 800, 0) {
				got := float64(r.count("", cutAt+300*time.Millisecond, healAt, func(e event) bool { return e.allowed }))
				// 0.8: eu and us are offered 1.33× the limit, and a
				// loaded host (load 20, -race) delivered fewer calls
				// than offered (measured 0.90-1.0 of the limit).
				want := 0.8 * float64(c.lim.Rate) * 0.7
				if got < want {
					t.Fatalf("admitted %.0f during the partition, want ≥ %.0f", got, want)
				}
			}
			// After the heal, from two share intervals (2 × Horizon, 500
			// ms) on, the fleet uses the limit (#40: ≥ 95 % within two
			// share intervals): eu and us never stopped, and ap's demand
			// adds to theirs once it fetches again. For the bucket:
			// admitted over [heal + 500 ms, end] against the rate.
			if c.a != sluice.FixedWindow && r.offered(t, 800, healAt) {
				from := healAt + 2*region.DefaultHorizon
				got := float64(r.count("", from, r.planned, func(e event) bool { return e.allowed }))
				u := got / (float64(c.lim.Rate) * (r.planned - from).Seconds())
				t.Logf("use from two share intervals after the heal: %.3f", u)
				if u < floor(0.95) {
					t.Fatalf("use %.3f < %.2f from two share intervals after the heal", u, floor(0.95))
				}
			}
			for _, name := range regionNames {
				for _, s := range w.inst[name] {
					t.Logf("%s: %+v", name, s.Stats())
				}
			}
		})
	}
}

// The home region's redis-server is killed and restarted mid-run. It
// writes every change to its append-only file before answering
// (appendfsync always), as docs/regions.md requires of a home, so it
// comes back with the charges it made: the bound holds, and the shares
// the other regions hold carry them through the restart.
func TestGlobalHomeRestart(t *testing.T) {
	w := newWorld(t, worldOpts{home: "eu", persist: true})
	lim := sluice.Limit{Rate: 400, Period: time.Second, Burst: 100}
	req := sluice.Request{Key: w.global + "gcra", Algorithm: sluice.GCRA, Limit: lim, Cost: 1}
	const killAt = time.Second
	r := w.run(t, load{req: req, rate: 800, d: 3 * time.Second, share: even, during: func(ctx context.Context, start time.Time) {
		time.Sleep(time.Until(start.Add(killAt))) // the fault's schedule
		w.srv["eu"].Restart(t)
	}})
	t.Log(r)
	// eu's own calls fail while its Redis is down (a guard would answer
	// them by its policy); no other region sees an error.
	if n := r.count("", 0, math.MaxInt64, func(e event) bool { return e.err != nil && e.region != "eu" }); n > 0 {
		t.Fatalf("%d errors outside the home region", n)
	}
	a, ideal := checkBucket(t, lim, r)
	t.Logf("admitted %d of an ideal %.0f", a, ideal)
	if n := r.count("", 2500*time.Millisecond, math.MaxInt64, func(e event) bool { return e.err != nil }); n > 0 {
		t.Fatalf("%d errors long after the restart", n)
	}
}

// ap's own redis-server, which holds its shares, is restarted with no
// persistence: the shares it held are lost (under-admission only), its
// instances fail until it is back, and then fetch again.
func TestGlobalRegionRestart(t *testing.T) {
	w := newWorld(t, worldOpts{home: "eu"})
	// Most of the demand in ap, the burst a second's rate (docs/regions.md,
	// sizing): ap then takes most of the limit, and what it takes after
	// its restart shows.
	lim := sluice.Limit{Rate: 400, Period: time.Second, Burst: 400}
	req := sluice.Request{Key: w.global + "gcra", Algorithm: sluice.GCRA, Limit: lim, Cost: 1}
	toAP := func(time.Duration) []float64 { return []float64{0.05, 0.05, 0.9} }
	var back time.Duration // when ap's Redis was up again
	r := w.run(t, load{req: req, rate: 800, d: 3 * time.Second, share: toAP, during: func(ctx context.Context, start time.Time) {
		time.Sleep(time.Until(start.Add(time.Second))) // the fault's schedule
		w.srv["ap"].Restart(t)
		back = time.Since(start)
	}})
	t.Log(r)
	if n := r.count("", 0, math.MaxInt64, func(e event) bool { return e.err != nil && e.region != "ap" }); n > 0 {
		t.Fatalf("%d errors outside the restarted region", n)
	}
	a, ideal := checkBucket(t, lim, r)
	t.Logf("admitted %d of an ideal %.0f; ap's Redis back at %s", a, ideal, back)
	if n := r.count("ap", back, math.MaxInt64, func(e event) bool { return e.allowed && e.src == sluice.FromShare }); n == 0 {
		t.Fatal("ap admitted nothing from shares after its restart")
	}
}

// The home region's redis-server is killed and restarted without
// persistence mid-run: it comes back empty, its bucket full and the
// charges it made forgotten, while us and ap still hold shares charged
// before. The key's epoch marker went with the data (epoch.go): the
// first instance to check it afterwards charges the key's capacity at the
// home, so the bucket is as if spent at the restart, and the bound holds:
// ≤ C + r·t + 2 (one + 1 per life of the home's state). The burst is four
// seconds of the rate and the demand four times the limit, so that the
// bucket is spent before the restart (at 1.33s) and a home that forgot
// would admit a fresh burst of 1600, far more than the restart's downtime
// takes back (the ideal grows by r meanwhile: measured ~1s, 400).
func TestGlobalHomeRestartUnpersisted(t *testing.T) {
	w := newWorld(t, worldOpts{home: "eu"})
	lim := sluice.Limit{Rate: 400, Period: time.Second, Burst: 1600}
	req := sluice.Request{Key: w.global + "gcra", Algorithm: sluice.GCRA, Limit: lim, Cost: 1}
	const killAt = 1500 * time.Millisecond
	var held int64
	r := w.run(t, load{req: req, rate: 1600, d: 3500 * time.Millisecond, share: even, during: func(ctx context.Context, start time.Time) {
		time.Sleep(time.Until(start.Add(killAt))) // the fault's schedule
		held = w.held(t, req.Key)
		w.srv["eu"].Restart(t)
	}})
	t.Log(r)
	var q uint64
	for _, name := range regionNames {
		for _, s := range w.inst[name] {
			t.Logf("%s: %+v", name, s.Stats())
			q += s.Stats().Quarantines
		}
	}
	if n := r.count("", 0, math.MaxInt64, func(e event) bool { return e.err != nil && e.region != "eu" }); n > 0 {
		t.Fatalf("%d errors outside the home region", n)
	}
	admitted := r.admitted(0, math.MaxInt64)
	ideal := float64(lim.Capacity()) + float64(lim.Rate)*r.end.Sub(r.start).Seconds()
	t.Logf("admitted %d of an ideal %.0f (%d before the restart); %d held in shares at the restart; %d quarantines", admitted, ideal, r.admitted(0, killAt), held, q)
	// The bound docs/regions.md states (failure table): C + r·t + 2, plus
	// what the home region admits between the restart and its next check,
	// and the fetches sent beside the check that finds the loss. Those two
	// terms are timing's: 0 in quiet runs, 121 once and 217 once in make
	// test runs (three race binaries on 2 cores, helpers building beside).
	// A quarter of the burst (400) bounds them here; a home that forgot
	// with no check admits a fresh burst, 1500 over (4511 measured).
	slack := 2 + float64(lim.Capacity())/4
	if float64(admitted) > ideal+slack {
		t.Fatalf("admitted %d > ideal %.1f + %.0f", admitted, ideal, slack)
	}
	if q == 0 {
		t.Fatal("no instance found that the home had lost the key's state")
	}
}
