package redisstore

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
)

// The guard's probe reaches a Redis that answers slower than half the
// probe's deadline. A ping with a deadline, sent alone, went in rueidis'
// synchronous mode, which closes the connection when the deadline passes;
// the next ping paid a redial (the handshake's round trip and its own),
// missed its deadline, closed the connection again, and so on: after one
// late ping, every ping failed while Redis answered in 150ms of 250ms, and
// the guard's circuit never closed (Local's debts were never settled).
func TestPingReachesSlowRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	px := redistest.NewProxy(t, srv.Addr)
	s := newStore(t, Options{URL: px.URL(), Logger: slog.New(slog.DiscardHandler)})
	ping := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
		defer cancel()
		return s.PingNode(ctx, s.NodeOf("k"))
	}
	if err := ping(); err != nil {
		t.Fatal(err)
	}
	px.Hold.Store(true)
	if err := ping(); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, sluice.ErrUnavailable) {
		// the guard counts a late probe apart from a refused one
		t.Fatalf("a held ping: %v, want its deadline exceeded", err)
	}
	px.Delay.Store(int64(150 * time.Millisecond))
	px.Hold.Store(false)
	// The held ping's reply comes first (150ms), then the pings answer.
	var failed int
	for range 8 {
		if err := ping(); err != nil {
			failed++
		}
	}
	if failed > 1 {
		t.Fatalf("%d of 8 pings failed with replies in 150ms and a 250ms deadline", failed)
	}
}

