package batch

// Tests that run the real sluice binary as separate processes: killed
// with SIGKILL mid-run, and two of them sharing one Redis limiter.

import (
	"bytes"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// buildSluice builds cmd/sluice into a temporary directory.
func buildSluice(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "sluice")
	out, err := exec.Command(goBin, "build", "-o", bin, "github.com/sluice-io/sluice/cmd/sluice").CombinedOutput()
	if err != nil {
		t.Fatalf("go build cmd/sluice: %v\n%s", err, out)
	}
	return bin
}

func batchCmd(bin string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	cmd := exec.Command(bin, append([]string{"batch", "--progress", "log", "--progress-interval", "1h"}, args...)...)
	cmd.Env = append(os.Environ(), "OPENAI_API_KEY=sk-test")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	return cmd, &out
}

// TestSIGKILLThenResume kills the process with SIGKILL once the upstream
// has seen 60 requests, then reruns it: the output parses line by line,
// no prompt is missing or duplicated, and only the prompts without a line
// are sent again.
func TestSIGKILLThenResume(t *testing.T) {
	bin := buildSluice(t)
	up := fakeopenai.New(t, fakeopenai.Options{Default: fakeopenai.Fault{Delay: 2 * time.Millisecond}})
	g := newGate(t, up.URL(), 60)
	dir := t.TempDir()
	const n = 200
	in, out := writeInput(t, dir, "a", n), filepath.Join(dir, "out.jsonl")
	argsTo := func(base string) []string {
		return []string{"--input", in, "--output", out, "--model", "m", "--base-url", base + "/v1", "--concurrency", "8"}
	}

	cmd, log := batchCmd(bin, argsTo(g.URL)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case <-g.Reached:
		if err := cmd.Process.Kill(); err != nil { // SIGKILL
			t.Fatal(err)
		}
		<-exited
	case err := <-exited:
		t.Fatalf("batch exited before the kill: %v\n%s", err, log)
	}
	if cmd.ProcessState.ExitCode() != -1 {
		t.Fatalf("not killed by a signal: %v", cmd.ProcessState)
	}
	first := readOutput(t, out)
	if len(first) == 0 || len(first) >= n {
		t.Fatalf("%d records after the kill; want a partial run", len(first))
	}

	// The resume goes through a gate of its own: requests the killed
	// process had already sent may still reach the first one late, and
	// must not be counted as resent.
	again := newGate(t, up.URL(), n+1)
	cmd, log = batchCmd(bin, argsTo(again.URL)...)
	if err := cmd.Run(); err != nil {
		t.Fatalf("resume: %v\n%s", err, log)
	}
	checkExactlyOnce(t, readOutput(t, out), n)
	if resent := again.Count(); resent != n-len(first) {
		t.Fatalf("resume sent %d requests; want %d, one per prompt without a line", resent, n-len(first))
	}
	if !strings.Contains(log.String(), "succeeded "+strconv.Itoa(n-len(first))) {
		t.Fatalf("summary: %s", log)
	}
}

// TestTwoProcessesShareRedisRate runs two batch processes against one
// Redis limiter at 5/s (burst 5): measured at the fake upstream, together
// they never exceed 5/s plus the burst.
func TestTwoProcessesShareRedisRate(t *testing.T) {
	bin := buildSluice(t)
	srv := redistest.Standalone(t)
	key := redistest.Prefix(t) + "customer"
	up := fakeopenai.New(t, fakeopenai.Options{})
	dir := t.TempDir()
	const perProcess, rate, burst = 20, 5.0, 5
	var wg sync.WaitGroup
	errs := make([]error, 2)
	logs := make([]*bytes.Buffer, 2)
	for i, tag := range []string{"A", "B"} {
		cmd, log := batchCmd(bin, "--input", writeInput(t, dir, tag, perProcess), "--output", filepath.Join(dir, tag+".jsonl"),
			"--model", "m", "--base-url", up.BaseURL(), "--concurrency", "4",
			"--redis", srv.URL(), "--limit-key", key, "--rate", "5/s", "--burst", "5")
		logs[i] = log
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = cmd.Run()
		}()
	}
	wg.Wait()
	for i := range errs {
		if errs[i] != nil {
			t.Fatalf("process %d: %v\n%s", i, errs[i], logs[i])
		}
	}
	reqs := up.Requests()
	if len(reqs) != 2*perProcess {
		t.Fatalf("upstream saw %d requests, want %d", len(reqs), 2*perProcess)
	}
	var a, b int
	times := make([]time.Time, len(reqs))
	for i, r := range reqs {
		times[i] = r.Time
		if bytes.Contains(r.Body, []byte("A prompt")) {
			a++
		} else if bytes.Contains(r.Body, []byte("B prompt")) {
			b++
		}
	}
	if a != perProcess || b != perProcess {
		t.Fatalf("requests per process: %d and %d", a, b)
	}
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	// In every interval [t_i, t_j] the upstream may see at most
	// burst + rate·(t_j - t_i) requests; 100ms (half a request at 5/s)
	// absorb the jitter between the limiter's decision in Redis and the
	// arrival at the upstream on a loaded machine. Two unshared limiters
	// would reach 10/s and fail this by ~15 requests.
	worst := math.Inf(-1)
	for i := range times {
		for j := i; j < len(times); j++ {
			allowed := burst + rate*(times[j].Sub(times[i]).Seconds()+0.1)
			got := float64(j - i + 1)
			worst = max(worst, got-allowed)
			if got > allowed+1e-9 {
				t.Fatalf("%v requests in %v (from #%d): more than %v/s + burst %d", got, times[j].Sub(times[i]), i, rate, burst)
			}
		}
	}
	span := times[len(times)-1].Sub(times[0])
	if minSpan := time.Duration((2*perProcess - burst) / rate * float64(time.Second)); span < minSpan*95/100 {
		t.Fatalf("%d requests in %v; at 5/s + burst 5 they need %v", len(times), span, minSpan)
	}
	t.Logf("%d requests from 2 processes in %v (%.2f/s overall); worst interval margin %.2f", len(times), span, float64(len(times)-1)/span.Seconds(), worst)
}
