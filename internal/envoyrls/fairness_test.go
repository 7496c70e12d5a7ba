package envoyrls

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Fairness on the gRPC port: a flood from one client (its own peer
// address, 127.0.0.2) leaves a well-behaved client's p99 within 10× its
// quiet baseline measured in the same run, or 50 ms, whichever is larger,
// and the server's memory under 256 MiB. The server and the flood are
// processes of their own (fairness_child_test.go).
const (
	fairRatio     = 10
	fairFloor     = 50 * time.Millisecond
	fairMemBound  = 256 << 20
	floodSourceIP = "127.0.0.2"
)

// floodFor is how long the well-behaved client is measured under a flood:
// 2 s, or SLUICE_FAIRNESS_FLOOD (a Go duration) for a longer run
// (docs/BENCHMARKS.md).
func floodFor(t *testing.T) time.Duration {
	t.Helper()
	v := os.Getenv("SLUICE_FAIRNESS_FLOOD")
	if v == "" {
		return 2 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("SLUICE_FAIRNESS_FLOOD=%q: want a positive duration such as 30s", v)
	}
	return d
}

// child is a process of the fairness tests.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	err   bytes.Buffer
}

func startChild(t *testing.T, mode string, env ...string) *child {
	t.Helper()
	c := &child{cmd: exec.Command(os.Args[0], "-test.run=^$"), lines: make(chan string, 16)}
	c.cmd.Env = append(os.Environ(), append([]string{childEnv + "=" + mode}, env...)...)
	c.cmd.Stderr = &c.err
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() { c.stop(t) })
	return c
}

// expect waits for the child's next line starting with prefix and returns
// the rest of it.
func (c *child) expect(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(60 * time.Second) // bounds a broken child, not the test's timing
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("%s child ended before %q: %s", c.cmd.Env[len(os.Environ())], prefix, c.err.String())
			}
			if rest, ok := strings.CutPrefix(l, prefix); ok {
				return strings.TrimSpace(rest)
			}
		case <-timeout:
			t.Fatalf("no %q from the child in 60s: %s", prefix, c.err.String())
		}
	}
}

// stop closes the child's stdin, which ends it, and waits for it.
func (c *child) stop(t *testing.T) {
	if c.stdin == nil {
		return
	}
	c.stdin.Close()
	c.stdin = nil
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
		t.Errorf("child did not stop in 30s")
	}
}

// fairServer starts the server process and returns it and its address.
func fairServer(t *testing.T) (*child, string) {
	t.Helper()
	srv := startChild(t, "server")
	return srv, srv.expect(t, "grpc ")
}

// peakMemory is the most memory the server's Go runtime held, and its
// peak RSS (VmHWM) unless the race detector inflates it.
func peakMemory(t *testing.T, srv *child) (held, rss int64) {
	t.Helper()
	fmt.Fprintln(srv.stdin, "mem")
	held, err := strconv.ParseInt(srv.expect(t, "mem "), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", srv.cmd.Process.Pid))
	if err != nil {
		return held, -1
	}
	for l := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return held, kb << 10
		}
	}
	return held, -1
}

// serverCPU is the CPU time the server has used.
func serverCPU(t *testing.T, srv *child) time.Duration {
	t.Helper()
	fmt.Fprintln(srv.stdin, "cpu")
	ns, err := strconv.ParseInt(srv.expect(t, "cpu "), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(ns)
}

// goodClient is a well-behaved client: one call at a time, one descriptor.
type goodClient struct {
	client rlsv3.RateLimitServiceClient
	n      int
}

func dialGood(t *testing.T, addr string) *goodClient {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return &goodClient{client: rlsv3.NewRateLimitServiceClient(cc)}
}

// run makes calls until n are done and d has passed, and returns their
// latencies; a call that fails counts as a latency of its timeout.
func (g *goodClient) run(t *testing.T, n int, d time.Duration) []time.Duration {
	t.Helper()
	const timeout = 5 * time.Second
	var lat []time.Duration
	for end := time.Now().Add(d); len(lat) < n || time.Now().Before(end); {
		g.n++
		req := &rlsv3.RateLimitRequest{Domain: "fair", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "good", Value: strconv.Itoa(g.n % 100)}}}}}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		start := time.Now()
		resp, err := g.client.ShouldRateLimit(ctx, req)
		took := time.Since(start)
		cancel()
		switch {
		case err != nil:
			t.Logf("the well-behaved client's call failed: %v", err)
			took = timeout
		case resp.GetOverallCode() != rlsv3.RateLimitResponse_OK:
			t.Fatalf("the well-behaved client was answered %v", resp.GetOverallCode())
		}
		lat = append(lat, took)
	}
	return lat
}

func p99(lat []time.Duration) time.Duration {
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[len(s)*99/100]
}

// quietBaseline warms the well-behaved client up and returns its p99 with
// nothing else on the server.
func quietBaseline(t *testing.T, g *goodClient) time.Duration {
	t.Helper()
	quiet, _ := g.measure(t, nil)
	return quiet
}