// A refund or a charge keeps its caller's deadline, even one beyond the
// store's timeout: Redis applies it whether or not the reply comes in
// time, so a caller that can wait learns that it was applied instead of
// sending it again. Decisions keep the store's timeout.
func TestSettlingKeepsCallerDeadline(t *testing.T) {
	srv := redistest.Standalone(t)
	px := redistest.NewProxy(t, srv.Addr)
	s, err := New(context.Background(), Options{URL: px.URL(), Timeout: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 100, Period: time.Hour, Burst: 100}, Cost: 1}
	if _, err := s.Apply(context.Background(), sluice.OpPeek, req); err != nil {
		t.Fatal(err)
	}
	px.Delay.Store(int64(300 * time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, op := range []sluice.Op{sluice.OpCharge, sluice.OpRefund} {
		if _, err := s.Apply(ctx, op, req); err != nil {
			t.Fatalf("%s with a 10s deadline, 300ms replies, a 100ms store timeout: %v", op, err)
		}
		if _, err := s.ApplyAll(ctx, op, []sluice.Request{req}); err != nil {
			t.Fatalf("%s batch: %v", op, err)
		}
	}
	// Each applied once: the two charges and the two refunds cancel out.
	d, err := New(context.Background(), Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if p, err := d.Apply(context.Background(), sluice.OpPeek, req); err != nil || p.Remaining != 100 {
		t.Fatalf("after: %+v %v, want 100 remaining", p, err)
	}
	if _, err := s.Apply(ctx, sluice.OpAllow, req); err == nil {
		t.Fatal("a decision waited past the store's timeout")
	}
}

// Redis refusing writes (OOM under maxmemory noeviction) and Redis busy
// with another client's endless script (BUSY) are store failures: a call
// fails with ErrUnavailable (the guard's policy answers it) or, where Redis
// lets the script write (under OOM a script whose first write is not a
// denied command, such as the log's, runs whole), is decided and charged
// as usual. Never is a call admitted without its charge, nor part of a
// batch charged; the store works again once Redis does.
func TestRefusedWritesAndBusyAreUnavailable(t *testing.T) {
	srv := redistest.NewStandalone(t, "--maxmemory-policy", "noeviction", "--busy-reply-threshold", "50")
	ctx := context.Background()
	lim := sluice.Limit{Rate: 1000, Period: time.Hour, Burst: 1000}
	stores := map[string]*Store{
		"scripts": newStore(t, Options{URL: srv.URL(), DisableDenyCache: true}),
		"plain":   newStore(t, Options{URL: srv.URL(), DisableDenyCache: true, PlainWindows: true}),
	}
	reqsOf := map[string][]sluice.Request{}
	charged := map[string]int64{} // by key: units Redis confirmed
	for name := range stores {
		p := redistest.Prefix(t) + name
		reqsOf[name] = []sluice.Request{
			{Key: p + "{t}gcra", Algorithm: sluice.GCRA, Limit: lim, Cost: 1},
			{Key: p + "{t}tb", Algorithm: sluice.TokenBucket, Limit: lim, Cost: 1},
			{Key: p + "{t}fw", Algorithm: sluice.FixedWindow, Limit: sluice.PerHour(1000), Cost: 1},
			{Key: p + "{t}swc", Algorithm: sluice.SlidingWindowCounter, Limit: sluice.PerHour(1000), Cost: 1},
			{Key: p + "{t}log", Algorithm: sluice.SlidingWindowLog, Limit: sluice.PerHour(1000), Cost: 1},
		}
	}
	var failed int
	fault := func(what string) {
		t.Helper()
		for name, s := range stores {
			reqs := reqsOf[name]
			for _, r := range reqs {
				for _, op := range []sluice.Op{sluice.OpAllow, sluice.OpCharge} {
					d, err := s.Apply(ctx, op, r)
					switch {
					case err != nil && !errors.Is(err, sluice.ErrUnavailable):
						t.Fatalf("%s, %s store, %s %s: %v, want ErrUnavailable", what, name, op, r.Algorithm, err)
					case err != nil:
						failed++
					case op == sluice.OpCharge || d.Allowed:
						charged[r.Key]++
					}
				}
			}
			ds, err := s.ApplyAll(ctx, sluice.OpAllow, reqs)
			switch {
			case err != nil && !errors.Is(err, sluice.ErrUnavailable):
				t.Fatalf("%s, %s store, batch: %v, want ErrUnavailable", what, name, err)
			case err != nil:
				failed++
			default:
				for i := range reqs {
					charged[reqs[i].Key]++
				}
				if !ds[0].Allowed {
					t.Fatalf("%s, %s store: batch denied under the limit: %+v", what, name, ds)
				}
			}
		}
	}
	check := func(what string) {
		t.Helper()
		for name, s := range stores {
			reqs := reqsOf[name]
			ds, err := s.ApplyAll(ctx, sluice.OpPeek, reqs)
			if err != nil {
				t.Fatalf("%s, %s store: %v", what, name, err)
			}
			for i, d := range ds {
				if used := 1000 - d.Remaining; used != charged[reqs[i].Key] {
					t.Fatalf("%s, %s store: %s used %d, but %d were confirmed", what, name, reqs[i].Algorithm, used, charged[reqs[i].Key])
				}
			}
		}
	}
	// Over maxmemory: writes are refused with OOM.
	if _, err := srv.Do(ctx, "CONFIG", "SET", "maxmemory", "1"); err != nil {
		t.Fatal(err)
	}
	fault("OOM")
	if _, err := srv.Do(ctx, "CONFIG", "SET", "maxmemory", "0"); err != nil {
		t.Fatal(err)
	}
	check("after OOM")
	t.Logf("under OOM: %d of %d calls failed, the others were charged", failed, 2*(2*5+1))
	if failed == 0 {
		t.Fatal("no call failed under OOM")
	}
	// Another client's script that never ends: BUSY after 50ms, until
	// SCRIPT KILL.
	failed = 0
	busy := make(chan error, 1)
	go func() {
		_, err := srv.Do(ctx, "EVAL", "while true do end", "0")
		busy <- err
	}()
	waitBusy := time.Now().Add(10 * time.Second)
	for {
		_, err := srv.Do(ctx, "PING")
		if err != nil && strings.Contains(err.Error(), "BUSY") {
			break
		}
		if time.Now().After(waitBusy) {
			t.Fatalf("no BUSY within 10s: %v", err)
		}
	}
	fault("BUSY")
	if _, err := srv.Do(ctx, "SCRIPT", "KILL"); err != nil {
		t.Fatal(err)
	}
	<-busy
	check("after BUSY")
	if want := 2 * (2*5 + 1); failed != want {
		t.Fatalf("%d calls failed while Redis was BUSY, want all %d", failed, want)
	}
	for name, s := range stores {
		if d, err := s.Apply(ctx, sluice.OpAllow, reqsOf[name][0]); err != nil || !d.Allowed {
			t.Fatalf("%s store after BUSY: %+v %v", name, d, err)
		}
	}
}

// Connections that went dead without closing (Redis moved, the old host
// drops every packet) are given up and redialled: every call fails with
// ErrUnavailable at its deadline meanwhile, and the store answers again by
// itself.
func TestStrandedConnectionsRedialled(t *testing.T) {
	srv := redistest.Standalone(t)
	px := redistest.NewProxy(t, srv.Addr)
	s := newStore(t, Options{URL: px.URL(), Timeout: time.Second, Logger: slog.New(slog.DiscardHandler)})
	ctx := context.Background()
	req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.GCRA, Limit: sluice.PerSecond(1_000_000), Cost: 1}
	for range 20 {
		if _, err := s.Apply(ctx, sluice.OpAllow, req); err != nil {
			t.Fatal(err)
		}
	}
	px.Strand()
	start := time.Now()
	failed := 0
	for {
		_, err := s.Apply(ctx, sluice.OpAllow, req)
		if err == nil {
			break
		}
		if !errors.Is(err, sluice.ErrUnavailable) {
			t.Fatalf("stranded: %v", err)
		}
		failed++
		if time.Since(start) > 30*time.Second {
			t.Fatalf("no answer 30s after the connections went dead (%d calls failed)", failed)
		}
	}
	t.Logf("answering again after %s, %d calls failed", time.Since(start), failed)
	if failed == 0 {
		t.Fatal("no call failed: the connections were not stranded")
	}
}

// A key's slot moves to another master (CLUSTER SETSLOT MIGRATING /
// IMPORTING, MIGRATE, SETSLOT NODE) while two stores hammer it: the
// redirections (ASK while the slot migrates, MOVED after) are followed or
// fail with ErrUnavailable, and the key's state moves with it: admitted
// stays within the burst and what refilled meanwhile (+1).
func TestClusterSlotMovesUnderLoad(t *testing.T) {
	cl := redistest.NewCluster(t)
	ctx := context.Background()
	key := redistest.Prefix(t) + "{moving}k"
	slot := strconv.Itoa(int(keySlot(key)))
	ids := map[string]string{} // addr → node id
	for _, n := range cl.Nodes {
		id, err := n.Do(ctx, "CLUSTER", "MYID")
		if err != nil {
			t.Fatal(err)
		}
		ids[n.Addr] = id.(string)
	}
	stores := []*Store{newStore(t, Options{URL: cl.URL(), DisableDenyCache: true}), newStore(t, Options{URL: cl.URL(), DisableDenyCache: true})}
	for _, s := range stores {
		if _, err := s.Nodes(ctx); err != nil { // learns the slots
			t.Fatal(err)
		}
	}
	var from, to *redistest.Server
	for _, n := range cl.Nodes {
		if n.Addr == stores[0].NodeOf(key) {
			from = n
		} else if to == nil {
			to = n
		}
	}
	if from == nil {
		t.Fatalf("no master owns %s", stores[0].NodeOf(key))
	}
	lim := sluice.Limit{Rate: 1000, Period: time.Hour, Burst: 1000}
	req := sluice.Request{Key: key, Algorithm: sluice.GCRA, Limit: lim, Cost: 1}
	var admitted, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	began := time.Now()
	for i := range 8 {
		s := stores[i%2]
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				d, err := s.Apply(ctx, sluice.OpAllow, req)
				switch {
				case err != nil && !errors.Is(err, sluice.ErrUnavailable):
					t.Errorf("while the slot moves: %v", err)
					return
				case err != nil:
					failed.Add(1)
				case d.Allowed:
					admitted.Add(1)
				}
			}
		})
	}
	// A fifth of the burst before the move, the rest during and after it.
	for admitted.Load() < lim.Burst/5 {
		runtime.Gosched()
	}
	before := admitted.Load()
	do := func(n *redistest.Server, args ...string) {
		t.Helper()
		if _, err := n.Do(ctx, args...); err != nil {
			t.Fatalf("%s on %s: %v", args, n.Addr, err)
		}
	}
	do(to, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[from.Addr])
	do(from, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to.Addr])
	host, port, _ := strings.Cut(to.Addr, ":")
	do(from, "MIGRATE", host, port, "", "0", "5000", "KEYS", key)
	for _, n := range cl.Nodes {
		do(n, "CLUSTER", "SETSLOT", slot, "NODE", ids[to.Addr])
	}
	moved := admitted.Load()
	// Until the burst is spent on the new owner, or a while.
	bound := time.Now().Add(10 * time.Second)
	for time.Now().Before(bound) {
		d, err := stores[0].Apply(ctx, sluice.OpPeek, req)
		if err == nil && d.Remaining == 0 {
			break
		}
		runtime.Gosched()
	}
	close(stop)
	wg.Wait()
	// The limit allows the burst and what refilled meanwhile (+1).
	ideal := float64(lim.Burst) + float64(lim.Rate)*time.Since(began).Seconds()/lim.Period.Seconds()
	t.Logf("admitted %d of a burst of %d (%d before the move, %d when it ended), %d calls failed", admitted.Load(), lim.Burst, before, moved, failed.Load())
	if moved >= lim.Burst {
		t.Fatal("the burst was spent before the slot moved")
	}
	if float64(admitted.Load()) > ideal+1 {
		t.Fatalf("admitted %d, the limit allows %.1f (+1): the state did not move with the key", admitted.Load(), ideal)
	}
	if n, err := to.Do(ctx, "EXISTS", key); err != nil || n != int64(1) {
		t.Fatalf("key on the new owner: %v %v", n, err)
	}
}

