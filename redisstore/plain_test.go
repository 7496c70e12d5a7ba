package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
)

// Tests of Options.PlainWindows (plain.go). The hostile ones run on the
// real clock against real servers, standalone and on the 3-master
// Cluster, and check what the design promises: every admission is counted
// in the window it is reported in, by Redis's clock, and admitted ≤ limit
// in every window.

// plainDeploy is a deployment the plain tests run on.
type plainDeploy struct {
	name string
	url  string
	// server is the server that holds key, once s knows the slots.
	server func(s *Store, key string) *redistest.Server
}

func plainDeploys(t *testing.T, own bool) []plainDeploy {
	var srv *redistest.Server
	if own {
		srv = redistest.NewStandalone(t)
	} else {
		srv = redistest.Standalone(t)
	}
	c := redistest.SharedCluster(t)
	return []plainDeploy{
		{"standalone", srv.URL(), func(*Store, string) *redistest.Server { return srv }},
		{"cluster", c.URL(), func(s *Store, key string) *redistest.Server {
			if _, err := s.Nodes(context.Background()); err != nil { // the slots
				t.Fatal(err)
			}
			addr := s.NodeOf(key)
			for _, n := range c.Nodes {
				if n.Addr == addr {
					return n
				}
			}
			t.Fatalf("no cluster node %q for %q", addr, key)
			return nil
		}},
	}
}

// waitPlain samples the clock of key's node until the plain path may be
// taken for it.
func waitPlain(t *testing.T, s *Store, key string) {
	t.Helper()
	ctx := context.Background()
	for range 200 {
		s.sampleClocks(ctx)
		if n := s.clocks.node(s.NodeOf(key)); n != nil {
			if _, _, ok := n.at(s.clocks.local()); ok {
				return
			}
		}
	}
	t.Fatalf("no clock estimate for the node of %q", key)
}

// redisTime reads srv's TIME in Unix ns.
func redisTime(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	r, err := srv.Do(context.Background(), "TIME")
	if err != nil {
		t.Fatal(err)
	}
	v, ok := r.([]any)
	if !ok || len(v) != 2 {
		t.Fatalf("TIME: %v", r)
	}
	sec, _ := strconv.ParseInt(fmt.Sprint(v[0]), 10, 64)
	usec, _ := strconv.ParseInt(fmt.Sprint(v[1]), 10, 64)
	return sec*1e9 + usec*1e3
}

// farPeriod returns the first of the periods from..to (step 1s) whose
// window boundaries are at least away from now, so that a test of a few
// calls stays in one window.
func farPeriod(t *testing.T, now int64, from, to, away time.Duration) time.Duration {
	t.Helper()
	for p := from; p <= to; p += time.Second {
		e := mod(now, int64(p))
		if e >= int64(away) && int64(p)-e >= int64(away) {
			return p
		}
	}
	t.Fatalf("no period in [%s, %s] with boundaries %s from now", from, to, away)
	return 0
}

// windowCount reads the count of key's window starting at start.
func windowCount(t *testing.T, s *Store, srv *redistest.Server, key string, start int64) int64 {
	t.Helper()
	r, err := srv.Do(context.Background(), "GET", s.plainBase(key)+":"+strconv.FormatInt(start, 10))
	if err != nil {
		t.Fatal(err)
	}
	if r == nil {
		return 0
	}
	n, err := strconv.ParseInt(fmt.Sprint(r), 10, 64)
	if err != nil {
		t.Fatalf("window key holds %v", r)
	}
	return n
}

