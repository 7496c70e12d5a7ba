package rlqs

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/redisstore"
)

// BenchmarkReport is the server's work for one bucket's usage report on
// the memory store (one ApplyAll of its demand and its share, the action), against
// the baseline of one store decision (BenchmarkStoreAllow): the ratio is
// what one report costs in decisions. go test -bench 'Report|StoreAllow' ./internal/rlqs
func BenchmarkReport(b *testing.B) {
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	// The server's clock moves an interval between reports, as an Envoy
	// reports once an interval: every report is a store call (a report
	// within half an interval of the last is answered without one).
	clk := clock.NewFake(time.Unix(1e9, 0))
	s, err := New(Options{Store: st, Clock: clk, Config: &Config{ReportInterval: time.Second, MaxReportsPerPeer: 100000, Domains: []Domain{{Domain: "d", Policies: []Policy{
		{Name: "p", Match: map[string]string{"route": "*"}, RequestsPerUnit: 1 << 30, Unit: "second"},
	}}}}})
	if err != nil {
		b.Fatal(err)
	}
	msg := &rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"route": "api"}},
		TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 50, NumRequestsDenied: 5}}}
	st2 := &stream{id: "bench", buckets: map[[16]byte]*bucket{}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		clk.Advance(time.Second)
		r, err := s.report(ctx, st2, msg)
		if err != nil || len(r.GetBucketAction()) != 1 {
			b.Fatal("no action", err)
		}
	}
}

// BenchmarkStoreAllow is BenchmarkReport's baseline: one OpAllow of the
// same limit on the same store.
func BenchmarkStoreAllow(b *testing.B) {
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	req := sluice.Request{Key: "rlqs:d:p:{x}", Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 1 << 30, Period: time.Second, Burst: 1 << 26}, Cost: 1}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := st.Apply(ctx, sluice.OpAllow, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReportRedis is one report of ten buckets on Redis: its store
// calls (redisstore's Stats) are the figure, one per report.
func BenchmarkReportRedis(b *testing.B) {
	srv := redistest.Standalone(b)
	st, err := redisstore.New(context.Background(), redisstore.Options{URL: srv.URL()})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	clk := clock.NewFake(time.Unix(1e9, 0))
	s, err := New(Options{Store: st, Clock: clk, Prefix: redistest.Prefix(b), Config: &Config{ReportInterval: time.Second, MaxReportsPerPeer: 100000, Domains: []Domain{{Domain: "d", Policies: []Policy{
		{Name: "p", Match: map[string]string{"route": "*"}, RequestsPerUnit: 1 << 30, Unit: "second"},
	}}}}})
	if err != nil {
		b.Fatal(err)
	}
	msg := &rlqsv3.RateLimitQuotaUsageReports{Domain: "d"}
	for i := range 10 {
		msg.BucketQuotaUsages = append(msg.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"route": fmt.Sprint(i)}},
			TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 50, NumRequestsDenied: 5})
	}
	st2 := &stream{id: "bench", buckets: map[[16]byte]*bucket{}}
	ctx := context.Background()
	before := st.Stats().Calls
	b.ReportAllocs()
	for b.Loop() {
		clk.Advance(time.Second)
		r, err := s.report(ctx, st2, msg)
		if err != nil || len(r.GetBucketAction()) != 10 {
			b.Fatal("no action", err)
		}
	}
	b.ReportMetric(float64(st.Stats().Calls-before)/float64(b.N), "calls/report")
}

// BenchmarkReportGlobal is BenchmarkReport for a bucket of a global
// policy (global.go): the report takes from the instance's region lease
// under its gate, and its assignment's TTL is cut to the lease; the lease
// is renewed in the background, at a home on another memory store.
func BenchmarkReportGlobal(b *testing.B) {
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	home, err := memstore.New(memstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer home.Close()
	clk := clock.NewFake(time.Unix(1e9, 0))
	s, err := New(Options{Store: st, Clock: clk, Global: &Global{Region: "us", StoreOf: func(string) sluice.Store { return home }, HomeOf: func(string) string { return "eu" }},
		Config: &Config{ReportInterval: time.Second, MaxReportsPerPeer: 100000, Regions: []string{"us", "eu"}, Domains: []Domain{{Domain: "d", Policies: []Policy{
			{Name: "p", Match: map[string]string{"route": "*"}, RequestsPerUnit: 1 << 30, Unit: "second", Scope: "global", Home: "eu"},
		}}}}})
	if err != nil {
		b.Fatal(err)
	}
	msg := &rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"route": "api"}},
		TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 50, NumRequestsDenied: 5}}}
	st2 := &stream{id: "bench", buckets: map[[16]byte]*bucket{}}
	ctx := context.Background()
	if _, err := s.report(ctx, st2, msg); err != nil { // the bucket and its first renewal
		b.Fatal(err)
	}
	// The fake clock jumps a second a report, faster than renewals run:
	// the lease is renewed once more by hand and held from then on, so
	// that every report measures the path of a bucket with a lease.
	held := maps.Clone(s.glob.byKy)
	s.Drain() // stops the renewals (and forgets the leases: put back)
	<-s.glob.stopped
	s.glob.byKy = held
	for _, gb := range held {
		gb.demand.Store(1 << 20)
		s.glob.renew(s.cfg.Load(), gb)
		gb.expires.Store(1 << 62)
	}
	b.ReportAllocs()
	var r *rlqsv3.RateLimitQuotaResponse
	for b.Loop() {
		clk.Advance(time.Second)
		r, err = s.report(ctx, st2, msg)
		if err != nil || len(r.GetBucketAction()) != 1 {
			b.Fatal("no action", err)
		}
	}
	if r.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() == nil {
		b.Fatalf("not a token assignment: %v", r)
	}
}

// BenchmarkRenewalSchedule is the renewer's look at every global bucket
// (globals.schedule) when all are due, from 4 clients, as under a flood
// that outruns the renewals: it runs every 25 ms, without g.mu.
func BenchmarkRenewalSchedule(b *testing.B) {
	for _, n := range []int{4000, 100000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			s, c, clk := scheduleWorld(b)
			p := c.domains["d"].policies[0]
			for i := range n {
				key := fmt.Sprintf("rlqs:{d}:p:1:%d", i)
				gb, err := s.glob.bucket(key, key+":@x", p, "d", fmt.Sprint(i%4), clk.Now())
				if err != nil {
					b.Fatal(err)
				}
				gb.expires.Store(int64(i * 7919 % n))
				gb.sent.Store(clk.Now())
			}
			clk.Advance(c.interval)
			b.ReportAllocs()
			for b.Loop() {
				if len(s.glob.schedule(c, clk.Now(), maxRenewals, 0)) == 0 {
					b.Fatal("none due")
				}
			}
		})
	}
}
