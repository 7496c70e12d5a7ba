package rlqs_test

import (
	"context"
	"net"
	"testing"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-io/sluice/guard"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/internal/rlqs"
	"github.com/sluice-io/sluice/redisstore"
)

// TestDegradedStoreAssignsNothing: behind a guard that fails open, a dead
// Redis makes the store answer "allowed" from its failure policy; sluice
// must not hand that out as capacity. The limited bucket gets no action
// (its last assignment runs out into the filter's fallback); the denied
// one, which needs no store, still gets its DENY_ALL.
func TestDegradedStoreAssignsNothing(t *testing.T) {
	srv := redistest.NewStandalone(t)
	rs, err := redisstore.New(context.Background(), redisstore.Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rs.Close() })
	g, err := guard.New(rs, guard.Options{Policy: guard.FailOpen})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	q, err := rlqs.New(rlqs.Options{Store: g, Config: boundsConfig()})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	q.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(func() { q.Drain(); gs.Stop() })
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c := rlqsv3.NewRateLimitQuotaServiceClient(conn)
	report := &rlqsv3.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage(map[string]string{"user": "1"}, 5, 0),
		usage(map[string]string{"route": "admin"}, 0, 1),
	}}
	r, err := exchange(t, c, report)
	if err != nil || len(r.GetBucketAction()) != 2 {
		t.Fatalf("with Redis up: %v, %v; want two actions", r, err)
	}
	srv.Kill()
	r, err = exchange(t, c, report)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range r.GetBucketAction() {
		if a.GetBucketId().GetBucket()["user"] == "1" {
			t.Errorf("assigned %v from a degraded store", a)
		}
	}
	if len(r.GetBucketAction()) != 1 {
		t.Errorf("%d actions, want the denied bucket's alone", len(r.GetBucketAction()))
	}
}
