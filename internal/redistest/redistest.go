// Package redistest starts real redis-server processes for tests: a
// standalone server and a three-master Cluster, each on free ports in a
// temporary directory, with persistence off.
//
// Most tests share one server per test binary:
//
//	func TestMain(m *testing.M) { redistest.Main(m) }
//
//	func TestX(t *testing.T) {
//		srv := redistest.Standalone(t) // started once, shared
//		prefix := redistest.Prefix(t)  // unique key prefix for this test
//		...
//	}
//
// Tests that kill or reconfigure a server start their own with
// NewStandalone, which t.Cleanup stops. Nothing here flushes a server: tests
// keep apart by key prefix.
//
// If redis-server or redis-cli is missing, the helpers fail the test with
// a message naming the package to install; they never skip.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startTimeout bounds how long a server or cluster may take to come up.
const startTimeout = 20 * time.Second

// Server is one redis-server process.
type Server struct {
	// Addr is host:port, for example "127.0.0.1:41234".
	Addr string
	// Port is the TCP port the server listens on.
	Port int

	dir  string
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// URL returns the server's redis:// URL.
func (s *Server) URL() string { return "redis://" + s.Addr }

// shared holds the servers shared by the tests of one binary.
var shared struct {
	mu         sync.Mutex
	standalone *Server
	cluster    *Cluster
	stops      []func()
}

// Main runs the tests of a package and then stops the shared servers. Call
// it from TestMain. Without it the shared servers still die with the test
// process (they are started with a parent-death signal), but later.
func Main(m *testing.M) {
	code := m.Run()
	shared.mu.Lock()
	for _, stop := range shared.stops {
		stop()
	}
	shared.mu.Unlock()
	os.Exit(code)
}

// Standalone returns the standalone server shared by this test binary,
// starting it on first use. Do not Kill it; use NewStandalone for that.
func Standalone(t testing.TB) *Server {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.standalone == nil {
		s, err := startServer(nil)
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		shared.standalone = s
		shared.stops = append(shared.stops, s.stop)
	}
	return shared.standalone
}

// NewStandalone starts a standalone server for this test alone; t.Cleanup
// stops it. extra are further redis-server arguments, such as
// "--maxmemory", "10mb".
func NewStandalone(t testing.TB, extra ...string) *Server {
	t.Helper()
	s, err := startServer(extra)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(s.stop)
	return s
}

// Prefix returns a key prefix unique to this test and run, ending in ':',
// such as "TestAllow/gcra:3f9a1c:".
func Prefix(t testing.TB) string {
	name := strings.NewReplacer(" ", "_", "{", "(", "}", ")").Replace(t.Name())
	return fmt.Sprintf("%s:%06x:", name, rand.Uint32()&0xffffff)
}

// checkBinaries reports a clear error when the Redis binaries are missing.
func checkBinaries() error {
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("%s not found in PATH: install it (Debian: apt-get install redis-server redis-tools); .ci/run does so: %w", bin, err)
		}
	}
	return nil
}

// freePort finds a port p such that p and p+10000 (the cluster bus) are
// both free now. Another process may still take it before redis binds it;
// startServer retries then.
func freePort() (int, error) {
	for range 100 {
		p := 20000 + rand.IntN(30000)
		ok := true
		for _, q := range []int{p, p + 10000} {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(q))
			if err != nil {
				ok = false
				break
			}
			_ = l.Close()
		}
		if ok {
			return p, nil
		}
	}
	return 0, errors.New("no free port pair found")
}

// baseArgs are the options of every test server besides its ports:
// loopback only, no persistence, logs to stdout.
func baseArgs(dir string) []string {
	return []string{
		"--bind", "127.0.0.1",
		"--dir", dir,
		"--save", "",
		"--appendonly", "no",
		"--protected-mode", "no",
		"--loglevel", "notice",
		"--logfile", "",
	}
}

// withFreePort makes a temp dir for a process (prepare may fill it first)
// and calls start with free ports until one works, five tries: a port can
// be taken between choosing and binding it. The dir is removed on failure.
func withFreePort(prefix string, prepare func(dir string) error, start func(dir string, port int) error) error {
	if err := checkBinaries(); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	if prepare != nil {
		if err := prepare(dir); err != nil {
			_ = os.RemoveAll(dir)
			return err
		}
	}
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			lastErr = err
			break
		}
		if lastErr = start(dir, port); lastErr == nil {
			return nil
		}
	}
	_ = os.RemoveAll(dir)
	return lastErr
}