// cmdCalls returns a function that reads how often srv ran a command.
func cmdCalls(t *testing.T, srv *redistest.Server) func(cmd string) int64 {
	return func(cmd string) int64 {
		t.Helper()
		n, err := srv.CommandCalls(context.Background(), cmd)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
}

// cmdDelta snapshots the counts of cmds; its result reports each one's
// calls since.
func cmdDelta(t *testing.T, srv *redistest.Server, cmds ...string) func() map[string]int64 {
	calls := cmdCalls(t, srv)
	before := map[string]int64{}
	for _, c := range cmds {
		before[c] = calls(c)
	}
	return func() map[string]int64 {
		t.Helper()
		out := map[string]int64{}
		for _, c := range cmds {
			out[c] = calls(c) - before[c]
		}
		return out
	}
}

// pttl reads key's PTTL on srv.
func pttl(t *testing.T, srv *redistest.Server, key string) int64 {
	t.Helper()
	r, err := srv.Do(context.Background(), "PTTL", key)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(fmt.Sprint(r), 10, 64)
	if err != nil {
		t.Fatalf("PTTL: %v", r)
	}
	return n
}

var plainCmds = []string{"evalsha", "eval", "set", "incrby", "pexpire", "decrby"}

// A cold key mid-window is decided by one SET NX PX, a key seen in the
// window by one INCRBY: no script runs, and the count is in the window's
// key, by Redis's clock, with a TTL.
func TestPlainPathTaken(t *testing.T) {
	for _, dep := range plainDeploys(t, true) {
		t.Run(dep.name, func(t *testing.T) {
			s := newStore(t, Options{URL: dep.url, PlainWindows: true})
			ctx := context.Background()
			key := redistest.Prefix(t) + "cold"
			waitPlain(t, s, key)
			srv := dep.server(s, key)
			now := redisTime(t, srv)
			p := farPeriod(t, now, time.Hour, 2*time.Hour, 10*time.Second)
			start := now - mod(now, int64(p))
			req := sluice.Request{Key: key, Algorithm: sluice.FixedWindow, Limit: sluice.Limit{Rate: 100, Period: p}, Cost: 1}
			for i, want := range []map[string]int64{
				{"set": 1}, // cold: SET NX PX
				{"incrby": 1},
			} {
				delta := cmdDelta(t, srv, plainCmds...)
				d, err := s.Apply(ctx, sluice.OpAllow, req)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed || d.Remaining != int64(99-i) || d.ResetAfter <= 0 || d.ResetAfter > p {
					t.Fatalf("call %d: decision %+v", i, d)
				}
				got := delta()
				for _, c := range plainCmds {
					if got[c] != want[c] {
						t.Fatalf("call %d: commands %v, want %v", i, got, want)
					}
				}
				if st := s.Stats(); st.Plain != uint64(i+1) || st.PlainLate != 0 || st.Calls != 0 {
					t.Fatalf("call %d: stats %+v, want plain calls only", i, st)
				}
				if n := windowCount(t, s, srv, key, start); n != int64(i+1) {
					t.Fatalf("call %d: window key holds %d", i, n)
				}
				if ms := pttl(t, srv, s.plainBase(key)+":"+strconv.FormatInt(start, 10)); ms <= 0 {
					t.Fatalf("call %d: window key's PTTL %d", i, ms)
				}
			}
		})
	}
}

// plainStep is one call of a scripted plain-layout test.
type plainStep struct {
	op        sluice.Op
	cost      int64
	allowed   bool
	remaining int64
	count     int64 // the window's count after it
}

// plainWindow is one key of a plain-windows store on dep, its fake clock
// 30 s into a 1-minute window: the set-up of the step tests.
type plainWindow struct {
	clk   *clock.Fake
	s     *Store
	srv   *redistest.Server // the server that holds the key
	req   sluice.Request    // an OpAllow of cost 1 at rate per minute
	start int64             // the window's start
}

func newPlainWindow(t *testing.T, dep plainDeploy, rate int64) plainWindow {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC))
	s := newStore(t, Options{URL: dep.url, Clock: clk, PlainWindows: true, DisableDenyCache: true})
	key := redistest.Prefix(t) + "k"
	return plainWindow{clk: clk, s: s, srv: dep.server(s, key),
		req:   sluice.Request{Key: key, Algorithm: sluice.FixedWindow, Limit: sluice.PerMinute(rate), Cost: 1},
		start: clk.Now() - 30*int64(time.Second)}
}