// A refund or a charge goes through its node's group unless its caller
// gives it a deadline later than the store's timeout (a group has the
// store's timeout): settlement traffic with the usual deadline keeps its
// batching.
func TestSettlingKeepsItsGroup(t *testing.T) {
	s := newStore(t, Options{URL: redistest.Standalone(t).URL(), Timeout: time.Second, Logger: slog.New(slog.DiscardHandler)})
	p := probeCommits(s)
	req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 100, Period: time.Hour, Burst: 100}, Cost: 1}
	for _, c := range []struct {
		deadline time.Duration
		grouped  bool
	}{{time.Second, true}, {10 * time.Second, false}} {
		ctx, cancel := context.WithTimeout(context.Background(), c.deadline)
		for _, op := range []sluice.Op{sluice.OpCharge, sluice.OpRefund} {
			if _, err := s.Apply(ctx, op, req); err != nil {
				t.Fatal(err)
			}
			sent := 0
			for len(p.events) > 0 {
				<-p.events
				sent++
			}
			if (sent > 0) != c.grouped {
				t.Errorf("%s with a %s deadline, a 1s store timeout: %d commit events, want grouped %v", op, c.deadline, sent, c.grouped)
			}
		}
		cancel()
	}
}

// A Redis that may evict keys at maxmemory would drop a used-up key's
// state under memory pressure (which a caller can cause with fresh keys),
// and the key would start over: the store says so when it connects, and
// only then.
func TestWarnsWhenRedisMayEvict(t *testing.T) {
	for _, tc := range []struct {
		args []string
		warn bool
	}{
		{[]string{"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"}, true},
		{[]string{"--maxmemory", "100mb", "--maxmemory-policy", "volatile-ttl"}, true},
		{[]string{"--maxmemory", "100mb", "--maxmemory-policy", "noeviction"}, false},
		{[]string{"--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"}, false},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			srv := redistest.NewStandalone(t, tc.args...)
			var buf strings.Builder
			var mu sync.Mutex
			h := slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
				mu.Lock()
				defer mu.Unlock()
				return buf.Write(p)
			}), nil)
			newStore(t, Options{URL: srv.URL(), Logger: slog.New(h)})
			mu.Lock()
			defer mu.Unlock()
			if got := strings.Contains(buf.String(), "may evict"); got != tc.warn {
				t.Fatalf("warned %v, want %v; log:\n%s", got, tc.warn, buf.String())
			}
		})
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