func startServer(extra []string) (*Server, error) {
	var s *Server
	err := withFreePort("redistest-", nil, func(dir string, port int) error {
		s = &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, dir: dir}
		s.args = append(append([]string{"--port", strconv.Itoa(port)}, baseArgs(dir)...), extra...)
		return s.start()
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// start runs redis-server and waits until it logs that it accepts
// connections.
func (s *Server) start() error {
	cmd := exec.Command("redis-server", s.args...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("redis-server pipe: %w", err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	ready := make(chan struct{})
	var logTail strings.Builder
	var logMu sync.Mutex
	go func() {
		sc := bufio.NewScanner(out)
		signalled := false
		for sc.Scan() {
			line := sc.Text()
			logMu.Lock()
			if logTail.Len() < 8<<10 {
				logTail.WriteString(line + "\n")
			}
			logMu.Unlock()
			if !signalled && strings.Contains(line, "Ready to accept connections") {
				close(ready)
				signalled = true
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case <-ready:
	case <-done:
		logMu.Lock()
		defer logMu.Unlock()
		return fmt.Errorf("redis-server on %s exited at start:\n%s", s.Addr, logTail.String())
	case <-timer.C:
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("redis-server on %s not ready after %s", s.Addr, startTimeout)
	}
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	return nil
}

// Kill stops the server at once with SIGKILL, as a crash would, and waits
// for it to exit. Its data is lost. Killing a stopped server does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Restart starts a killed server again on the same port, empty (scripts
// included). It fails the test if the server does not come up. Restarting a
// running server kills it first.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Kill()
	var err error
	// The port can be held briefly after SIGKILL, by the clients' redials
	// too (an outgoing connection may get it as its local port): a loaded
	// machine took over 1s to free it.
	started := PollUntil(time.Now().Add(10*time.Second), func() bool {
		if err = s.start(); err != nil && strings.Contains(err.Error(), "in use") {
			return false // the port is not free yet: ask again
		}
		return true // up, or failed for another reason
	})
	if !started || err != nil {
		t.Fatalf("redistest: restart %s: %v", s.Addr, err)
	}
}

// Freeze stops the server with SIGSTOP: it keeps its connections and
// accepts new ones, but answers nothing until Thaw, as a stalled host.
func (s *Server) Freeze() error { return s.signal(syscall.SIGSTOP) }

// Thaw resumes a server that Freeze stopped (SIGCONT).
func (s *Server) Thaw() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		return errors.New("redistest: server not running")
	}
	return cmd.Process.Signal(sig)
}

func (s *Server) stop() {
	s.Kill()
	_ = os.RemoveAll(s.dir)
}

// Do sends one command to the server on a new connection and returns the
// reply: string, int64, []any, nil, or an error for a Redis error reply.
func (s *Server) Do(ctx context.Context, args ...string) (any, error) {
	return Do(ctx, s.Addr, args...)
}

// Info returns the fields of INFO section as a map, for example
// Info(ctx, "memory")["used_memory"].
func (s *Server) Info(ctx context.Context, section string) (map[string]string, error) {
	r, err := s.Do(ctx, "INFO", section)
	if err != nil {
		return nil, err
	}
	text, ok := r.(string)
	if !ok {
		return nil, fmt.Errorf("redistest: INFO reply is %T", r)
	}
	out := map[string]string{}
	for _, line := range strings.Split(text, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, "#") {
			out[k] = v
		}
	}
	return out, nil
}

// CommandCalls returns how many times cmd (lowercase, such as "evalsha")
// has run since the last CONFIG RESETSTAT, from INFO commandstats.
func (s *Server) CommandCalls(ctx context.Context, cmd string) (int64, error) {
	info, err := s.Info(ctx, "commandstats")
	if err != nil {
		return 0, err
	}
	stat, ok := info["cmdstat_"+cmd]
	if !ok {
		return 0, nil
	}
	for _, f := range strings.Split(stat, ",") {
		if v, ok := strings.CutPrefix(f, "calls="); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("redistest: no calls in %q", stat)
}

// Cluster is a three-master Redis Cluster, without replicas unless made
// by NewClusterWithReplicas.
type Cluster struct {
	// Nodes are the masters.
	Nodes []*Server
	// Replicas are the replicas, one per master with
	// NewClusterWithReplicas.
	Replicas []*Server
}

// Addrs returns the nodes' host:port addresses.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr
	}
	return out
}

// URL returns a redis+cluster:// URL naming every node as a seed, as
// package redisstore reads it: "redis+cluster://127.0.0.1:p1,127.0.0.1:p2,...".
func (c *Cluster) URL() string { return "redis+cluster://" + strings.Join(c.Addrs(), ",") }

// SharedCluster returns the Cluster shared by this test binary, starting it
// on first use.
func SharedCluster(t testing.TB) *Cluster {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.cluster == nil {
		c, err := startCluster()
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		shared.cluster = c
		shared.stops = append(shared.stops, c.stop)
	}
	return shared.cluster
}

// NewCluster starts a Cluster for this test alone; t.Cleanup stops it.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	c, err := startCluster()
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(c.stop)
	return c
}