// runPlainSteps runs steps on req's key with the fake clock at 30s into a
// 1-minute window, checking each decision and the window's count.
func runPlainSteps(t *testing.T, s *Store, srv *redistest.Server, req sluice.Request, start int64, steps []plainStep) {
	t.Helper()
	for i, st := range steps {
		req.Cost = st.cost
		d, err := s.Apply(context.Background(), st.op, req)
		if err != nil {
			t.Fatal(err)
		}
		reset := 30 * time.Second
		if st.count == 0 {
			reset = 0
		}
		if d.Allowed != st.allowed || d.Remaining != st.remaining || d.ResetAfter != reset {
			t.Fatalf("step %d, %s of %d: %+v, want allowed %v, remaining %d", i, st.op, st.cost, d, st.allowed, st.remaining)
		}
		if !st.allowed && d.RetryAfter != 30*time.Second {
			t.Fatalf("step %d: RetryAfter %s", i, d.RetryAfter)
		}
		if n := windowCount(t, s, srv, req.Key, start); n != st.count {
			t.Fatalf("step %d, %s of %d: window count %d, want %d", i, st.op, st.cost, n, st.count)
		}
	}
}

// A denial by the plain path stays counted: the count stands above the
// limit, no DECRBY is sent, every later request of the window is denied
// with Remaining 0 (by the plain path and by the scripts), and a refund
// frees less than without it (the documented difference: stricter).
func TestPlainDenialCounted(t *testing.T) {
	for _, dep := range plainDeploys(t, false) {
		t.Run(dep.name, func(t *testing.T) {
			w := newPlainWindow(t, dep, 3)
			s, srv, req, start := w.s, w.srv, w.req, w.start
			delta := cmdDelta(t, srv, plainCmds...)
			runPlainSteps(t, s, srv, req, start, []plainStep{
				{sluice.OpAllow, 1, true, 2, 1},
				{sluice.OpAllow, 1, true, 1, 2},
				{sluice.OpAllow, 1, true, 0, 3},
				{sluice.OpAllow, 1, false, 0, 4}, // denied, counted
				{sluice.OpAllow, 1, false, 0, 5},
				{sluice.OpPeek, 1, false, 0, 5},  // script, count above the limit
				{sluice.OpAllow, 2, false, 0, 5}, // script: checks first
				{sluice.OpRefund, 1, true, 0, 4}, // 3 − 4 clamped at 0 (the old layout: 1)
				{sluice.OpRefund, 3, true, 2, 1}, // subtracts
				{sluice.OpAllow, 1, true, 1, 2},  // plain again
				{sluice.OpRefund, 5, true, 3, 0}, // clamped at 0: the key goes
				{sluice.OpAllow, 1, true, 2, 1},  // INCRBY → 1, with a TTL
			})
			got := delta()
			if got["decrby"] != 0 || got["evalsha"]+got["eval"] != 5 {
				t.Fatalf("commands %v: want no DECRBY and 5 scripts", got)
			}
			if st := s.Stats(); st.Plain != 7 || st.Calls != 5 {
				t.Fatalf("stats %+v, want 7 plain calls and 5 scripts", st)
			}
			if ms := pttl(t, srv, s.plainBase(req.Key)+":"+strconv.FormatInt(start, 10)); ms <= 0 {
				t.Fatalf("window key's PTTL %d after INCRBY recreated it", ms)
			}
		})
	}
}

