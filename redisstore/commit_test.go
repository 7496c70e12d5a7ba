package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
)

// Tests of the plain path's group commit (commit.go), on real servers
// that they stop with SIGSTOP so that commands pile up behind one on its
// way: standalone and on the 3-master Cluster, where each node has its
// own group.

// commitProbe records a store's group commit: its events, in order, on
// a channel, and the sizes of the groups it sent.
type commitProbe struct {
	events chan string // "direct", "queued N", "group N"
	mu     sync.Mutex
	groups []int
}

func probeCommits(s *Store) *commitProbe {
	p := &commitProbe{events: make(chan string, 4096)}
	s.commitHook = func(what string, n int) {
		if what == "group" {
			p.mu.Lock()
			p.groups = append(p.groups, n)
			p.mu.Unlock()
		}
		if what != "direct" {
			what = fmt.Sprintf("%s %d", what, n)
		}
		p.events <- what
	}
	return p
}

// wait returns once event has happened.
func (p *commitProbe) wait(t *testing.T, event string) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case e := <-p.events:
			if e == event {
				return
			}
		case <-timeout:
			t.Fatalf("no %q", event)
		}
	}
}

func (p *commitProbe) sent() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.groups...)
}

// stopped stops srv until the test ends or thaw is called.
func stopped(t *testing.T, srv *redistest.Server) (thaw func()) {
	t.Helper()
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	thaw = func() {
		once.Do(func() {
			if err := srv.Thaw(); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(thaw)
	return thaw
}

// While one command is on its way to a stopped node, the commands that
// arrive wait, and go to Redis together, in one group, once it answers:
// every decision is right and the window holds every admission.
func TestGroupCommit(t *testing.T) {
	for _, dep := range plainDeploys(t, true) {
		t.Run(dep.name, func(t *testing.T) {
			clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC))
			s := newStore(t, Options{URL: dep.url, Clock: clk, PlainWindows: true, DisableDenyCache: true, Timeout: 30 * time.Second})
			ctx := context.Background()
			key := redistest.Prefix(t) + "{hot}"
			srv := dep.server(s, key)
			const rate, n = 10, 40
			req := sluice.Request{Key: key, Algorithm: sluice.FixedWindow, Limit: sluice.PerMinute(rate), Cost: 1}
			if d, err := s.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed || d.Remaining != rate-1 {
				t.Fatalf("first call: %+v %v", d, err)
			}
			p := probeCommits(s)
			thaw := stopped(t, srv)
			type answer struct {
				d   sluice.Decision
				err error
			}
			answers := make(chan answer, n+commitLanes)
			for range n + commitLanes {
				go func() {
					d, err := s.Apply(ctx, sluice.OpAllow, req)
					answers <- answer{d, err}
				}()
			}
			// commitLanes are on their way to the stopped node, the rest wait.
			p.wait(t, fmt.Sprintf("queued %d", n))
			thaw()
			allowed := 0
			seen := map[int64]bool{}
			for range n + commitLanes {
				a := <-answers
				if a.err != nil {
					t.Fatal(a.err)
				}
				if a.d.Allowed {
					allowed++
					if seen[a.d.Remaining] {
						t.Fatalf("two admissions with Remaining %d", a.d.Remaining)
					}
					seen[a.d.Remaining] = true
				} else if a.d.Remaining != 0 || a.d.RetryAfter != 30*time.Second {
					t.Fatalf("denial %+v", a.d)
				}
			}
			if allowed != rate-1 {
				t.Fatalf("%d admitted after the first, want %d", allowed, rate-1)
			}
			start := clk.Now() - 30*int64(time.Second)
			if c := windowCount(t, s, srv, key, start); c != n+commitLanes+1 {
				t.Fatalf("window holds %d, want %d (every command counted)", c, n+commitLanes+1)
			}
			if g := p.sent(); len(g) != 1 || g[0] != n {
				t.Fatalf("groups sent %v, want one of %d", g, n)
			}
			if st := s.Stats(); st.Groups != 1 || st.Grouped != n {
				t.Fatalf("stats %+v, want 1 group of %d", st, n)
			}
		})
	}
}

// A lone caller's command goes at once, never in a group.
func TestGroupCommitLoneCaller(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC))
	s := newStore(t, Options{URL: redistest.Standalone(t).URL(), Clock: clk, PlainWindows: true, DisableDenyCache: true})
	p := probeCommits(s)
	req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.FixedWindow, Limit: sluice.PerMinute(100), Cost: 1}
	for i := range 20 {
		if d, err := s.Apply(context.Background(), sluice.OpAllow, req); err != nil || !d.Allowed || d.Remaining != int64(99-i) {
			t.Fatalf("call %d: %+v %v", i, d, err)
		}
	}
	if g := p.sent(); len(g) != 0 {
		t.Fatalf("a lone caller's commands went in groups %v", g)
	}
	if st := s.Stats(); st.Plain != 20 || st.Calls != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A caller whose context ends while its command waits for a group gets
