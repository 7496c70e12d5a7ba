package lease_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/lease"
	"github.com/sluice-io/sluice/redisstore"
	"github.com/sluice-io/sluice/storetest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func newRedis(t testing.TB, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := redisstore.New(ctx, opts)
	if err != nil {
		t.Fatalf("redisstore.New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func newLease(t testing.TB, opts lease.Options) *lease.Store {
	t.Helper()
	s, err := lease.New(opts)
	if err != nil {
		t.Fatalf("lease.New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// The conformance suite against a leased Redis store: its limits are small,
// so every decision goes to the store, and the answers are Redis's.
func TestConformanceLeasedRedis(t *testing.T) {
	url := redistest.Standalone(t).URL()
	storetest.Run(t, func(t *testing.T, clk *clock.Fake) sluice.Store {
		return newLease(t, lease.Options{All: true, Store: newRedis(t, redisstore.Options{URL: url, Clock: clk}), Clock: clk, SweepEvery: -1})
	})
}

// traffic is how a fleet test offers load: each of 150 goroutines sends
// requests to one of three instances at 100 a second.
type traffic struct {
	name   string
	counts [3]int // goroutines per instance
}

var (
	uniform = traffic{"uniform", [3]int{50, 50, 50}}
	skewed  = traffic{"skewed", [3]int{135, 8, 7}} // one instance takes 90%
)

// fleetResult is what a fleet run admitted and how long it ran, in Redis
// time.
type fleetResult struct {
	admitted, degraded, local, calls int64
	start, end                       time.Time     // Redis TIME around the whole run
	drained, stopped                 time.Time     // first denial, end of load
	offeredAfter                     int64         // asked from the first denial on
	roundTrip                        time.Duration // the mean of the leases' calls to Redis
	late                             int64         // window chunk units granted after their window ended
	trace                            []call        // every call, by arrival
}

// call is one request of a fleet run: when it arrived, in Unix ns on
// Redis's clock, and whether the leased fleet admitted it.
type call struct {
	at      int64
	allowed bool
}

// runFleet offers 3× the limit's rate to one key through three leased
// stores, each on its own Redis connection, for run; pause, if set, is
// called once a third into the run, with a channel closed once a caller
// has had an error or a degraded decision.
func runFleet(t *testing.T, srv *redistest.Server, req sluice.Request, tr traffic, run time.Duration, pause func(felt <-chan struct{})) fleetResult {
	t.Helper()
	// Calls get 5 s unless the run pauses Redis: a loaded machine
	// must not turn a slow call into a degraded one.
	timeout := 5 * time.Second
	if pause != nil {
		timeout = 100 * time.Millisecond
	}
	stores := make([]*lease.Store, 3)
	var rt roundTrips
	for i := range stores {
		rs := newRedis(t, redisstore.Options{URL: srv.URL(), Timeout: timeout})
		stores[i] = newLease(t, lease.Options{All: true, Store: &timed{rs, &rt}, MaxFraction: 0.05, Instances: 3})
	}
	redisNow := func() time.Time {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for {
			r, err := srv.Do(ctx, "TIME")
			if a, ok := r.([]any); err == nil && ok && len(a) == 2 {
				var sec, us int64
				fmt.Sscan(fmt.Sprint(a[0]), &sec)
				fmt.Sscan(fmt.Sprint(a[1]), &us)
				return time.Unix(sec, us*1000)
			}
			if ctx.Err() != nil {
				t.Fatalf("TIME: %v %v", r, err)
			}
		}
	}
	var res fleetResult
	var admitted, degraded, local, calls atomic.Int64
	var drainOnce, feltOnce sync.Once
	felt := make(chan struct{})
	drained := make(chan struct{})
	var drainedAt time.Time
	var callsBase int64
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	begin := make(chan struct{})
	rate := 3 * float64(req.Limit.Rate) / req.Limit.Period.Seconds() // offered, in total
	beat := time.Duration(float64(150*time.Second) / rate)
	logs := make([][]call, 150) // one per goroutine, merged after the run
	g := 0
	for i, n := range tr.counts {
		s := stores[i]
		for range n {
			mine := &logs[g]
			g++
			wg.Go(func() {
				tick := time.NewTicker(beat)
				defer tick.Stop()
				<-begin
				for {
					select {
					case <-ctx.Done():
						return
					case <-tick.C:
					}
					at := time.Now().UnixNano()
					d, err := s.Apply(context.Background(), sluice.OpAllow, req)
					*mine = append(*mine, call{at, err == nil && d.Allowed && !d.Degraded})
					calls.Add(1)
					switch {
					case err != nil:
						// Redis failed and nothing was held: the error
						// reaches the caller (no failure policy here: that
						// is package guard's, around this store).
						degraded.Add(1)
						feltOnce.Do(func() { close(felt) })
					case d.Degraded:
						degraded.Add(1)
						feltOnce.Do(func() { close(felt) })
						if d.Allowed {
							t.Errorf("degraded admission: %+v", d)
						}
					case d.Allowed:
						admitted.Add(1)
						if d.Source == sluice.FromLease {
							local.Add(1)
						}
					default:
						drainOnce.Do(func() {
							drainedAt, callsBase = redisNow(), calls.Load()
							close(drained)
						})
					}
				}
			})
		}
	}
	// Arrivals are stamped with time.Now, and moved onto Redis's clock
	// by an offset measured once, to within half a TIME round trip
	// (Redis runs on this host, on the same clock: the offset is ~0).
	t0 := time.Now().UnixNano()
	res.start = redisNow()
	offset := res.start.UnixNano() - (t0+time.Now().UnixNano())/2
	close(begin)
	if pause != nil {
		time.AfterFunc(run/3, func() { pause(felt) })
	}
	stop := time.NewTimer(run)
	<-stop.C
	res.stopped = redisNow()
	cancel()
	wg.Wait()
	res.end = redisNow()
	res.admitted, res.degraded, res.local, res.calls = admitted.Load(), degraded.Load(), local.Load(), calls.Load()
	for _, l := range logs {
		for _, c := range l {
			res.trace = append(res.trace, call{c.at + offset, c.allowed})
		}
	}
	slices.SortFunc(res.trace, func(a, b call) int { return cmp.Compare(a.at, b.at) })
	select {
	case <-drained:
		res.drained, res.offeredAfter = drainedAt, res.calls-callsBase
	default: // the load never reached the limit
	}
	if n := rt.n.Load(); n > 0 {
		res.roundTrip = time.Duration(rt.ns.Load() / n)
	}
	res.late = rt.late.Load()
	var st lease.Stats
	for _, s := range stores {
		x := s.Stats()
		st.Hits += x.Hits
		st.Fetches += x.Fetches
		st.Returns += x.Returns
		st.Stranded += x.Stranded
	}
	// What came back late lapsed: no more than the leases say lapsed.
	res.late = min(res.late, int64(st.Stranded))
	t.Logf("%s: %d calls, %d admitted (%d from leases), %d degraded; %d fetches, %d returns, %d stranded; %d calls to Redis, %v each on average, %d units granted after their window", tr.name, res.calls, res.admitted, res.local, res.degraded, st.Fetches, st.Returns, st.Stranded, rt.n.Load(), res.roundTrip, res.late)
	return res
}

// roundTrips sums the calls leases make to Redis and their durations, and
// the window chunks that came back too late to be used.
type roundTrips struct{ n, ns, late atomic.Int64 }

// timed is a store that times the calls a lease.Store makes to it, from
// the caller's side: Redis's time, the network's, and the time the
// scheduler keeps the caller from reading the reply.
type timed struct {
	sluice.Store
	rt *roundTrips
}

func (s *timed) Apply(ctx context.Context, op sluice.Op, req sluice.Request) (sluice.Decision, error) {
	t0 := time.Now()
	d, err := s.Store.Apply(ctx, op, req)
	t1 := time.Now()
	s.rt.n.Add(1)
	s.rt.ns.Add(int64(t1.Sub(t0)))
	// A window chunk granted to a fetch (the lease's own calls carry its
	// CallTimeout; runFleet's callers pass context.Background) whose
	// reply came after the end of the window it was charged in, as the
	// lease estimates it (from when the fetch was sent, as here: it sends
	// a little earlier and receives a little later, so it finds at least
	// these late), lapses unused: capacity lost to the round trip.
	_, fetch := ctx.Deadline()
	if fetch && err == nil && op == sluice.OpAllow && d.Allowed && !d.Degraded {
		end := t0.Add(d.ResetAfter)
		switch req.Algorithm {
		case sluice.SlidingWindowCounter:
			end = end.Add(-req.Limit.Period)
			fallthrough
		case sluice.FixedWindow:
			if !t1.Before(end) {
				s.rt.late.Add(req.Cost)
			}
		}
	}
	return d, err
}

// floorMeasurable reports whether the run offered, once the limit was
// reached, at least 90% of the 3× the limit's rate it means to: only then
// is under-admission the leases' doing. A machine too loaded to run the offered load (150
// tickers at 100/s) measures its scheduler instead, and only the upper
// bound is checked.
func floorMeasurable(t *testing.T, r fleetResult, l sluice.Limit) bool {
	t.Helper()
	if r.drained.IsZero() {
		t.Logf("the load never reached the limit: floor not measured")
		return false
	}
	span := r.stopped.Sub(r.drained)
	if span < 500*time.Millisecond {
		// What the leases hold at the end (≤ 3 chunks) is then a large
		// part of the span's capacity.
		t.Logf("the limit was reached %s before the end: too short to measure the floor", span)
		return false
	}
	want := 2.7 * float64(l.Rate) * span.Seconds() / l.Period.Seconds()
	if float64(r.offeredAfter) < want {
		t.Logf("offered %d after the limit was reached, under 90%% of 3× the rate (%.0f): the machine is too loaded to measure the floor", r.offeredAfter, want)
		return false
	}
	return true
}

// bounds returns the most the limit admits over [start, end] (ideal) and
// the least a fully used limit admits over [from, to] (the floor's base).
func bounds(l sluice.Limit, a sluice.Algorithm, start, end, from, to time.Time) (ideal, base float64) {
	p := l.Period
	switch a {
	case sluice.GCRA, sluice.TokenBucket:
		perNs := float64(l.Rate) / float64(p)
		return float64(l.Capacity()) + perNs*float64(end.Sub(start)), perNs * float64(to.Sub(from))
	}
	// A window admits Rate: count the windows the run touches, and the
	// whole windows inside the loaded span.
	windows := func(a, b time.Time) int64 { return b.UnixNano()/int64(p) - a.UnixNano()/int64(p) }
	whole := max(0, windows(from, to)-1)
	return float64(l.Rate * (windows(start, end) + 1)), float64(l.Rate * whole)
}

// afterDrain returns how many of the calls that arrived once the limit was
// reached (from the first denial to the end of the load) the fleet
// admitted, and the base its floor is a fraction of: the lesser of what a
// fully used limit admits over that span (bounds) and what a plain store
// admits of those very calls, each decided at its arrival with no latency
// (the trace replayed from the run's start through algo.Apply, the
// reference the stores agree with).
//
// The floor measures what leasing loses, and a limit's capacity can only
// be used if it is asked for while it is free. Under load it is not
// always asked for: the 150 tickers fire in clumps (a late tick fires as
// soon as its goroutine runs, so after a stall they fire together), and
// the whole process stalls at times (seen: typically 5 ms between the
// last call of a window and its end; gaps of up to 170 ms with no call at
// all). What a window has not used by its end is lost to any store, and
// the sliding window counter frees its capacity all along the window, so
// it loses what freed after a window's last clump: the plain replay
// admitted 460-497 of 500 in whole windows offered 1000-1500 calls. Against
// the limit alone the skewed sliding counter's 97% floor failed 2 runs in
// 16 (96.2% and 96.3%) while the leases admitted 98-101% of the replay.
// The buckets carry 0.2 s of refill over a gap and lose only to longer
// stalls. Under this base remains the leases' own loss only, and the
// floors are TestAccuracyTable's (less, for the windows, what a round trip
// to Redis costs at a window's end: see TestFleetNeverOverAdmits).
func afterDrain(t *testing.T, req sluice.Request, r fleetResult) (admitted int64, base float64) {
	t.Helper()
	_, base = bounds(req.Limit, req.Algorithm, r.start, r.end, r.drained, r.stopped)
	from, to := r.drained.UnixNano(), r.stopped.UnixNano()
	var st algo.State
	var plain int64
	for _, c := range r.trace {
		d, next, err := algo.Apply(sluice.OpAllow, st, req, c.at)
		if err != nil {
			t.Fatalf("replay: %v", err)
		}
		st = next
		if c.at < from || c.at > to {
			continue
		}
		if c.allowed {
			admitted++
		}
		if d.Allowed {
			plain++
		}
	}
	t.Logf("after the limit was reached: admitted %d; a fully used limit %.0f, a plain store %d of the same calls", admitted, base, plain)
	return admitted, min(base, float64(plain))
}

// Three leased stores × 50 goroutines on one hot key, offered 3× its rate:
// uniform and skewed traffic, every leased algorithm. Admissions never
// exceed ideal + 1, and at least the floor of the ideal is reached once
// the limit is exhausted.
func TestFleetNeverOverAdmits(t *testing.T) {
	srv := redistest.Standalone(t)
	const run = 1200 * time.Millisecond
	cases := []struct {
		a     sluice.Algorithm
		lim   sluice.Limit
		tr    traffic
		floor float64
	}{
		{sluice.GCRA, sluice.Limit{Rate: 5000, Period: time.Second, Burst: 1000}, uniform, 0.99},
		{sluice.GCRA, sluice.Limit{Rate: 5000, Period: time.Second, Burst: 1000}, skewed, 0.97},
		{sluice.TokenBucket, sluice.Limit{Rate: 5000, Period: time.Second, Burst: 1000}, uniform, 0.99},
		{sluice.TokenBucket, sluice.Limit{Rate: 5000, Period: time.Second, Burst: 1000}, skewed, 0.97},
		{sluice.FixedWindow, sluice.Limit{Rate: 500, Period: 100 * time.Millisecond}, uniform, 0.99},
		{sluice.FixedWindow, sluice.Limit{Rate: 500, Period: 100 * time.Millisecond}, skewed, 0.97},
		// The sliding counter leases up to its windows' ends, and what a
		// chunk holds past its window's estimated end (early by the
		// fetch's round trip) is stranded: 1 run in 12 at the floors of
		// the others, on a quiet machine as under make test (uniform
		// 98.3% of 99%, skewed 96.8% and 96.1% of 97%; at 814d052 as at
		// its successors).
		{sluice.SlidingWindowCounter, sluice.Limit{Rate: 500, Period: 100 * time.Millisecond}, uniform, 0.97},
		{sluice.SlidingWindowCounter, sluice.Limit{Rate: 500, Period: 100 * time.Millisecond}, skewed, 0.95},
	}
	for _, c := range cases {
		t.Run(c.a.String()+"/"+c.tr.name, func(t *testing.T) {
			req := sluice.Request{Key: redistest.Prefix(t) + "hot", Algorithm: c.a, Limit: c.lim, Cost: 1}
			r := runFleet(t, srv, req, c.tr, run, nil)
			ideal, _ := bounds(c.lim, c.a, r.start, r.end, r.drained, r.stopped)
			got := float64(r.admitted)
			t.Logf("admitted %.0f, ideal %.0f", got, ideal)
			if got > ideal+1 {
				t.Fatalf("admitted %.0f > ideal %.0f + 1", got, ideal)
			}
			if r.degraded > 0 {
				t.Fatalf("%d degraded decisions with Redis up", r.degraded)
			}
			if !floorMeasurable(t, r, c.lim) {
				return
			}
			// What the load did not ask for cannot be admitted: the base
			// is what a plain store admits of the same calls, if less than
			// the limit's (see afterDrain).
			after, base := afterDrain(t, req, r)
			// A window chunk is charged in the window Redis is in when
			// it runs the fetch, and lapses if its reply comes after that
			// window's end. TestAccuracyTable's fetches take no time; here
			// they take what the machine gives them (2-6 ms on average
			// under -race at load 4, where the skewed sliding counter,
			// which leases up to its windows' ends, stranded 2.5-3.7% of
			// what it admitted). The chunks that came back after their
			// window, counted as they came (timed), are capacity lost to
			// the round trip, not to the leases' sizing: the floor does
			// not count them. Chunks that came in time and went unused
			// still count against it.
			want := c.floor * (base - float64(r.late))
			if float64(after) < want {
				t.Fatalf("after the limit was reached admitted %d, want ≥ %.0f%% of %.0f (%d units came back after their window ended)", after, 100*c.floor, base-float64(r.late), r.late)
			}
			if r.local < r.admitted/2 {
				t.Fatalf("only %d of %d admissions from leases", r.local, r.admitted)
			}
		})
	}
}

// Redis stopped for 300ms mid-run, by CLIENT PAUSE ALL or by SIGSTOP (the
// process frozen, its sockets open): fetches time out, instances answer
// from what they hold and then return the store's error (a guard around
// them would apply its failure policy); the queued fetches run after the
// pause, charging capacity nobody uses. Nothing is ever admitted beyond
// ideal + 1, uniform or skewed.
//
// A loaded machine may not run any caller for 300ms (gaps of 170ms with no
// call were seen at load 4, and at load 10-15 a pause went by unnoticed:
// "no degraded decision"), so the fault lasts until a caller has felt it:
// the pause is repeated, the freeze prolonged, up to a bound after which
// the test fails as before.
func TestFleetRedisPaused(t *testing.T) {
	srv := redistest.NewStandalone(t)
	clientPause := func(felt <-chan struct{}, done chan<- error) {
		ctx := context.Background()
		for range 10 {
			if _, err := srv.Do(ctx, "CLIENT", "PAUSE", "300", "ALL"); err != nil {
				done <- err
				return
			}
			// The pause blocks this PING too, until it ends (and
			// CLIENT UNPAUSE with it, on Redis 7.0).
			if _, err := srv.Do(ctx, "PING"); err != nil {
				done <- err
				return
			}
			select {
			case <-felt:
				done <- nil
				return
			default:
			}
		}
		done <- nil // unfelt: the test fails on its degraded count
	}
	sigstop := func(felt <-chan struct{}, done chan<- error) {
		if err := srv.Freeze(); err != nil {
			done <- err
			return
		}
		// The fault's length, not a synchronisation: Thaw ends it,
		// 300ms on and once a caller has felt it, or 2s on (unfelt: the
		// test then fails on its degraded count).
		time.AfterFunc(300*time.Millisecond, func() {
			bound := time.NewTimer(1700 * time.Millisecond)
			defer bound.Stop()
			select {
			case <-felt:
			case <-bound.C:
			}
			done <- srv.Thaw()
		})
	}
	for _, c := range []struct {
		name  string
		a     sluice.Algorithm
		lim   sluice.Limit
		tr    traffic
		fault func(<-chan struct{}, chan<- error)
	}{
		{"pause", sluice.GCRA, sluice.Limit{Rate: 5000, Period: time.Second, Burst: 1000}, uniform, clientPause},
		{"pause", sluice.FixedWindow, sluice.Limit{Rate: 500, Period: 100 * time.Millisecond}, uniform, clientPause},
		{"sigstop", sluice.GCRA, sluice.Limit{Rate: 5000, Period: time.Second, Burst: 1000}, skewed, sigstop},
		{"sigstop", sluice.SlidingWindowCounter, sluice.Limit{Rate: 500, Period: 100 * time.Millisecond}, uniform, sigstop},
	} {
		t.Run(c.a.String()+"/"+c.name+"/"+c.tr.name, func(t *testing.T) {
			req := sluice.Request{Key: redistest.Prefix(t) + "hot", Algorithm: c.a, Limit: c.lim, Cost: 1}
			faulted := make(chan error, 1)
			r := runFleet(t, srv, req, c.tr, 1500*time.Millisecond, func(felt <-chan struct{}) { c.fault(felt, faulted) })
			if err := <-faulted; err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			ideal, _ := bounds(c.lim, c.a, r.start, r.end, r.drained, r.stopped)
			t.Logf("admitted %d, ideal %.0f, degraded %d", r.admitted, ideal, r.degraded)
			if float64(r.admitted) > ideal+1 {
				t.Fatalf("admitted %d > ideal %.0f + 1", r.admitted, ideal)
			}
			if r.degraded == 0 {
				var gap int64 // the longest time no call arrived
				for i := 1; i < len(r.trace); i++ {
					gap = max(gap, r.trace[i].at-r.trace[i-1].at)
				}
				t.Fatalf("no degraded decision: the fault did not bite (longest time without a call: %v)", time.Duration(gap))
			}
			// The fault costs at most its 300ms of the limit (plus the
			// chunks whose fetches timed out and ran late). The plain
			// replay knows nothing of the fault: it is a base only where
			// the load was not asked for (see afterDrain).
			if !floorMeasurable(t, r, c.lim) {
				return
			}
			if after, base := afterDrain(t, req, r); float64(after) < 0.6*base {
				t.Fatalf("admitted %d after the limit was reached, want ≥ %.0f", after, 0.6*base)
			}
		})
	}
}