// The scenario that drove a window's count negative when denials and late
// answers were given back by DECRBY: a refund lands between the denied (or
// late) INCRBY and where the give-back was. The count never goes below 0,
// and the window admits at most its limit after the refund.
func TestPlainRefundBetween(t *testing.T) {
	for _, dep := range plainDeploys(t, false) {
		for _, late := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/late_%v", dep.name, late), func(t *testing.T) {
				const rate = 2
				w := newPlainWindow(t, dep, rate)
				clk, s, srv, req, start := w.clk, w.s, w.srv, w.req, w.start
				key, ctx := req.Key, context.Background()
				check := func(what string) {
					t.Helper()
					for _, w := range []int64{start, start + int64(time.Minute)} {
						if n := windowCount(t, s, srv, key, w); n < 0 {
							t.Fatalf("%s: window %d holds %d", what, w, n)
						}
					}
				}
				for range rate {
					if d, err := s.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed {
						t.Fatalf("%+v %v", d, err)
					}
				}
				hooked := 0
				s.plainHook = func(_ string, n int64) {
					if n <= rate || hooked > 0 {
						return
					}
					hooked++
					// Between the INCRBY (count 3) and where the give-back
					// was: refund more than the count (clamped at 0).
					r := req
					r.Cost = 4
					if _, err := s.Apply(ctx, sluice.OpRefund, r); err != nil {
						t.Error(err)
					}
					if late { // the answer comes back after the window
						clk.Advance(30 * time.Second)
					}
				}
				d, err := s.Apply(ctx, sluice.OpAllow, req)
				if err != nil || hooked != 1 {
					t.Fatalf("%+v %v, hook ran %d times", d, err, hooked)
				}
				check("after the refund")
				if late {
					// Decided by the script in the next window; the late
					// INCRBY stays counted in its own (refunded to 0).
					if !d.Allowed || d.Remaining != rate-1 || s.Stats().PlainLate != 1 {
						t.Fatalf("late: %+v, stats %+v", d, s.Stats())
					}
					start += int64(time.Minute)
				} else if d.Allowed || d.Remaining != 0 {
					t.Fatalf("denied at the limit: %+v", d)
				}
				admitted := int64(0)
				for i := range 3 * rate {
					d, err := s.Apply(ctx, sluice.OpAllow, req)
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed {
						admitted++
					}
					check(fmt.Sprintf("allow %d", i))
				}
				if late {
					admitted++ // the script's admission above
				}
				if admitted > rate {
					t.Fatalf("the window admitted %d after the refund, limit %d", admitted, rate)
				}
				if admitted != rate {
					t.Fatalf("the window admitted %d after the refund, want %d", admitted, rate)
				}
			})
		}
	}
}

