package rlqs_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/internal/rlqs"
	"github.com/sluice-io/sluice/memstore"
)

func boundsConfig() *rlqs.Config {
	return &rlqs.Config{
		ReportInterval:      time.Second,
		MaxBucketsPerStream: 3,
		MaxStreamsPerPeer:   2,
		MaxUsagesPerReport:  4,
		Domains: []rlqs.Domain{{Domain: "envoy", Policies: []rlqs.Policy{
			{Name: "blocked", Match: map[string]string{"route": "admin"}, Denied: true},
			{Name: "tiny", Match: map[string]string{"route": "tiny"}, RequestsPerUnit: 1, Unit: "minute"},
			{Name: "per-user", Match: map[string]string{"user": "*"}, RequestsPerUnit: 100, Unit: "second"},
		}}},
	}
}

// serve starts a quota server on a real TCP port and returns a client.
func serve(t *testing.T, reg prometheus.Registerer, cfg *rlqs.Config) (*rlqs.Server, rlqsv3.RateLimitQuotaServiceClient) {
	t.Helper()
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	q, err := rlqs.New(rlqs.Options{Store: st, Config: cfg, Registerer: reg})
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
	return q, rlqsv3.NewRateLimitQuotaServiceClient(conn)
}

func usage(id map[string]string, allowed, denied uint64) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: id},
		TimeElapsed: durationpb.New(100 * time.Millisecond), NumRequestsAllowed: allowed, NumRequestsDenied: denied}
}

// exchange opens a stream, sends msgs and returns the first response, or
// the stream's error.
func exchange(t *testing.T, c rlqsv3.RateLimitQuotaServiceClient, msgs ...*rlqsv3.RateLimitQuotaUsageReports) (*rlqsv3.RateLimitQuotaResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	st, err := c.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if err := st.Send(m); err != nil {
			break // the server ended the stream; Recv says why
		}
	}
	return st.Recv()
}

func wantCode(t *testing.T, err error, code codes.Code, text string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), text) {
		t.Errorf("err = %v, want %v with %q", err, code, text)
	}
}

// TestBounds: each bound ends the stream with a clear status; nothing
// beyond it is kept.
func TestBounds(t *testing.T) {
	_, c := serve(t, nil, boundsConfig())
	user := func(i int) map[string]string { return map[string]string{"user": fmt.Sprint(i)} }

	_, err := exchange(t, c, &rlqsv3.RateLimitQuotaUsageReports{BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(user(1), 1, 0)}})
	wantCode(t, err, codes.InvalidArgument, "must name the domain")

	_, err = exchange(t, c, &rlqsv3.RateLimitQuotaUsageReports{Domain: "other", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(user(1), 1, 0)}})
	wantCode(t, err, codes.NotFound, `domain "other" is not configured`)

	var five []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
	for i := range 5 {
		five = append(five, usage(user(i), 1, 0))
	}
	_, err = exchange(t, c, &rlqsv3.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: five})
	wantCode(t, err, codes.ResourceExhausted, "5 bucket usages in one report; at most 4")

	// Four buckets, in two reports of at most four usages: the fourth is
	// past max_buckets_per_stream.
	_, err = exchange(t, c,
		&rlqsv3.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: five[:3]},
		&rlqsv3.RateLimitQuotaUsageReports{BucketQuotaUsages: five[3:4]})
	if err != nil {
		t.Fatalf("three buckets: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: five[:3]})
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	_ = st.Send(&rlqsv3.RateLimitQuotaUsageReports{BucketQuotaUsages: five[3:4]})
	_, err = st.Recv()
	wantCode(t, err, codes.ResourceExhausted, "more than 3 buckets on one stream")

	big := map[string]string{}
	for i := range rlqs.MaxBucketIDEntries + 1 {
		big[fmt.Sprint("k", i)] = "v"
	}
	_, err = exchange(t, c, &rlqsv3.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(big, 1, 0)}})
	wantCode(t, err, codes.InvalidArgument, "entries; at most 16")
	_, err = exchange(t, c, &rlqsv3.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"user": strings.Repeat("x", rlqs.MaxBucketIDBytes)}, 1, 0)}})
	wantCode(t, err, codes.InvalidArgument, "bytes; at most 1024")
}

// TestStreamsPerPeer: a client IP holds at most max_streams_per_peer
// streams; a closed one frees its place.
func TestStreamsPerPeer(t *testing.T) {
	_, c := serve(t, nil, boundsConfig())
	first := &rlqsv3.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"user": "1"}, 1, 0)}}
	var cancels []context.CancelFunc
	for range 2 {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		st, err := c.StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = st.Send(first)
		if _, err := st.Recv(); err != nil { // open and counted
			t.Fatal(err)
		}
	}
	_, err := exchange(t, c, first)
	wantCode(t, err, codes.ResourceExhausted, "too many streams from this client")
	cancels[0]()
	// The freed place is taken again once the server has seen the cancel;
	// the retry loop waits for that, not for time.
	if !redistest.PollUntil(time.Now().Add(10*time.Second), func() bool {
		_, err = exchange(t, c, first)
		return err == nil
	}) {
		t.Fatalf("place never freed: %v", err)
	}
	cancels[1]()
}

