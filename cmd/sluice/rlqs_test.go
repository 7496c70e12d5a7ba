package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/sluice-io/sluice/internal/redistest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestServeRLQS: `sluice serve` with envoy: and rlqs: sections answers a
// quota stream on the Envoy gRPC port, and stops while the stream is
// still open (Drain before the graceful stop).
func TestServeRLQS(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rls.yaml"), []byte("domain: rls\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "sluice.yaml")
	doc := "store:\n  url: memory\nenvoy:\n  grpc_addr: 127.0.0.1:0\n  config_dir: " + dir + "\n" +
		"rlqs:\n  report_interval: 1s\n  domains:\n    - domain: envoy\n      policies:\n        - name: api\n          match: {route: api}\n          requests_per_unit: 600\n          unit: minute\n"
	if err := os.WriteFile(cfg, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--config", cfg, "--listen", "127.0.0.1:0", "--log-format", "json"}, io.Discard, pw)
		pw.Close()
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
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
	case err := <-done:
		t.Fatalf("serve exited: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not start within 20s")
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer scancel()
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"route": "api"}}, TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 4,
	}}}); err != nil {
		t.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	// 4 a second, 600 a minute: shares of 100 tokens per 10 s; 40 asked,
	// and half again and one for room to grow.
	tb := r.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb.GetTokensPerFill().GetValue() != 61 || tb.GetFillInterval().AsDuration() != 10*time.Second {
		t.Errorf("assignment %v, want 61 tokens per 10s", r)
	}
	// A reload that lowers the limit reaches the open stream's bucket at
	// its next report: 30 a minute, shares of 30 tokens per minute.
	if err := os.WriteFile(cfg, []byte(strings.Replace(doc, "requests_per_unit: 600", "requests_per_unit: 30", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	var last *rlqsv3.RateLimitQuotaResponse
	if !redistest.PollUntil(time.Now().Add(15*time.Second), func() bool {
		if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
			BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"route": "api"}}, TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 4,
		}}}); err != nil {
			t.Fatal(err)
		}
		if last, err = st.Recv(); err != nil {
			t.Fatal(err)
		}
		tb := last.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
		return tb.GetFillInterval().AsDuration() == time.Minute && tb.GetTokensPerFill().GetValue() <= 30
	}) {
		t.Errorf("reloaded limit never reached the bucket: last %v", last)
	}
	cancel() // stop serve with the stream open
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop with an RLQS stream open")
	}
	if _, err := st.Recv(); err == nil {
		t.Error("stream still open after serve stopped")
	}
}

// TestServeRLQSGlobal: `sluice serve` in region us (its own redis-server)
// with an RLQS policy of scope global homed in eu (another): the
// instance leases its part of the limit in eu's Redis (the key without
// an instance mark, its lease named by the region) and its stream
// divides it in us's (the instance's own key); the assignment grows to
// the stream's demand within the global limit.
func TestServeRLQSGlobal(t *testing.T) {
	eu, us := redistest.NewStandalone(t), redistest.NewStandalone(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rls.yaml"), []byte("domain: rls\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	grpcAddr, _ := serveEnvoyConfig(t, "store:\n  url: "+us.URL()+"\n  region: us\n  regions:\n    eu: {url: "+eu.URL()+"}\n"+
		"envoy:\n  grpc_addr: 127.0.0.1:0\n  http_addr: 127.0.0.1:0\n  config_dir: "+dir+"\n"+
		"rlqs:\n  report_interval: 200ms\n  domains:\n    - domain: envoy\n      policies:\n        - name: api\n          match: {route: api}\n          requests_per_unit: 100\n          unit: second\n          scope: global\n          home: eu\n")
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// 40 requests per 200 ms interval: 200 a second, twice the limit.
	var tokens uint32
	if !redistest.PollUntil(time.Now().Add(10*time.Second), func() bool {
		if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
			BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"route": "api"}}, TimeElapsed: durationpb.New(0), NumRequestsDenied: 40,
		}}}); err != nil {
			t.Fatal(err)
		}
		r, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		tokens = r.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().GetTokensPerFill().GetValue()
		return tokens >= 90
	}) {
		t.Fatalf("the stream's assignment stayed at %d tokens per second; want most of the global limit (100)", tokens)
	}
	if tokens > 100 {
		t.Errorf("assignment %d tokens per second > the global limit 100", tokens)
	}
	keys := func(s *redistest.Server) (home, local int) {
		t.Helper()
		ks, err := s.Do(ctx, "KEYS", "rlqs:{envoy}:api:*")
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range ks.([]any) {
			switch k := k.(string); {
			case strings.HasSuffix(k, ":demand"):
			case strings.Contains(k, ":@"):
				local++
			default:
				home++
			}
		}
		return home, local
	}
	if home, local := keys(eu); home != 1 || local != 0 {
		t.Errorf("eu's Redis holds %d lease keys and %d instance keys; want the region leases' one", home, local)
	}
	if home, local := keys(us); home != 0 || local != 1 {
		t.Errorf("us's Redis holds %d lease keys and %d instance keys; want the instance's own one", home, local)
	}
}