// An OpAllow of cost above 1 goes to the script, which checks before it
// charges: no SET or INCRBY, even for a cold key well inside its window.
func TestPlainCostAboveOneScript(t *testing.T) {
	for _, dep := range plainDeploys(t, false) {
		t.Run(dep.name, func(t *testing.T) {
			w := newPlainWindow(t, dep, 3)
			s, srv, req, start := w.s, w.srv, w.req, w.start
			delta := cmdDelta(t, srv, plainCmds...)
			runPlainSteps(t, s, srv, req, start, []plainStep{
				{sluice.OpAllow, 2, true, 1, 2},
				{sluice.OpAllow, 2, false, 1, 2}, // checked first: nothing hidden
				{sluice.OpAllow, 1, true, 0, 3},  // the plain path: INCRBY
			})
			got := delta()
			// The scripts' own SET counts too: one by the first, one SET NX
			// that finds the key before the INCRBY.
			if got["evalsha"]+got["eval"] != 2 || got["set"] != 2 || got["incrby"] != 1 || got["decrby"] != 0 {
				t.Fatalf("commands %v: want 2 scripts, then SET NX and INCRBY", got)
			}
			if st := s.Stats(); st.Plain != 1 || st.Calls != 2 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// A window key deleted mid-window by a reset: another store, which still
// remembers the key, recreates it by INCRBY (→ 1) and gives it a TTL; the
// store that reset it forgets it and creates it by SET NX PX.
func TestPlainResetMidWindow(t *testing.T) {
	for _, dep := range plainDeploys(t, false) {
		t.Run(dep.name, func(t *testing.T) {
			clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC))
			a := newStore(t, Options{URL: dep.url, Clock: clk, PlainWindows: true, DisableDenyCache: true})
			b := newStore(t, Options{URL: dep.url, Clock: clk, PlainWindows: true, DisableDenyCache: true})
			ctx := context.Background()
			key := redistest.Prefix(t) + "k"
			srv := dep.server(a, key)
			req := sluice.Request{Key: key, Algorithm: sluice.FixedWindow, Limit: sluice.PerMinute(5), Cost: 1}
			start := clk.Now() - 30*int64(time.Second)
			wkey := a.plainBase(key) + ":" + strconv.FormatInt(start, 10)
			allow := func(s *Store, want map[string]int64) {
				t.Helper()
				delta := cmdDelta(t, srv, plainCmds...)
				d, err := s.Apply(ctx, sluice.OpAllow, req)
				if err != nil || !d.Allowed || d.Remaining != 4 {
					t.Fatalf("%+v %v", d, err)
				}
				got := delta()
				for _, c := range plainCmds {
					if got[c] != want[c] {
						t.Fatalf("commands %v, want %v", got, want)
					}
				}
				if ms := pttl(t, srv, wkey); ms <= 0 {
					t.Fatalf("window key's PTTL %d", ms)
				}
			}
			reset := func(s *Store) {
				t.Helper()
				if _, err := s.Apply(ctx, sluice.OpReset, req); err != nil {
					t.Fatal(err)
				}
				if n := windowCount(t, a, srv, key, start); n != 0 {
					t.Fatalf("after reset the window holds %d", n)
				}
			}
			allow(a, map[string]int64{"set": 1})
			reset(b)
			allow(a, map[string]int64{"incrby": 1, "pexpire": 1}) // a remembers: INCRBY → 1
			reset(a)
			allow(a, map[string]int64{"set": 1}) // a forgot
		})
	}
}

// skewed returns a local clock off from the system's by skew.
func skewed(skew time.Duration) func() int64 {
	m := monotonic()
	return func() int64 { return m() + int64(skew) }
}

// Two instances whose local clocks are 30s ahead of and behind Redis's
// share one fixed window exactly (with 45s windows, at least one of them
// would count in another window by its own clock), and decide as one with
// a true clock does.
func TestPlainClockSkew(t *testing.T) {
	for _, dep := range plainDeploys(t, false) {
		t.Run(dep.name, func(t *testing.T) {
			ctx := context.Background()
			ahead := newStore(t, Options{URL: dep.url, PlainWindows: true, localMono: skewed(30 * time.Second)})
			behind := newStore(t, Options{URL: dep.url, PlainWindows: true, localMono: skewed(-30 * time.Second)})
			true_ := newStore(t, Options{URL: dep.url, PlainWindows: true})
			prefix := redistest.Prefix(t)
			shared, alone := prefix+"{s}", prefix+"{a}"
			for _, s := range []*Store{ahead, behind} {
				waitPlain(t, s, shared)
			}
			waitPlain(t, true_, alone)
			srv := dep.server(true_, shared)
			now := redisTime(t, srv)
			p := farPeriod(t, now, 40*time.Second, 60*time.Second, 10*time.Second)
			req := sluice.Request{Algorithm: sluice.FixedWindow, Limit: sluice.Limit{Rate: 10, Period: p}, Cost: 1}
			admitted := 0
			for i := range 30 {
				s := ahead
				if i%2 == 1 {
					s = behind
				}
				req.Key = shared
				d, err := s.Apply(ctx, sluice.OpAllow, req)
				if err != nil {
					t.Fatal(err)
				}
				req.Key = alone
				want, err := true_.Apply(ctx, sluice.OpAllow, req)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed != want.Allowed || d.Remaining != want.Remaining || d.Degraded {
					t.Fatalf("call %d: skewed %+v, true clock %+v", i, d, want)
				}
				if d.ResetAfter <= 0 || d.ResetAfter > p || (!d.Allowed && d.RetryAfter != d.ResetAfter) {
					t.Fatalf("call %d: %+v", i, d)
				}
				if d.Allowed {
					admitted++
				}
			}
			if admitted != 10 {
				t.Fatalf("admitted %d, want 10", admitted)
			}
			for _, s := range []*Store{ahead, behind, true_} {
				if st := s.Stats(); st.Plain < 5 || st.PlainLate != 0 {
					t.Fatalf("stats %+v: the plain path was not taken", st)
				}
			}
			// Denials that reached Redis stay counted (the over-limit
			// cache answers most).
			if n := windowCount(t, ahead, srv, shared, now-mod(now, int64(p))); n < 10 || n > 30 {
				t.Fatalf("the window's key by Redis's clock holds %d, want 10 to 30", n)
			}
		})
	}
}

// admissions counts allowed decisions by the window they report, by
// Redis's clock, which is the system clock on this host.
type admissions struct {
	mu   sync.Mutex
	per  time.Duration
	by   map[int64]int64 // window start → admitted
	seen [][2]int64      // when each admission came back, and its window's end
}

func (a *admissions) add(d sluice.Decision) {
	if !d.Allowed {
		return
	}
	// The window ends ResetAfter after the decision; round to the
	// boundary, which the time since the decision is far below half of.
	now := time.Now().UnixNano()
	p := int64(a.per)
	end := (now + int64(d.ResetAfter) + p/2) / p * p
	a.mu.Lock()
	a.by[end-p]++
	a.seen = append(a.seen, [2]int64{now, end})
	a.mu.Unlock()
}

// check fails unless each window admitted at most rate and Redis counted
// in each window's key at least what was admitted in it (denials and late
// answers of the plain path stay counted too), and returns the sum of
// the counts above the admissions.
func (a *admissions) check(t *testing.T, s *Store, srv *redistest.Server, key string, rate int64) (extra int64) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	for start, n := range a.by {
		if n > rate {
			t.Errorf("window %s admitted %d, limit %d", time.Unix(0, start).UTC().Format("15:04:05.000"), n, rate)
		}
		c := windowCount(t, s, srv, key, start)
		if c < n {
			t.Errorf("window %s: redis counted %d, admitted %d", time.Unix(0, start).UTC().Format("15:04:05.000"), c, n)
		}
		extra += c - n
	}
	return extra
}

// hammer runs workers goroutines per store calling Apply on req until
// stop is closed; it returns when they have all returned.
func hammer(t *testing.T, stores []*Store, workers int, req sluice.Request, adm *admissions, stop <-chan struct{}) (wait func() int64) {
	var wg sync.WaitGroup
	var errs atomic.Int64
	for _, s := range stores {
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					d, err := s.Apply(context.Background(), sluice.OpAllow, req)
					if err != nil {
						if errs.Add(1) == 1 {
							t.Errorf("Apply: %v", err)
						}
						return
					}
					adm.add(d)
				}
			}()
		}
	}
	return func() int64 { wg.Wait(); return errs.Load() }
}