// measure runs the well-behaved client for a second after a warm-up and
// returns its p99 and, with srv, the server's CPU time per call.
func (g *goodClient) measure(t *testing.T, srv *child) (time.Duration, time.Duration) {
	t.Helper()
	g.run(t, 200, 0)
	var before time.Duration
	if srv != nil {
		before = serverCPU(t, srv)
	}
	lat := g.run(t, 0, time.Second)
	if srv == nil {
		return p99(lat), 0
	}
	return p99(lat), (serverCPU(t, srv) - before) / time.Duration(len(lat))
}

// checkFair asserts the well-behaved client's p99 under the flood
// against its quiet one.
func checkFair(t *testing.T, quiet, loud time.Duration) {
	t.Helper()
	bound := max(fairRatio*quiet, fairFloor)
	t.Logf("well-behaved client p99: quiet %v, under the flood %v (%.1fx; bound %v)", quiet, loud, float64(loud)/float64(quiet), bound)
	if loud > bound {
		t.Errorf("under the flood the well-behaved client's p99 is %v, over max(%dx its quiet %v, %v)", loud, fairRatio, quiet, fairFloor)
	}
}

// checkMemory asserts the server's memory against the bound.
func checkMemory(t *testing.T, srv *child) {
	t.Helper()
	held, rss := peakMemory(t, srv)
	t.Logf("server memory: Go runtime peak %d MiB, peak RSS %d MiB (race detector: %v)", held>>20, rss>>20, raceEnabled)
	if held > fairMemBound {
		t.Errorf("the server's Go runtime held %d MiB, over %d MiB", held>>20, fairMemBound>>20)
	}
	if !raceEnabled && rss > fairMemBound {
		t.Errorf("the server's peak RSS is %d MiB, over %d MiB", rss>>20, fairMemBound>>20)
	}
}

// TestFairnessDescriptorFlood: 64 callers on one connection send requests
// at the bounds (256 descriptors of 64 entries, up to
// DefaultMaxRequestBytes), 8 more send 8 MiB requests (refused from their
// length) and 8 more 4 MiB ones (read, not decoded), beside a
// well-behaved client on a connection of its own. Before the peer budget
// and the tight message cap, its p99 went from 2.4 ms to 0.9-1.5 s and
// the server's RSS to 708-876 MiB.
func TestFairnessDescriptorFlood(t *testing.T) {
	srv, addr := fairServer(t)
	good := dialGood(t, addr)
	quiet := quietBaseline(t, good)
	flood := startChild(t, "flood", childAddrEnv+"="+addr, childSrcEnv+"="+floodSourceIP)
	flood.expect(t, "flooding")
	loud := p99(good.run(t, 50, floodFor(t)))
	checkMemory(t, srv)
	flood.stop(t)
	checkFair(t, quiet, loud)
}

// TestFairnessRapidReset: an HTTP/2 rapid reset (CVE-2023-44487: HEADERS
// then RST_STREAM, in bursts, on 4 connections) beside a well-behaved
// client. The flood's connections end with GOAWAY (ENHANCE_YOUR_CALM),
// the well-behaved client's p99 stays within the bound, and once the
// flood stops the server is idle: no backlog of work left behind. Before,
// its p50 went from 0.8 ms to 222-652 ms, no GOAWAY was sent and 2 s of
// CPU remained after the attack.
func TestFairnessRapidReset(t *testing.T) {
	srv, addr := fairServer(t)
	good := dialGood(t, addr)
	quiet, quietCPU := good.measure(t, srv)
	reset := startChild(t, "reset", childAddrEnv+"="+addr, childSrcEnv+"="+floodSourceIP)
	reset.expect(t, "flooding")
	loud := p99(good.run(t, 50, floodFor(t)))
	reset.stdin.Close()
	var goaways, streams int64
	if _, err := fmt.Sscanf(reset.expect(t, "goaway "), "%d streams %d", &goaways, &streams); err != nil {
		t.Fatal(err)
	}
	reset.stop(t)
	// The server's CPU per call of the well-behaved client over the
	// second after the flood, against the same before it: work the flood
	// left queued would be on top.
	after, afterCPU := good.measure(t, srv)
	t.Logf("rapid reset: %d streams opened, %d GOAWAY received; server CPU per well-behaved call %v before, %v after it (%.1fx; p99 after %v)",
		streams, goaways, quietCPU, afterCPU, float64(afterCPU)/float64(quietCPU), after)
	checkMemory(t, srv)
	if goaways == 0 {
		t.Errorf("the rapid reset's %d streams were never answered with GOAWAY (ENHANCE_YOUR_CALM)", streams)
	}
	checkFair(t, quiet, loud)
	if bound := max(fairRatio*quiet, fairFloor); after > bound {
		t.Errorf("after the flood the well-behaved client's p99 is %v, over max(%dx its quiet %v, %v): a backlog of the flood's work", after, fairRatio, quiet, fairFloor)
	}
	if afterCPU > 3*quietCPU+100*time.Microsecond {
		t.Errorf("after the flood the server's CPU per call was %v, against %v before it: a backlog of the flood's work", afterCPU, quietCPU)
	}
}