// its error at once, with Redis still stopped, and its command is dropped,
// not sent: the window does not count it, and the others are answered.
func TestGroupCommitCallerLeaves(t *testing.T) {
	srv := redistest.NewStandalone(t)
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC))
	s := newStore(t, Options{URL: srv.URL(), Clock: clk, PlainWindows: true, DisableDenyCache: true, Timeout: 30 * time.Second})
	key := redistest.Prefix(t) + "k"
	req := sluice.Request{Key: key, Algorithm: sluice.FixedWindow, Limit: sluice.PerMinute(100), Cost: 1}
	ctx := context.Background()
	if _, err := s.Apply(ctx, sluice.OpAllow, req); err != nil {
		t.Fatal(err)
	}
	p := probeCommits(s)
	thaw := stopped(t, srv)
	first := make(chan error, commitLanes)
	for range commitLanes {
		go func() {
			_, err := s.Apply(ctx, sluice.OpAllow, req)
			first <- err
		}()
		p.wait(t, "direct")
	}
	leave, cancel := context.WithCancel(ctx)
	left := make(chan error, 1)
	go func() {
		_, err := s.Apply(leave, sluice.OpAllow, req)
		left <- err
	}()
	p.wait(t, "queued 1")
	cancel()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("the caller that left got %v", err)
	}
	// One more waits behind it and is answered.
	stays := make(chan error, 1)
	go func() {
		d, err := s.Apply(ctx, sluice.OpAllow, req)
		if err == nil && !d.Allowed {
			err = fmt.Errorf("denied: %+v", d)
		}
		stays <- err
	}()
	p.wait(t, "queued 2")
	thaw()
	for range commitLanes {
		if err := <-first; err != nil {
			t.Fatal(err)
		}
	}
	if err := <-stays; err != nil {
		t.Fatal(err)
	}
	if g := p.sent(); len(g) != 1 || g[0] != 1 {
		t.Fatalf("groups %v, want one of the command that stayed", g)
	}
	start := clk.Now() - 30*int64(time.Second)
	if n := windowCount(t, s, srv, key, start); n != int64(2+commitLanes) {
		t.Fatalf("window holds %d, want %d: the left command was sent", n, 2+commitLanes)
	}
}

