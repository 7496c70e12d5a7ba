package redistest

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) { Main(m) }

func TestStandaloneKillRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := NewStandalone(t)
	if r, err := s.Do(ctx, "SET", "k", "v"); err != nil || r != "OK" {
		t.Fatalf("SET = %v, %v", r, err)
	}
	s.Kill()
	if _, err := s.Do(ctx, "PING"); err == nil {
		t.Fatal("PING after Kill succeeded")
	}
	s.Restart(t)
	if r, err := s.Do(ctx, "GET", "k"); err != nil || r != nil {
		t.Fatalf("GET after restart = %v, %v; want nil (empty server)", r, err)
	}
	if _, err := s.Do(ctx, "NOSUCHCMD"); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Fatalf("error reply = %v", err)
	}
}

func TestSharedStandalone(t *testing.T) {
	a, b := Standalone(t), Standalone(t)
	if a != b {
		t.Fatal("Standalone started two servers")
	}
	info, err := a.Info(context.Background(), "server")
	if err != nil || info["redis_version"] == "" {
		t.Fatalf("INFO server = %v, %v", info["redis_version"], err)
	}
	if p1, p2 := Prefix(t), Prefix(t); p1 == p2 || !strings.HasPrefix(p1, "TestSharedStandalone:") {
		t.Fatalf("prefixes %q %q", p1, p2)
	}
}

func TestCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := SharedCluster(t)
	if len(c.Nodes) != 3 || !strings.HasPrefix(c.URL(), "redis+cluster://127.0.0.1:") {
		t.Fatalf("cluster %v", c.URL())
	}
	r, err := c.Nodes[0].Do(ctx, "CLUSTER", "INFO")
	if err != nil || !strings.Contains(r.(string), "cluster_known_nodes:3") {
		t.Fatalf("CLUSTER INFO = %v, %v", r, err)
	}
}
