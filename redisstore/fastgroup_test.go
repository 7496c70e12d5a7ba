package redisstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
)

// A group's GCRA, token-bucket and fixed-window calls on Redis TIME go
// as one call of several keys per script (fastgroup.go), which decides
// each exactly as its own call would: each key admits its limit and no
// more, whatever the limits and algorithms mixed in the group (windows of
// whole and of fractional seconds, long enough that none ends during the
// test), and a key holding another type fails its own calls only. A node without the script (SCRIPT FLUSH) gets the
// gathered call by EVAL. On a Cluster nothing is gathered: a call's keys
// could lie in different slots.
func TestGroupGathersFastCalls(t *testing.T) {
	for _, dep := range plainDeploys(t, true) {
		for _, flush := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/flush_%v", dep.name, flush), func(t *testing.T) {
				s := newStore(t, Options{URL: dep.url, DisableDenyCache: true, Timeout: 30 * time.Second})
				ctx := context.Background()
				key := redistest.Prefix(t) + "{hot}"
				srv := dep.server(s, key)
				const rate, n = 10, 15 // per key: n offered, rate admitted
				lim, other := sluice.PerHour(rate), sluice.Limit{Rate: rate, Period: 2 * time.Hour}
				reqs := []sluice.Request{
					{Key: key + "a", Algorithm: sluice.GCRA, Limit: lim, Cost: 1},
					{Key: key + "b", Algorithm: sluice.TokenBucket, Limit: other, Cost: 1},
					{Key: key + "c", Algorithm: sluice.GCRA, Limit: lim, Cost: 1},
					{Key: key + "w", Algorithm: sluice.FixedWindow, Limit: sluice.Limit{Rate: rate, Period: 1000 * time.Hour}, Cost: 1},
					{Key: key + "x", Algorithm: sluice.FixedWindow, Limit: sluice.Limit{Rate: rate, Period: 200*time.Hour + 500*time.Millisecond}, Cost: 1},
					{Key: key + "list", Algorithm: sluice.GCRA, Limit: lim, Cost: 1},
					{Key: key + "list", Algorithm: sluice.FixedWindow, Limit: lim, Cost: 1},
				}
				const good = 5 // the others are the list key's
				if _, err := srv.Do(ctx, "LPUSH", key+"list", "x"); err != nil {
					t.Fatal(err)
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
				first := sluice.Request{Key: key + "first", Algorithm: sluice.GCRA, Limit: lim, Cost: 1}
				answers := make(chan error, len(reqs)*n+commitLanes)
				for range commitLanes {
					go func() {
						_, err := s.Apply(ctx, sluice.OpAllow, first)
						answers <- err
					}()
					p.wait(t, "direct")
				}
				allowed := make([]atomic.Int64, len(reqs))
				failed := make([]atomic.Int64, len(reqs))
				for i := range len(reqs) * n {
					go func() {
						d, err := s.Apply(ctx, sluice.OpAllow, reqs[i%len(reqs)])
						if err != nil {
							failed[i%len(reqs)].Add(1)
						} else if d.Allowed {
							allowed[i%len(reqs)].Add(1)
						}
						answers <- nil
					}()
				}
				p.wait(t, fmt.Sprintf("queued %d", len(reqs)*n))
				thaw()
				for range len(reqs)*n + commitLanes {
					if err := <-answers; err != nil {
						t.Fatal(err)
					}
				}
				for i, r := range reqs {
					a, f := allowed[i].Load(), failed[i].Load()
					if i < good && (a != rate || f != 0) {
						t.Fatalf("%s: %d admitted, %d failed, want %d and none", r.Key, a, f, rate)
					}
					if i >= good && f != n {
						t.Fatalf("the list key, %s: %d of %d calls failed, want all", r.Algorithm, f, n)
					}
				}
				gathered := s.Stats().Gathered
				if dep.name == "cluster" {
					if gathered != 0 {
						t.Fatalf("%d calls gathered on a Cluster", gathered)
					}
					return
				}
				if g := p.sent(); len(g) != 1 || g[0] != len(reqs)*n || gathered != uint64(len(reqs)*n) {
					t.Fatalf("groups %v, %d calls gathered; want one group of %d, all gathered", g, gathered, len(reqs)*n)
				}
				// The group's calls went as one per script, besides the
				// lanes' own; flushed, each of those tried EVALSHA twice
				// (rueidis' Exec after ours) before EVAL, and each of the
				// group's EVALSHA once before EVAL.
				most := int64(commitLanes + 2)
				if flush {
					most = 3*commitLanes + 4
				}
				evalsha, err := srv.CommandCalls(ctx, "evalsha")
				if err != nil {
					t.Fatal(err)
				}
				eval, err := srv.CommandCalls(ctx, "eval")
				if err != nil {
					t.Fatal(err)
				}
				if evalsha+eval > most {
					t.Fatalf("%d EVALSHA and %d EVAL calls for %d decisions in one group and %d alone, want at most %d", evalsha, eval, len(reqs)*n, commitLanes, most)
				}
				if flush != (eval >= 1) {
					t.Fatalf("%d EVAL calls after SCRIPT FLUSH %v", eval, flush)
				}
			})
		}
	}
}

