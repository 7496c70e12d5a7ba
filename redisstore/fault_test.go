package redisstore

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
)

// The failure policies, circuits and chaos tests are package guard's
// (guard/chaos_test.go). Here: the store's own errors and recovery.

// waitFor polls call until it returns nil, failing after 10s.
func waitFor(t *testing.T, what string, call func() error) {
	t.Helper()
	var err error
	redistest.PollUntil(time.Now().Add(10*time.Second), func() bool {
		err = call()
		return err == nil || !errors.Is(err, ErrUnavailable) // done, or failed for good
	})
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Redis is killed: calls fail with ErrUnavailable within the deadline;
// it restarts empty on the same port: the store recovers by itself
// (NOSCRIPT included).
func TestKillAndRestart(t *testing.T) {
	srv := redistest.NewStandalone(t)
	s := newStore(t, Options{URL: srv.URL(), DisableDenyCache: true, Logger: slog.New(slog.DiscardHandler)})
	ctx := context.Background()
	req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.GCRA, Limit: sluice.PerSecond(100), Cost: 1}
	if _, err := s.Apply(ctx, sluice.OpAllow, req); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	if _, err := s.Apply(ctx, sluice.OpAllow, req); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("killed: %v, want ErrUnavailable", err)
	}
	if st := s.Stats(); st.Errors == 0 {
		t.Fatalf("error not counted: %+v", st)
	}
	srv.Restart(t)
	waitFor(t, "after restart", func() error { _, err := s.Apply(ctx, sluice.OpAllow, req); return err })
}

// A store made while Redis is down does not fail: its calls fail with
// ErrUnavailable, and it connects when Redis appears.
func TestNewWhileRedisDown(t *testing.T) {
	srv := redistest.NewStandalone(t)
	srv.Kill()
	s := newStore(t, Options{URL: srv.URL(), Logger: slog.New(slog.DiscardHandler)})
	ctx := context.Background()
	req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.SlidingWindowCounter, Limit: sluice.PerSecond(100), Cost: 1}
	if _, err := s.Apply(ctx, sluice.OpAllow, req); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("before redis: %v, want ErrUnavailable", err)
	}
	if err := s.Ping(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("ping before redis: %v", err)
	}
	srv.Restart(t)
	waitFor(t, "ping once redis is up", func() error { return s.Ping(ctx) })
	if d, err := s.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed {
		t.Fatalf("%+v %v", d, err)
	}
}

// A server turned replica (as after a failover) refuses writes with
// READONLY: the store fails with ErrUnavailable naming it, and recovers
// once it is a master again.
func TestReadOnlyAfterFailover(t *testing.T) {
	srv := redistest.NewStandalone(t)
	other := redistest.NewStandalone(t)
	s := newStore(t, Options{URL: srv.URL(), DisableDenyCache: true})
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
	waitFor(t, "after promotion", func() error { _, err := s.Apply(ctx, sluice.OpAllow, req); return err })
}

// Heartbeats count the live instances: renewals do not add, Leave
// removes at once, and a heartbeat lapses after its TTL.
func TestHeartbeatCountsInstances(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newStore(t, Options{URL: srv.URL(), InstancesKey: redistest.Prefix(t) + "instances"})
	ctx := context.Background()
	for i, id := range []string{"a", "b", "c", "a"} {
		ttl := time.Minute
		if id == "c" {
			ttl = 50 * time.Millisecond
		}
		n, err := s.Heartbeat(ctx, id, ttl)
		if want := min(i+1, 3); err != nil || n != want {
			t.Fatalf("heartbeat %s: %d, %v; want %d", id, n, err, want)
		}
	}
	if err := s.Leave(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "c lapses", func() error {
		n, err := s.Heartbeat(ctx, "a", time.Minute)
		if err == nil && n != 1 {
			return ErrUnavailable
		}
		return err
	})
}

// On Cluster, NodeOf names the master that holds the key.
func TestClusterNodeOf(t *testing.T) {
	cl := redistest.SharedCluster(t)
	s := newStore(t, Options{URL: cl.URL()})
	ctx := context.Background()
	nodes, err := s.Nodes(ctx)
	if err != nil || len(nodes) != 3 {
		t.Fatalf("Nodes: %v, %v; want the 3 masters", nodes, err)
	}
	prefix := redistest.Prefix(t)
	seen := map[string]bool{}
	for i := range 30 {
		key := prefix + strconv.Itoa(i)
		if _, err := s.Apply(ctx, sluice.OpAllow, sluice.Request{Key: key, Algorithm: sluice.GCRA, Limit: sluice.PerSecond(10), Cost: 1}); err != nil {
			t.Fatal(err)
		}
		node := s.NodeOf(key)
		seen[node] = true
		if n, err := redistest.Do(ctx, node, "EXISTS", key); err != nil || n != int64(1) {
			t.Fatalf("key %d not on %s, the node NodeOf names: %v %v", i, node, n, err)
		}
		if err := s.PingNode(ctx, node); err != nil {
			t.Fatal(err)
		}
	}
	if len(seen) != 3 {
		t.Fatalf("30 keys on %d nodes", len(seen))
	}
}
