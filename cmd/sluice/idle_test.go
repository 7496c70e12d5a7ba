package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
)

// idleChildEnv names the config an idle child serves (TestServeIdle).
const idleChildEnv = "SLUICE_IDLE_CHILD_CONFIG"

// TestServeIdle: `sluice serve` on the memory store with the example
// config, RLS and RLQS, sleeps when no client calls it: no thread of the
// process runs in 3 s once its one RLQS client has gone (before: the
// guard's probe of the memory store woke it every 200 ms, 36 timeslices a
// second and 11 ms of CPU per 10 s). The service runs in a child process
// (this test binary, re-run), so that the count is of `sluice serve`
// alone; the count is the kernel's, /proc/PID/task/*/schedstat.
func TestServeIdle(t *testing.T) {
	if cfg := os.Getenv(idleChildEnv); cfg != "" {
		// The child: serve until killed.
		_ = run(context.Background(), []string{"serve", "--config", cfg, "--listen", "127.0.0.1:0", "--log-format", "json"}, os.Stdout, os.Stderr)
		return
	}
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skip("needs /proc")
	}
	dir := t.TempDir()
	example, err := os.ReadFile("../../examples/sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "ratelimit"), 0o755); err != nil {
		t.Fatal(err)
	}
	doc := string(example) + "envoy:\n  grpc_addr: 127.0.0.1:0\n  config_dir: ratelimit\n" +
		"rlqs:\n  report_interval: 1s\n  domains:\n    - domain: envoy\n      policies:\n        - name: api\n          match: {route: \"*\"}\n          requests_per_unit: 500\n          unit: second\n"
	cfg := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfg, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestServeIdle$")
	// GOGC=off: no forced collection (the runtime's, every 2 min) falls
	// into the window measured; the idle process allocates nothing.
	cmd.Env = append(os.Environ(), idleChildEnv+"="+cfg, "GOGC=off")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil {
				if a, ok := line["grpc"].(string); ok {
					addr <- a
				}
			}
		}
	}()
	var grpcAddr string
	select {
	case grpcAddr = <-addr:
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not start within 30s")
	}

	// One Envoy-like client reports once and goes: whatever it started
	// must stop with it.
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"route": "api"}}, TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 4,
	}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	_ = st.CloseSend()
	conn.Close()

	// The stream's end is handled within moments; the window measured
	// starts 1 s later.
	time.Sleep(time.Second)
	before, err := timeslices(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // the window measured, not a wait for an event
	after, err := timeslices(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	// A few for what the kernel or the runtime may do once: a periodic
	// wake-up of 1 s or shorter gives 3 or more per loop.
	if n := after.runs - before.runs; n > 2 {
		t.Errorf("idle sluice serve ran %d timeslices (%v of CPU) in 3 s; want at most 2", n, time.Duration(after.ns-before.ns))
	} else {
		t.Logf("idle sluice serve: %d timeslices, %v of CPU in 3 s", n, time.Duration(after.ns-before.ns))
	}
}

// sched is a process's CPU time and timeslices run, summed over its
// threads.
type sched struct{ ns, runs int64 }

// timeslices reads /proc/PID/task/*/schedstat: CPU time on the CPU,
// time waiting for it, and timeslices run (Documentation/scheduler/sched-stats.rst).
func timeslices(pid int) (sched, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		return sched{}, fmt.Errorf("schedstat of %d: %v", pid, err)
	}
	var s sched
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // a thread that ended
		}
		f := strings.Fields(string(b))
		if len(f) < 3 {
			return sched{}, fmt.Errorf("%s: %q", p, b)
		}
		ns, _ := strconv.ParseInt(f[0], 10, 64)
		runs, _ := strconv.ParseInt(f[2], 10, 64)
		s.ns += ns
		s.runs += runs
	}
	return s, nil
}
