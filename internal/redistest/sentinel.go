package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// SentinelMaster is the master set name that NewSentinels monitors.
const SentinelMaster = "mymaster"

// Sentinel timing. A sentinel considers the master down after
// sentinelDownAfter without a reply, and then promotes a replica by itself;
// Sentinels.Failover forces a promotion at once.
const (
	sentinelDownAfter       = 1000 // ms
	sentinelFailoverTimeout = 5000 // ms
)

// Sentinels are Redis Sentinel processes (redis-server --sentinel) that
// monitor one master under the name SentinelMaster, with quorum 1, so that
// any one of them can declare the master down and fail over.
//
//	master := redistest.NewStandalone(t)
//	replica := redistest.NewReplica(t, master)
//	sen := redistest.NewSentinels(t, master, 2)
//	// connect with sen.URL(), then master.Kill() and sen.Failover(ctx)
type Sentinels struct {
	// Nodes are the sentinel processes.
	Nodes []*Sentinel
}

// Sentinel is one sentinel process.
type Sentinel struct {
	// Addr is host:port, for example "127.0.0.1:41234".
	Addr string
	// Port is the TCP port the sentinel listens on.
	Port int

	dir  string
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// NewSentinels starts n sentinels monitoring master; t.Cleanup stops them.
// Each has its own writable config file in its own temporary directory, as
// a sentinel rewrites it.
func NewSentinels(t testing.TB, master *Server, n int) *Sentinels {
	t.Helper()
	sen := &Sentinels{}
	t.Cleanup(sen.stop)
	for range n {
		s, err := startSentinel(master.Port)
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		sen.Nodes = append(sen.Nodes, s)
	}
	return sen
}

// Addrs returns the sentinels' host:port addresses.
func (sen *Sentinels) Addrs() []string {
	out := make([]string, len(sen.Nodes))
	for i, n := range sen.Nodes {
		out[i] = n.Addr
	}
	return out
}

// URL returns the redis+sentinel:// URL naming every sentinel and the
// master set, as package redisstore reads it:
// "redis+sentinel://127.0.0.1:p1,127.0.0.1:p2/mymaster".
func (sen *Sentinels) URL() string {
	return "redis+sentinel://" + strings.Join(sen.Addrs(), ",") + "/" + SentinelMaster
}

// Failover asks the first sentinel to promote a replica now (SENTINEL
// FAILOVER), whether or not the master is reachable. It fails with the
// sentinel's reply, such as "NOGOODSLAVE", when no replica qualifies.
func (sen *Sentinels) Failover(ctx context.Context) error {
	_, err := Do(ctx, sen.Nodes[0].Addr, "SENTINEL", "FAILOVER", SentinelMaster)
	return err
}

// WaitMaster polls every sentinel until all of them name addr as the
// master, or ctx ends.
func (sen *Sentinels) WaitMaster(ctx context.Context, addr string) error {
	return poll(ctx, func() (bool, string) {
		var seen []string
		for _, n := range sen.Nodes {
			r, err := Do(ctx, n.Addr, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMaster)
			got := fmt.Sprint(r, err)
			if hp, ok := r.([]any); ok && err == nil && len(hp) == 2 {
				got = fmt.Sprintf("%v:%v", hp[0], hp[1])
			}
			seen = append(seen, n.Addr+" says "+got)
			if got != addr {
				return false, strings.Join(seen, "; ")
			}
		}
		return true, ""
	})
}

// WaitReplicas polls every sentinel until each lists at least n replicas
// that are connected, not down, and linked to the master, or ctx ends. A
// failover can only promote such a replica.
func (sen *Sentinels) WaitReplicas(ctx context.Context, n int) error {
	return poll(ctx, func() (bool, string) {
		for _, s := range sen.Nodes {
			r, err := Do(ctx, s.Addr, "SENTINEL", "REPLICAS", SentinelMaster)
			if err != nil {
				return false, s.Addr + ": " + err.Error()
			}
			list, _ := r.([]any)
			good := 0
			for _, rep := range list {
				f := fields(rep)
				if !strings.Contains(f["flags"], "down") && !strings.Contains(f["flags"], "disconnected") && f["master-link-status"] == "ok" {
					good++
				}
			}
			if good < n {
				return false, fmt.Sprintf("%s lists %d good replicas of %d: %v", s.Addr, good, len(list), list)
			}
		}
		return true, ""
	})
}

// NewReplica starts a standalone server replicating master and waits until
// its replication link is up; t.Cleanup stops it. It sets the master's
// repl-diskless-sync-delay to 0, so that the first sync starts at once
// rather than after Redis's default 5s.
func NewReplica(t testing.TB, master *Server) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if _, err := master.Do(ctx, "CONFIG", "SET", "repl-diskless-sync-delay", "0"); err != nil {
		t.Fatalf("redistest: master %s: %v", master.Addr, err)
	}
	r := NewStandalone(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	err := poll(ctx, func() (bool, string) {
		info, err := r.Info(ctx, "replication")
		if err != nil {
			return false, err.Error()
		}
		return info["master_link_status"] == "up", "master_link_status " + info["master_link_status"]
	})
	if err != nil {
		t.Fatalf("redistest: replica %s of %s: %v", r.Addr, master.Addr, err)
	}
	return r
}

// WaitReplicated polls replica until it has received everything master
// had written when WaitReplicated was called (its slave_repl_offset reaches
// the master's master_repl_offset), or ctx ends. Unlike WAIT on a new
// connection, which has written nothing, it covers other clients' writes.
func WaitReplicated(ctx context.Context, master, replica *Server) error {
	info, err := master.Info(ctx, "replication")
	if err != nil {
		return err
	}
	want, err := strconv.ParseInt(info["master_repl_offset"], 10, 64)
	if err != nil {
		return fmt.Errorf("redistest: master_repl_offset %q: %w", info["master_repl_offset"], err)
	}
	return poll(ctx, func() (bool, string) {
		info, err := replica.Info(ctx, "replication")
		if err != nil {
			return false, err.Error()
		}
		got, _ := strconv.ParseInt(info["slave_repl_offset"], 10, 64)
		return got >= want, fmt.Sprintf("replica %s at offset %d, master %s at %d", replica.Addr, got, master.Addr, want)
	})
}

// fields turns a flat [k1 v1 k2 v2 ...] reply into a map.
func fields(r any) map[string]string {
	list, _ := r.([]any)
	out := make(map[string]string, len(list)/2)
	for i := 0; i+1 < len(list); i += 2 {
		out[fmt.Sprint(list[i])] = fmt.Sprint(list[i+1])
	}
	return out
}

// poll calls cond every 20ms until it reports true or ctx ends; the error
// then carries cond's last explanation.
func poll(ctx context.Context, cond func() (bool, string)) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, why := cond()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s", ctx.Err(), why)
		case <-tick.C:
		}
	}
}