// untilWindow waits (as the scenario's timing, not to synchronise) until
// Redis's clock is at least at elapsed e of some window of period p.
func untilWindow(t *testing.T, srv *redistest.Server, p, e time.Duration) {
	t.Helper()
	now := redisTime(t, srv)
	wait := int64(e) - mod(now, int64(p))
	if wait < 0 {
		wait += int64(p)
	}
	time.Sleep(time.Duration(wait)) // the scenario's timing: a point in Redis's window
}

// Redis is stopped (SIGSTOP) late in a window with calls in flight and
// resumed in the next: answers that come back after the boundary are not
// used, the scripts decide them by Redis's clock, and each window admits
// at most its limit, each admission counted in its window's key. With a
// limit that windows fill before the stop, and with one they never fill,
// where the calls in flight at the stop would be admitted: none may be
// counted in the stopped window, which ended long before they came back.
func TestPlainRedisStoppedAcrossBoundary(t *testing.T) {
	deps := plainDeploys(t, true)
	for _, rate := range []int64{40, 1e9} {
		for _, dep := range deps {
			t.Run(fmt.Sprintf("%s/rate_%d", dep.name, rate), func(t *testing.T) { testStoppedAcrossBoundary(t, dep, rate) })
		}
	}
}

func testStoppedAcrossBoundary(t *testing.T, dep plainDeploy, rate int64) {
	{
		{
			per := time.Second
			s := newStore(t, Options{URL: dep.url, PlainWindows: true, DisableDenyCache: true, Timeout: 20 * time.Second, plainSlack: time.Minute})
			key := redistest.Prefix(t) + "{hot}"
			waitPlain(t, s, key)
			srv := dep.server(s, key)
			req := sluice.Request{Key: key, Algorithm: sluice.FixedWindow, Limit: sluice.Limit{Rate: rate, Period: per}, Cost: 1}
			adm := &admissions{per: per, by: map[int64]int64{}}
			stop := make(chan struct{})
			wait := hammer(t, []*Store{s}, 8, req, adm, stop)
			// Stop Redis at 80% of a window, resume it 30% into the next.
			frozen, thawAt := false, int64(0)
			for try := 0; try < 5 && !frozen; try++ {
				untilWindow(t, srv, per, 800*time.Millisecond)
				if e := mod(redisTime(t, srv), int64(per)); e < int64(750*time.Millisecond) || e > int64(900*time.Millisecond) {
					continue // woke too late on a loaded machine
				}
				if err := srv.Freeze(); err != nil {
					t.Fatal(err)
				}
				frozen = true
				time.Sleep(per / 2) // the pause itself, not a synchronisation
				thawAt = time.Now().UnixNano()
				if err := srv.Thaw(); err != nil {
					t.Fatal(err)
				}
			}
			if !frozen {
				close(stop)
				wait()
				t.Fatal("could not stop Redis late in a window")
			}
			untilWindow(t, srv, per, 500*time.Millisecond)
			close(stop)
			if wait() != 0 {
				return
			}
			extra := adm.check(t, s, srv, key, rate)
			st := s.Stats()
			if rate == 1e9 && extra > int64(st.PlainLate) {
				// Nothing is denied: only late answers count unadmitted.
				t.Errorf("redis counted %d more than was admitted, with %d late answers", extra, st.PlainLate)
			}
			// Redis ran nothing from the stop to thawAt: an admission that
			// came back after thawAt was made after it, in the next window.
			// (A reply of the stopped window, queued before the stop,
			// would have to wait half a second in this process.)
			for _, x := range adm.seen {
				if x[0] > thawAt && x[1] < thawAt-int64(per/5) {
					t.Fatalf("an admission came back %s after Redis resumed, counted in a window that ended %s before", time.Duration(x[0]-thawAt), time.Duration(thawAt-x[1]))
				}
			}
			if st.Plain == 0 || st.PlainLate == 0 {
				t.Fatalf("stats %+v: no plain call came back late", st)
			}
		}
	}
}