// Under maxmemory with nothing left to evict, Redis refuses writes (OOM)
// but not reads: a gathered call answers its denials, which write
// nothing, as their own calls would, and fails only the admissions whose
// write Redis refused.
func TestGroupGathersUnderOOM(t *testing.T) {
	srv := redistest.NewStandalone(t)
	s := newStore(t, Options{URL: srv.URL(), DisableDenyCache: true, Timeout: 30 * time.Second})
	ctx := context.Background()
	key := redistest.Prefix(t)
	lim := sluice.PerHour(1)
	reqs := []sluice.Request{
		{Key: key + "full", Algorithm: sluice.GCRA, Limit: lim, Cost: 1},
		{Key: key + "fullw", Algorithm: sluice.FixedWindow, Limit: sluice.Limit{Rate: 1, Period: 1000 * time.Hour}, Cost: 1},
		{Key: key + "new", Algorithm: sluice.GCRA, Limit: lim, Cost: 1},
		{Key: key + "neww", Algorithm: sluice.FixedWindow, Limit: sluice.Limit{Rate: 1, Period: 1000 * time.Hour}, Cost: 1},
	}
	for _, r := range reqs[:2] {
		if d, err := s.Apply(ctx, sluice.OpAllow, r); err != nil || !d.Allowed {
			t.Fatalf("%s: %+v %v", r.Key, d, err)
		}
	}
	if _, err := srv.Do(ctx, "CONFIG", "SET", "maxmemory", "1"); err != nil {
		t.Fatal(err)
	}
	const n = 10
	p := probeCommits(s)
	thaw := stopped(t, srv)
	lanes := make(chan error, commitLanes)
	for range commitLanes {
		go func() {
			_, err := s.Apply(ctx, sluice.OpPeek, reqs[0])
			lanes <- err
		}()
		p.wait(t, "direct")
	}
	type answer struct {
		i   int
		d   sluice.Decision
		err error
	}
	answers := make(chan answer, len(reqs)*n)
	for i := range len(reqs) * n {
		go func() {
			d, err := s.Apply(ctx, sluice.OpAllow, reqs[i%len(reqs)])
			answers <- answer{i % len(reqs), d, err}
		}()
	}
	p.wait(t, fmt.Sprintf("queued %d", len(reqs)*n))
	thaw()
	for range commitLanes {
		if err := <-lanes; err != nil {
			t.Fatal(err)
		}
	}
	for range len(reqs) * n {
		a := <-answers
		switch {
		case a.i < 2 && (a.err != nil || a.d.Allowed):
			t.Fatalf("%s under OOM: %+v %v, want denied", reqs[a.i].Key, a.d, a.err)
		case a.i >= 2 && a.err == nil:
			t.Fatalf("%s under OOM: %+v, want the write refused", reqs[a.i].Key, a.d)
		}
	}
	if g := s.Stats().Gathered; g != uint64(len(reqs)*n) {
		t.Fatalf("%d calls gathered, want %d", g, len(reqs)*n)
	}
}

// fastParts gathers each script's calls in parts of 2 to fastGroup keys,
// leaving a lone one (past a multiple of fastGroup, or a script's only
// call) with the rest: a one-key gathered call would be read by the
// script as a one-key call, whose ARGV differ (a group of 65 fixed-window
// calls failed its 65th with "arithmetic on upvalue 'nn'").
func TestFastPartsNoLoneCall(t *testing.T) {
	args := []string{"1", "1000", "1"}
	mk := func(n int, window bool) []*pending {
		ps := make([]*pending, n)
		for i := range ps {
			ps[i] = &pending{fast: fastCall{key: fmt.Sprint(i), args: args, window: window}}
		}
		return ps
	}
	for _, c := range []struct{ gcra, window, plain int }{
		{65, 0, 0}, {64, 1, 3}, {129, 2, 0}, {1, 1, 1}, {2, 65, 0},
	} {
		group := append(append(mk(c.gcra, false), mk(c.window, true)...), mk(c.plain, false)...)
		for _, p := range group[c.gcra+c.window:] {
			p.fast = fastCall{}
		}
		parts, rest := fastParts(group)
		seen := map[*pending]int{}
		for _, part := range parts {
			if len(part) < 2 || len(part) > fastGroup {
				t.Fatalf("%+v: a part of %d calls", c, len(part))
			}
			for _, p := range part {
				if p.fast.window != part[0].fast.window {
					t.Fatalf("%+v: a part mixes scripts", c)
				}
				seen[p]++
			}
		}
		for _, p := range rest {
			seen[p]++
		}
		if len(seen) != len(group) {
			t.Fatalf("%+v: %d of %d calls placed", c, len(seen), len(group))
		}
		for _, n := range seen {
			if n != 1 {
				t.Fatalf("%+v: a call placed %d times", c, n)
			}
		}
	}
}
