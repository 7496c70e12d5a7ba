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
	const (
		prompts   = 20
		clientKey = "sk-batch-client"
	)
	limits := gateway.Limits{RPM: 60, RPMBurst: 3, RPD: 10000, TPM: 1_000_000, TPMBurst: 100_000}
	ideal := time.Duration(prompts-limits.RPMBurst) * time.Minute / time.Duration(limits.RPM)

	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	store, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
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

	client, err := aiclient.New(aiclient.Options{
		BaseURL: srv.URL + "/v1", APIKey: clientKey,
		Clock: clk,
		Sleep: func(ctx context.Context, d time.Duration) error {
			clk.Advance(d)
			return ctx.Err()
		},
		Rand: func() float64 { return 0 },
	})
	if err != nil {
		t.Fatal(err)
	}
	var in strings.Builder
	for i := range prompts {
		fmt.Fprintf(&in, "{\"id\":\"p%d\",\"prompt\":\"say something nice about rate limiters, number %d\"}\n", i, i)
	}
	out := filepath.Join(t.TempDir(), "out.jsonl")
	start := clk.Now()
	sum, err := batch.Run(context.Background(), batch.Config{
		Input: strings.NewReader(in.String()), Output: out, NoSync: true,
		Client: client, Model: "gpt-test", MaxTokens: 16, Concurrency: 1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Duration(clk.Now() - start)
	if sum.OK != prompts || sum.Failed != 0 || sum.Retries != 0 {
		t.Fatalf("summary %+v", sum)
	}
	counter.mu.Lock()
	seen := fmt.Sprint(counter.seen)
	counter.mu.Unlock()
	if seen != fmt.Sprintf("map[200:%d]", prompts) {
		t.Fatalf("gateway answered %s, want %d × 200 and nothing refused", seen, prompts)
	}
	if took < ideal || took > ideal+ideal/10 {
		t.Fatalf("the run took %v of the limits' time, want %v (+10%%)", took, ideal)
	}
	if b, err := os.ReadFile(out); err != nil || strings.Count(string(b), "\n") != prompts {
		t.Fatalf("output: %v, %d lines", err, strings.Count(string(b), "\n"))
	}
	t.Logf("took %v, ideal %v", took, ideal)
}