// Three instances hammer one key across several window boundaries: each
// window admits at most its limit, counted in its own key.
func TestPlainThreeStoresAcrossBoundaries(t *testing.T) {
	for _, dep := range plainDeploys(t, false) {
		t.Run(dep.name, func(t *testing.T) {
			const rate = 25
			per := time.Second
			key := redistest.Prefix(t) + "{hot}"
			stores := make([]*Store, 3)
			for i := range stores {
				stores[i] = newStore(t, Options{URL: dep.url, PlainWindows: true, Timeout: 10 * time.Second, plainSlack: time.Minute})
				waitPlain(t, stores[i], key)
			}
			srv := dep.server(stores[0], key)
			req := sluice.Request{Key: key, Algorithm: sluice.FixedWindow, Limit: sluice.Limit{Rate: rate, Period: per}, Cost: 1}
			adm := &admissions{per: per, by: map[int64]int64{}}
			stop := make(chan struct{})
			wait := hammer(t, stores, 4, req, adm, stop)
			time.Sleep(3500 * time.Millisecond) // the run: three boundaries or more
			close(stop)
			if wait() != 0 {
				return
			}
			adm.check(t, stores[0], srv, key, rate)
			if len(adm.by) < 3 {
				t.Fatalf("admissions in %d windows, want 3 or more", len(adm.by))
			}
			var plain uint64
			for _, s := range stores {
				plain += s.Stats().Plain
			}
			if plain == 0 {
				t.Fatal("the plain path was never taken")
			}
		})
	}
}