// Closing the store answers the commands still waiting with ErrUnavailable
// and does not wait for a stopped node: with a connection of its own,
// which it closes, and with a client it shares (Options.Client), which
// stays open, and where the commands on their way keep waiting for the
// node while the queued ones are answered at once.
func TestGroupCommitClose(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared_client_%v", shared), func(t *testing.T) {
			srv := redistest.NewStandalone(t)
			clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC))
			ctx := context.Background()
			opts := Options{URL: srv.URL(), Clock: clk, PlainWindows: true, DisableDenyCache: true, Timeout: time.Minute}
			if shared {
				opts.Client = newStore(t, Options{URL: srv.URL()}).Client()
			}
			s, err := New(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.FixedWindow, Limit: sluice.PerMinute(100), Cost: 1}
			if _, err := s.Apply(ctx, sluice.OpAllow, req); err != nil {
				t.Fatal(err)
			}
			p := probeCommits(s)
			thaw := stopped(t, srv)
			sent := make(chan error, commitLanes)
			for range commitLanes {
				go func() {
					_, err := s.Apply(ctx, sluice.OpAllow, req)
					sent <- err
				}()
				p.wait(t, "direct")
			}
			queued := make(chan error, 3)
			for range 3 {
				go func() {
					_, err := s.Apply(ctx, sluice.OpAllow, req)
					queued <- err
				}()
			}
			p.wait(t, "queued 3")
			closed := make(chan struct{})
			go func() {
				_ = s.Close()
				close(closed)
			}()
			select {
			case <-closed:
			case <-time.After(20 * time.Second):
				t.Fatal("Close waited for the stopped node")
			}
			for range 3 {
				select {
				case err := <-queued:
					if !errors.Is(err, sluice.ErrUnavailable) {
						t.Fatalf("a queued call on a closed store got %v", err)
					}
				case <-time.After(20 * time.Second):
					t.Fatal("a queued call still waits after Close")
				}
			}
			thaw()
			for range commitLanes {
				// On a shared client the call gets its answer. On the
				// store's own, closed under it, it fails, or gets the
				// answer the closing client still read (which of the two
				// depends on when rueidis' close reaches the connection):
				// never a wrong one, never a hang.
				if err := <-sent; err != nil && (shared || !errors.Is(err, sluice.ErrUnavailable)) {
					t.Fatalf("a call on its way at Close (shared client %v): %v", shared, err)
				}
			}
		})
	}
}

// Script calls go in groups too (EVALSHA), and a group that finds its
// node without the scripts (SCRIPT FLUSH, as after a restart) gets every
// call of it decided by EVAL.
func TestGroupCommitScripts(t *testing.T) {
	for _, dep := range plainDeploys(t, true) {
		for _, flush := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/flush_%v", dep.name, flush), func(t *testing.T) {
				clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC))
				s := newStore(t, Options{URL: dep.url, Clock: clk, DisableDenyCache: true, Timeout: 30 * time.Second})
				ctx := context.Background()
				key := redistest.Prefix(t) + "{hot}"
				srv := dep.server(s, key)
				const rate, n = 10, 30
				first := sluice.Request{Key: key + "gcra", Algorithm: sluice.GCRA, Limit: sluice.PerMinute(rate), Cost: 1}
				reqs := []sluice.Request{
					{Key: key + "fw", Algorithm: sluice.FixedWindow, Limit: sluice.PerMinute(rate), Cost: 1},
					{Key: key + "log", Algorithm: sluice.SlidingWindowLog, Limit: sluice.PerMinute(rate), Cost: 1},
				}
				if flush {
					if _, err := srv.Do(ctx, "SCRIPT", "FLUSH"); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := srv.Do(ctx, "CONFIG", "RESETSTAT"); err != nil {
					t.Fatal(err)
				}
				p := probeCommits(s)
				thaw := stopped(t, srv)
				answers := make(chan error, 2*n+commitLanes)
				for range commitLanes {
					go func() {
						_, err := s.Apply(ctx, sluice.OpAllow, first)
						answers <- err
					}()
					p.wait(t, "direct")
				}
				allowed := make([]atomic.Int64, len(reqs))
				for i := range 2 * n {
					go func() {
						d, err := s.Apply(ctx, sluice.OpAllow, reqs[i%len(reqs)])
						if d.Allowed {
							allowed[i%len(reqs)].Add(1)
						}
						answers <- err
					}()
				}
				p.wait(t, fmt.Sprintf("queued %d", 2*n))
				thaw()
				for range 2*n + commitLanes {
					if err := <-answers; err != nil {
						t.Fatal(err)
					}
				}
				for i := range reqs {
					if a := allowed[i].Load(); a != rate {
						t.Fatalf("%s: %d admitted, want %d", reqs[i].Algorithm, a, rate)
					}
				}
				if g := p.sent(); len(g) != 1 || g[0] != 2*n {
					t.Fatalf("groups %v, want one of %d", g, 2*n)
				}
				evals, err := srv.CommandCalls(ctx, "eval")
				if err != nil {
					t.Fatal(err)
				}
				// Without the scripts: the first calls' and at least one
				// of each of the group's two scripts.
				if flush != (evals >= 3) {
					t.Fatalf("%d EVAL calls after SCRIPT FLUSH %v", evals, flush)
				}
			})
		}
	}
}
