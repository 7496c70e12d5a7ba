package redistest

import (
	"bufio"
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"
)

func TestSentinelsFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	master := NewStandalone(t)
	replica := NewReplica(t, master)
	sen := NewSentinels(t, master, 2)
	if want := "redis+sentinel://" + sen.Nodes[0].Addr + "," + sen.Nodes[1].Addr + "/" + SentinelMaster; sen.URL() != want {
		t.Fatalf("URL %q, want %q", sen.URL(), want)
	}
	if err := sen.WaitMaster(ctx, master.Addr); err != nil {
		t.Fatal(err)
	}
	if err := sen.WaitReplicas(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := master.Do(ctx, "SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	if err := WaitReplicated(ctx, master, replica); err != nil {
		t.Fatal(err)
	}
	if v, err := replica.Do(ctx, "GET", "k"); err != nil || v != "v" {
		t.Fatalf("GET on the replica = %v, %v", v, err)
	}
	start := time.Now()
	master.Kill()
	if err := sen.Failover(ctx); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	if err := sen.WaitMaster(ctx, replica.Addr); err != nil {
		t.Fatal(err)
	}
	t.Logf("every sentinel names the replica %v after the kill", time.Since(start))
	if info, err := replica.Info(ctx, "replication"); err != nil || info["role"] != "master" {
		t.Fatalf("replica role %q, %v", info["role"], err)
	}
}

func TestTLSStandalone(t *testing.T) {
	s := NewTLSStandalone(t)
	if !strings.HasPrefix(s.URL(), "rediss://127.0.0.1:") {
		t.Fatalf("URL %q", s.URL())
	}
	conn, err := tls.Dial("tcp", s.Addr, s.ClientTLS())
	if err != nil {
		t.Fatalf("dial trusting the CA: %v", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(conn).ReadString('\n'); err != nil || line != "+PONG\r\n" {
		t.Fatalf("PING over TLS = %q, %v", line, err)
	}
	if c, err := tls.Dial("tcp", s.Addr, &tls.Config{MinVersion: tls.VersionTLS12, ServerName: "127.0.0.1"}); err == nil {
		c.Close()
		t.Fatal("dial without trusting the CA succeeded")
	}
}

func TestAddUser(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s := Standalone(t)
	name := "u" + strings.TrimSuffix(Prefix(t), ":")[len("TestAddUser:"):]
	if err := s.AddUser(ctx, name, "pw-1"); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Do(ctx, "AUTH", name, "pw-1"); err != nil || r != "OK" {
		t.Fatalf("AUTH = %v, %v", r, err)
	}
	if _, err := s.Do(ctx, "AUTH", name, "wrong"); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("AUTH with a wrong password = %v", err)
	}
}