// With the test clock, a store with PlainWindows decides every op, alone
// or in batches, as one without it does (the old layout), for periods of
// whole milliseconds (plain path) and not (scripts only): a random walk
// of ops, costs and clock steps, compared decision by decision. Where the
// one documented difference applies (a denial of the plain path stays
// counted) the old layout is charged 1 after the same denial, so that
// both hold the same count from then on: the plain layout's answers are
// then the stricter ones the old layout gives for that count, refunds'
// Remaining clamped at 0.
func TestPlainMatchesScripts(t *testing.T) {
	for _, dep := range plainDeploys(t, false) {
		for _, per := range []time.Duration{time.Second, 1500 * time.Millisecond, time.Second + 500*time.Microsecond} {
			t.Run(fmt.Sprintf("%s/%s", dep.name, per), func(t *testing.T) {
				clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
				plain := newStore(t, Options{URL: dep.url, Clock: clk, PlainWindows: true, DisableDenyCache: true})
				old := newStore(t, Options{URL: dep.url, Clock: clk, DisableDenyCache: true})
				rng := rand.New(rand.NewPCG(1, uint64(per)))
				prefix := redistest.Prefix(t)
				ctx := context.Background()
				lim := sluice.Limit{Rate: 5, Period: per}
				reqs := func(n int) []sluice.Request {
					out := make([]sluice.Request, n)
					for i := range out {
						out[i] = sluice.Request{Key: prefix + "{k}" + strconv.Itoa(i), Algorithm: sluice.FixedWindow, Limit: lim, Cost: rng.Int64N(4)}
					}
					if n == 2 && rng.IntN(2) == 0 { // a mixed batch
						out[1].Algorithm, out[1].Limit = sluice.GCRA, sluice.PerSecond(3)
						out[1].Key += "g" // a key keeps its algorithm
					}
					return out
				}
				ops := []sluice.Op{sluice.OpAllow, sluice.OpAllow, sluice.OpAllow, sluice.OpPeek, sluice.OpRefund, sluice.OpCharge, sluice.OpReset}
				denied := 0
				for i := range 400 {
					op := ops[rng.IntN(len(ops))]
					n := 1 + rng.IntN(2)
					a := reqs(n)
					b := make([]sluice.Request, n)
					for j := range a {
						if op != sluice.OpPeek && a[j].Cost == 0 {
							a[j].Cost = 1
						}
						b[j] = a[j]
						b[j].Key = "o" + a[j].Key
					}
					var dp, do []sluice.Decision
					var ep, eo error
					before := plain.Stats()
					if n == 1 && rng.IntN(2) == 0 {
						var x, y sluice.Decision
						x, ep = plain.Apply(ctx, op, a[0])
						y, eo = old.Apply(ctx, op, b[0])
						dp, do = []sluice.Decision{x}, []sluice.Decision{y}
					} else {
						dp, ep = plain.ApplyAll(ctx, op, a)
						do, eo = old.ApplyAll(ctx, op, b)
					}
					if op == sluice.OpRefund {
						for j := range do {
							if a[j].Algorithm == sluice.FixedWindow {
								do[j].Remaining = max(do[j].Remaining, 0)
							}
						}
					}
					if (ep == nil) != (eo == nil) || fmt.Sprint(dp) != fmt.Sprint(do) {
						t.Fatalf("step %d, %s of %d: plain %v %v, old layout %v %v", i, op, n, dp, ep, do, eo)
					}
					if after := plain.Stats(); after.Plain > before.Plain && ep == nil && !dp[0].Allowed {
						// Denied by the plain path, whose INCRBY stays.
						if after.Plain != before.Plain+1 || after.Calls != before.Calls || a[0].Cost != 1 {
							t.Fatalf("step %d: stats %+v → %+v for cost %d", i, before, after, a[0].Cost)
						}
						if _, err := old.Apply(ctx, sluice.OpCharge, b[0]); err != nil {
							t.Fatal(err)
						}
						denied++
					}
					clk.Advance(time.Duration(rng.Int64N(int64(per) / 3)))
				}
				if per%time.Millisecond == 0 && (plain.Stats().Plain == 0 || denied == 0) {
					t.Fatalf("the plain path was taken %d times, denied %d", plain.Stats().Plain, denied)
				}
			})
		}
	}
}
