package rlqs_test

import (
	"context"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/internal/rlqs"
	"github.com/sluice-io/sluice/redisstore"
)

// TestPartialGrant: a stream that asks for more than is free gets what
// is free, as a token bucket, not a DENY_ALL (#36: an all-or-nothing ask
// lost to another stream's take left capacity unused for an interval).
// Two sluice instances on one Redis, a stream on each.
func TestPartialGrant(t *testing.T) {
	srv := redistest.Standalone(t)
	prefix := redistest.Prefix(t)
	cfg := &rlqs.Config{ReportInterval: time.Second, Domains: []rlqs.Domain{{Domain: "envoy", Policies: []rlqs.Policy{
		{Name: "u", Match: map[string]string{"user": "*"}, RequestsPerUnit: 100, Unit: "second"}}}}}
	var streams []rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	for range 2 {
		st, err := redisstore.New(context.Background(), redisstore.Options{URL: srv.URL()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		in := &instance{t: t, store: st, prefix: prefix, dir: rlsDir(t), cfg: cfg}
		in.start()
		t.Cleanup(in.stop)
		conn, err := grpc.NewClient(in.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		s, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	ask := func(s rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient) *rlqsv3.RateLimitQuotaResponse_BucketAction {
		t.Helper()
		// 40 requests in the interval: 40 + 20 + 1 asked, of 100.
		if err := s.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"user": "u1"}, 30, 10)}}); err != nil {
			t.Fatal(err)
		}
		r, err := s.Recv()
		if err != nil || len(r.GetBucketAction()) != 1 {
			t.Fatalf("answer %v, %v", r, err)
		}
		return r.GetBucketAction()[0]
	}
	a := ask(streams[0])
	b := ask(streams[1])
	ga := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().GetTokensPerFill().GetValue()
	gb := b.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().GetTokensPerFill().GetValue()
	if ga != 61 || gb != 39 {
		t.Errorf("shares %d and %d, want 61 and the 39 left (second: %v)", ga, gb, b)
	}
}
