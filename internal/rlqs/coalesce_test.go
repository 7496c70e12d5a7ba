package rlqs

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
)

// countingStore is a real memory store that counts its batches.
type countingStore struct {
	sluice.Store
	calls atomic.Int64
}

func (c *countingStore) ApplyAll(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	c.calls.Add(1)
	return c.Store.ApplyAll(ctx, op, reqs)
}

// TestCoalesce: a bucket reported again within half an interval of its
// last store call is answered with the assignment in force and no store
// call, its requests counted at the next report that goes to the store;
// half an interval later the report goes to the store again.
func TestCoalesce(t *testing.T) {
	mem, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	st := &countingStore{Store: mem}
	clk := clock.NewFake(time.Unix(1e9, 0))
	s, err := New(Options{Store: st, Clock: clk, Config: &Config{ReportInterval: time.Second, Domains: []Domain{{Domain: "d", Policies: []Policy{
		{Name: "p", Match: map[string]string{"route": "*"}, RequestsPerUnit: 1000, Unit: "second"},
	}}}}})
	if err != nil {
		t.Fatal(err)
	}
	msg := func(n uint64) *rlqsv3.RateLimitQuotaUsageReports {
		return &rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"route": "api"}},
			TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: n}}}
	}
	str := &stream{id: "s", host: "h", buckets: map[[16]byte]*bucket{}}
	ctx := context.Background()
	first, err := s.report(ctx, str, msg(100))
	if err != nil || len(first.GetBucketAction()) != 1 || st.calls.Load() != 1 {
		t.Fatalf("first report: %v, %d actions, %d store calls", err, len(first.GetBucketAction()), st.calls.Load())
	}
	for range 5 { // back to back, within half an interval
		clk.Advance(50 * time.Millisecond)
		again, err := s.report(ctx, str, msg(100))
		if err != nil || len(again.GetBucketAction()) != 1 {
			t.Fatalf("report again: %v, %d actions", err, len(again.GetBucketAction()))
		}
		if !proto.Equal(again.GetBucketAction()[0], first.GetBucketAction()[0]) {
			t.Fatalf("answered %v, want the assignment in force %v", again.GetBucketAction()[0], first.GetBucketAction()[0])
		}
	}
	if n := st.calls.Load(); n != 1 {
		t.Fatalf("%d store calls for reports within half an interval; want 1", n)
	}
	var b *bucket
	for _, x := range str.buckets {
		b = x
	}
	if b.carry != 500 {
		t.Errorf("carried %d requests; want the 500 of the coalesced reports", b.carry)
	}
	clk.Advance(time.Second)
	if _, err := s.report(ctx, str, msg(100)); err != nil || st.calls.Load() != 2 {
		t.Fatalf("a report an interval later: %v, %d store calls; want 2", err, st.calls.Load())
	}
	if b.carry != 0 {
		t.Errorf("carry %d after a store call; want 0", b.carry)
	}
}
