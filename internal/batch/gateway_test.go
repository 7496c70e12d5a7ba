package batch_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/aiclient"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/batch"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/gateway"
	"github.com/sluice-io/sluice/memstore"
)

// statusCounter counts the statuses a handler answers.
type statusCounter struct {
	next http.Handler
	mu   sync.Mutex
	seen map[int]int
}

func (s *statusCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	s.next.ServeHTTP(rec, r)
	s.mu.Lock()
	s.seen[rec.status]++
	s.mu.Unlock()
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// TestBatchThroughGatewayIdealTime is issue 12's run, small: `sluice
// batch` against `sluice gateway` (a tier with rpm 60 and a burst of 3,
// rpd 10000 and tpm) against the fake upstream. The rpm limit binds, so
// the ideal run admits 3 prompts at once and then one a second: 17s for
// 20 prompts. The run must take within 10 % of that and never be refused.
// Before the fix the gateway published rpd's reset with rpm's counts and
// the burst as the limit, and the client inferred the refill from them:
// minutes per prompt, or too fast and refused.
//
// Time is the gateway store's and the client's fake clock, which only the
// client's waits move, so the test is exact and takes no wall time for
// its 17 seconds. That needs one prompt in flight at a time: with several,
// sleeps on one fake clock would add up instead of overlapping.
func TestBatchThroughGatewayIdealTime(t *testing.T) {
	limits := gateway.Limits{RPM: 60, RPMBurst: 3, RPD: 10000, TPM: 1_000_000, TPMBurst: 100_000}
	const prompts = 20
	ideal := time.Duration(prompts-limits.RPMBurst) * time.Minute / time.Duration(limits.RPM)
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	r := runThroughGateway(t, limits, prompts, 1, clk)
	if r.sum.OK != prompts || r.sum.Failed != 0 || r.sum.Retries != 0 {
		t.Fatalf("summary %+v", r.sum)
	}
	if r.seen != fmt.Sprintf("map[200:%d]", prompts) {
		t.Fatalf("gateway answered %s, want %d × 200 and nothing refused", r.seen, prompts)
	}
	if r.took < ideal || r.took > ideal+ideal/10 {
		t.Fatalf("the run took %v of the limits' time, want %v (+10%%)", r.took, ideal)
	}
	t.Logf("took %v, ideal %v", r.took, ideal)
}

// BenchmarkBatchThroughGatewayWall runs the same in wall time with
// batch's default concurrency of 8, at rpm 1200 (50ms a prompt): it
// reports the run's time as a ratio of the ideal, and the 429s per prompt
// (timing jitter between client and gateway makes a few).
//
//	go test -run '^$' -bench BatchThroughGatewayWall -benchtime 3x ./internal/batch/
func BenchmarkBatchThroughGatewayWall(b *testing.B) {
	limits := gateway.Limits{RPM: 1200, RPMBurst: 3, RPD: 100000, TPM: 10_000_000, TPMBurst: 1_000_000}
	const prompts = 40
	ideal := time.Duration(prompts-limits.RPMBurst) * time.Minute / time.Duration(limits.RPM)
	var ratio, refused float64
	for range b.N {
		r := runThroughGateway(b, limits, prompts, batch.DefaultConcurrency, nil)
		if r.sum.OK != prompts {
			b.Fatalf("summary %+v", r.sum)
		}
		ratio += r.took.Seconds() / ideal.Seconds()
		refused += float64(r.refused) / prompts
	}
	b.ReportMetric(ratio/float64(b.N), "time/ideal")
	b.ReportMetric(refused/float64(b.N), "429s/prompt")
}

type gatewayRun struct {
	sum     *batch.Summary
	took    time.Duration
	seen    string // statuses the gateway answered
	refused int
}

// runThroughGateway runs prompts through a gateway with limits to the fake
// upstream, with concurrency calls in flight. With clk, the gateway's
// store and the client share that fake clock, which only the client's
// waits move; without, both use the system clock.
func runThroughGateway(t testing.TB, limits gateway.Limits, prompts, concurrency int, clk *clock.Fake) gatewayRun {
	t.Helper()
	const clientKey = "sk-batch-client"
	mo := memstore.Options{SweepInterval: -1}
	if clk != nil {
		mo.Clock = clk
	}
	store, err := memstore.New(mo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: "sk-upstream"})
	cfg := &gateway.Config{
		Upstream: gateway.UpstreamConfig{BaseURL: up.URL() + "/v1", APIKeyEnv: "UPSTREAM_KEY"},
		Models:   []string{"gpt-test"},
		Store:    gateway.StoreConfig{Timeout: 5 * time.Second},
		Tiers:    map[string]gateway.TierConfig{"t": gateway.Tier(limits)},
		Keys:     []gateway.KeyConfig{{Name: "batch", Hash: sluice.HashKey(clientKey), Tier: "t"}},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(gateway.Options{Config: cfg, Store: store, Getenv: func(string) string { return "sk-upstream" }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	counter := &statusCounter{next: gw, seen: map[int]int{}}
	srv := httptest.NewServer(counter)
	t.Cleanup(srv.Close)

	opts := aiclient.Options{BaseURL: srv.URL + "/v1", APIKey: clientKey, Rand: func() float64 { return 0 }}
	now := func() time.Time { return time.Now() }
	if clk != nil {
		opts.Clock = clk
		opts.Sleep = func(ctx context.Context, d time.Duration) error {
			clk.Advance(d)
			return ctx.Err()
		}
		now = clk.Time
	}
	client, err := aiclient.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	var in strings.Builder
	for i := range prompts {
		fmt.Fprintf(&in, "{\"id\":\"p%d\",\"prompt\":\"say something nice about rate limiters, number %d\"}\n", i, i)
	}
	out := filepath.Join(t.TempDir(), "out.jsonl")
	start := now()
	sum, err := batch.Run(context.Background(), batch.Config{
		Input: strings.NewReader(in.String()), Output: out, NoSync: true,
		Client: client, Model: "gpt-test", MaxTokens: 16, Concurrency: concurrency,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	took := now().Sub(start)
	if b, err := os.ReadFile(out); err != nil || strings.Count(string(b), "\n") != prompts {
		t.Fatalf("output: %v, %d lines", err, strings.Count(string(b), "\n"))
	}
	counter.mu.Lock()
	defer counter.mu.Unlock()
	return gatewayRun{sum: sum, took: took, seen: fmt.Sprint(counter.seen), refused: counter.seen[http.StatusTooManyRequests]}
}