// TestActions: denied policy → blanket DENY_ALL, no policy → abandon, a
// bucket over its budget → DENY_ALL, else a token bucket with a TTL; the
// metrics carry the policy, never the bucket's values.
func TestActions(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := boundsConfig()
	cfg.MaxStreamsPerPeer = 100
	_, c := serve(t, reg, cfg)
	r, err := exchange(t, c, &rlqsv3.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage(map[string]string{"route": "admin"}, 0, 5),
		usage(map[string]string{"path": "/x"}, 1, 0),
		usage(map[string]string{"user": "alice@example.com"}, 50, 0),
	}})
	if err != nil {
		t.Fatal(err)
	}
	acts := r.GetBucketAction()
	if len(acts) != 3 {
		t.Fatalf("%d actions, want 3", len(acts))
	}
	if got := acts[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule(); got != typev3.RateLimitStrategy_DENY_ALL || acts[0].GetQuotaAssignmentAction() == nil {
		t.Errorf("denied policy: %v", acts[0])
	}
	if acts[1].GetAbandonAction() == nil {
		t.Errorf("no policy: %v, want abandon", acts[1])
	}
	qa := acts[2].GetQuotaAssignmentAction()
	tb := qa.GetRateLimitStrategy().GetTokenBucket()
	// 50 in the first interval: asked 50 + 25 + 1 of the 100 a second,
	// in a bucket of MinBurst, whole seconds (Envoy reads only those).
	if tb.GetTokensPerFill().GetValue() != 76 || tb.GetMaxTokens() != rlqs.MinBurst || tb.GetFillInterval().AsDuration() != time.Second || qa.GetAssignmentTimeToLive().AsDuration() != 2*time.Second {
		t.Errorf("assignment %v, want 76 tokens per 1s, max %d, TTL 2s", qa, rlqs.MinBurst)
	}
	if acts[2].GetBucketId().GetBucket()["user"] != "alice@example.com" {
		t.Errorf("bucket id not echoed: %v", acts[2].GetBucketId())
	}
	// The tiny policy: 1 a minute, taken by the first report;
	// the second stream gets nothing and is told to deny all.
	for i, want := range []bool{true, false} {
		r, err := exchange(t, c, &rlqsv3.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"route": "tiny"}, 100, 0)}})
		if err != nil {
			t.Fatal(err)
		}
		s := r.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy()
		if got := s.GetTokenBucket() != nil; got != want {
			t.Errorf("tiny, stream %d: %v, want token bucket %v", i, s, want)
		}
		if !want && s.GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
			t.Errorf("tiny over budget: %v, want DENY_ALL", s)
		}
	}
	if n := testutil.ToFloat64(assignments(reg, "per-user", "tokens")); n != 1 {
		t.Errorf("assignments{per-user,tokens} = %v, want 1", n)
	}
	out, err := testutil.GatherAndCount(reg)
	if err != nil || out == 0 {
		t.Fatalf("gather: %v %d", err, out)
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if strings.Contains(mf.String(), "alice") {
			t.Errorf("metric %s carries a bucket value", mf.GetName())
		}
	}
}

func assignments(reg *prometheus.Registry, policy, action string) prometheus.Collector {
	return collectorFunc(func(ch chan<- prometheus.Metric) {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() != "sluice_rlqs_assignments_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				l := map[string]string{}
				for _, lp := range m.GetLabel() {
					l[lp.GetName()] = lp.GetValue()
				}
				if l["policy"] == policy && l["action"] == action {
					ch <- prometheus.MustNewConstMetric(prometheus.NewDesc("x", "x", nil, nil), prometheus.CounterValue, m.GetCounter().GetValue())
				}
			}
		}
	})
}

type collectorFunc func(chan<- prometheus.Metric)

func (f collectorFunc) Describe(chan<- *prometheus.Desc)    {}
func (f collectorFunc) Collect(ch chan<- prometheus.Metric) { f(ch) }

// TestDrain: Drain ends open streams with UNAVAILABLE, so a graceful stop
// does not wait for them.
func TestDrain(t *testing.T) {
	q, c := serve(t, nil, boundsConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"user": "1"}, 1, 0)}})
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	q.Drain()
	_, err = st.Recv()
	wantCode(t, err, codes.Unavailable, "shutting down")
}