// NewClusterWithReplicas starts a six-node Cluster for this test alone:
// three masters, each with a replica that takes over (after the 2s node
// timeout) when its master dies; it returns once every replica has synced. DEBUG is enabled on every node, for
// DEBUG SLEEP, and cluster-require-full-coverage is off, as production
// should have it: while one master is down, the others keep serving their
// slots instead of answering CLUSTERDOWN. t.Cleanup stops it.
func NewClusterWithReplicas(t testing.TB) *Cluster {
	t.Helper()
	c, err := startClusterN(1, "--enable-debug-command", "yes", "--cluster-require-full-coverage", "no", "--repl-diskless-sync-delay", "0")
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(c.stop)
	return c
}

func startCluster() (*Cluster, error) { return startClusterN(0) }

// startClusterN starts three masters with replicas replicas each.
func startClusterN(replicas int, extra ...string) (*Cluster, error) {
	c := &Cluster{}
	var all []*Server
	for range 3 * (1 + replicas) {
		s, err := startServer(append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"}, extra...))
		if err != nil {
			c.Nodes = all
			c.stop()
			return nil, err
		}
		all = append(all, s)
	}
	c.Nodes = all
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	// Every node must see the whole cluster before tests route to it.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for _, n := range c.Nodes {
		for {
			info, err := n.Do(ctx, "CLUSTER", "INFO")
			if s, ok := info.(string); err == nil && ok && strings.Contains(s, "cluster_state:ok") {
				break
			}
			select {
			case <-ctx.Done():
				c.stop()
				return nil, fmt.Errorf("cluster on %v not ok after %s: %v %v", c.Addrs(), startTimeout, info, err)
			case <-tick.C:
			}
		}
	}
	if replicas > 0 {
		c.Nodes = nil
		for _, n := range all {
			role, err := n.Do(ctx, "ROLE")
			if r, ok := role.([]any); err == nil && ok && len(r) > 0 && r[0] == "master" {
				c.Nodes = append(c.Nodes, n)
			} else {
				c.Replicas = append(c.Replicas, n)
			}
		}
		if len(c.Nodes) != 3 {
			c.Nodes = all
			c.stop()
			return nil, fmt.Errorf("cluster has %d masters, want 3", len(c.Nodes))
		}
		// A replica that has not finished its first sync refuses to take
		// over (its data is too old), and a master killed before then
		// was never failed over.
		for _, r := range c.Replicas {
			for {
				info, err := r.Do(ctx, "INFO", "replication")
				if s, ok := info.(string); err == nil && ok && strings.Contains(s, "master_link_status:up") {
					break
				}
				select {
				case <-ctx.Done():
					c.Nodes = all
					c.stop()
					return nil, fmt.Errorf("replica %s not in sync after %s: %v %v", r.Addr, startTimeout, info, err)
				case <-tick.C:
				}
			}
		}
	}
	return c, nil
}

func (c *Cluster) stop() {
	for _, n := range append(c.Nodes, c.Replicas...) {
		n.stop()
	}
}

// Do sends one command to the server at addr on a new connection and
// returns its reply: string, int64, []any, nil, or an error for a Redis
// error reply.
func Do(ctx context.Context, addr string, args ...string) (any, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	} else {
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	return readReply(bufio.NewReader(conn))
}

// ErrReply is a Redis error reply.
type ErrReply string

// Error implements error.
func (e ErrReply) Error() string { return "redistest: redis: " + string(e) }

func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("redistest: read reply: %w", err)
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("redistest: empty reply line")
	}
	body := line[1:]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return nil, ErrReply(body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, fmt.Errorf("redistest: read bulk: %w", err)
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			v, err := readReply(r)
			if err != nil {
				var e ErrReply
				if !errors.As(err, &e) {
					return nil, err
				}
				v = e
			}
			out[i] = v
		}
		return out, nil
	}
	return nil, fmt.Errorf("redistest: unknown reply %q", line)
}

// NewClusterPartialCoverage starts three masters without replicas for this
// test alone, with cluster-require-full-coverage off: while one master is
// down, the others keep serving their slots (as production should have
// it) instead of answering CLUSTERDOWN after the node timeout. t.Cleanup
// stops it.
func NewClusterPartialCoverage(t testing.TB) *Cluster {
	t.Helper()
	c, err := startClusterN(0, "--cluster-require-full-coverage", "no")
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(c.stop)
	return c
}
