package rlqs_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/rlqs"
	"github.com/sluice-io/sluice/memstore"
)

// TestPeerBudget: a client's new buckets and reports per interval are
// counted by its address, across its streams and reconnects; beyond them
// buckets get no assignment and reports no answer, counted; the next
// interval (a fake clock) gives a new budget.
func TestPeerBudget(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	st, err := memstore.New(memstore.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	reg := prometheus.NewRegistry()
	cfg := &rlqs.Config{ReportInterval: time.Second, MaxNewBucketsPerPeer: 3, MaxReportsPerPeer: 6,
		Domains: []rlqs.Domain{{Domain: "envoy", Policies: []rlqs.Policy{{Name: "u", Match: map[string]string{"user": "*"}, RequestsPerUnit: 100, Unit: "second"}}}}}
	q, err := rlqs.New(rlqs.Options{Store: st, Config: cfg, Clock: clk, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	q.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(func() { q.Drain(); g.Stop() })
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c := rlqsv3.NewRateLimitQuotaServiceClient(conn)
	report := func(users ...int) *rlqsv3.RateLimitQuotaUsageReports {
		m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "envoy"}
		for _, u := range users {
			m.BucketQuotaUsages = append(m.BucketQuotaUsages, usage(map[string]string{"user": fmt.Sprint(u)}, 1, 0))
		}
		return m
	}
	// Two new buckets on one stream, then a reconnect: the new stream's
	// two new buckets find one left in the client's budget.
	r, err := exchange(t, c, report(1, 2))
	if err != nil || len(r.GetBucketAction()) != 2 {
		t.Fatalf("first stream: %v %v", r, err)
	}
	r, err = exchange(t, c, report(3, 4))
	if err != nil || len(r.GetBucketAction()) != 1 {
		t.Fatalf("after a reconnect: %d actions (%v), want 1: the new-bucket budget is the client's", len(r.GetBucketAction()), err)
	}
	// 4 usages spent of 6: a report of 3 more is over the budget and gets
	// no answer; the stream is read again next interval, when it does.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(report(1, 2, 3)); err != nil {
		t.Fatal(err)
	}
	got := make(chan int, 1)
	go func() {
		r, err := s.Recv()
		if err != nil {
			got <- -1
			return
		}
		got <- len(r.GetBucketAction())
	}()
	select {
	case n := <-got:
		t.Fatalf("a report over the budget was answered (%d actions)", n)
	case <-time.After(200 * time.Millisecond): // an answer would come in microseconds; this only waits for none
	}
	if d := testutil.ToFloat64(dropCounter(reg)); d != 1+3 {
		t.Errorf("dropped %v, want 1 bucket and 3 usages", d)
	}
	clk.Advance(time.Second)
	if err := s.Send(report(1)); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-got:
		if n != 1 {
			t.Errorf("next interval: %d actions, want 1", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no answer in the next interval")
	}
}