func startSentinel(masterPort int) (*Sentinel, error) {
	var s *Sentinel
	err := withFreePort("redistest-sentinel-", nil, func(dir string, port int) error {
		s = &Sentinel{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, dir: dir}
		conf := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\nlogfile \"\"\nloglevel notice\n"+
			"sentinel monitor %s 127.0.0.1 %d 1\n"+
			"sentinel down-after-milliseconds %[3]s %d\n"+
			"sentinel failover-timeout %[3]s %d\n",
			port, dir, SentinelMaster, masterPort, sentinelDownAfter, sentinelFailoverTimeout)
		path := filepath.Join(dir, "sentinel.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			return fmt.Errorf("sentinel config: %w", err)
		}
		return s.start(path)
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// start runs the sentinel and polls it with PING until it answers: a
// sentinel does not log "Ready to accept connections".
func (s *Sentinel) start(conf string) error {
	cmd := exec.Command("redis-server", conf, "--sentinel")
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("redis-server --sentinel pipe: %w", err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server --sentinel: %w", err)
	}
	var logMu sync.Mutex
	var logTail strings.Builder
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			logMu.Lock()
			if logTail.Len() < 8<<10 {
				logTail.WriteString(sc.Text() + "\n")
			}
			logMu.Unlock()
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	err = poll(ctx, func() (bool, string) {
		select {
		case <-done:
			cancel()
			return false, "exited"
		default:
		}
		r, err := Do(ctx, s.Addr, "PING")
		return err == nil && r == "PONG", fmt.Sprint(r, err)
	})
	if err != nil {
		_ = cmd.Process.Kill()
		<-done
		logMu.Lock()
		defer logMu.Unlock()
		if errors.Is(err, context.Canceled) {
			return fmt.Errorf("sentinel on %s exited at start:\n%s", s.Addr, logTail.String())
		}
		return fmt.Errorf("sentinel on %s not ready: %w\n%s", s.Addr, err, logTail.String())
	}
	s.cmd, s.done = cmd, done
	return nil
}

// Kill stops the sentinel at once with SIGKILL and waits for it to exit.
// Killing a stopped sentinel does nothing. Call it from one goroutine.
func (s *Sentinel) Kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

func (sen *Sentinels) stop() {
	for _, n := range sen.Nodes {
		n.Kill()
		_ = os.RemoveAll(n.dir)
	}
}
