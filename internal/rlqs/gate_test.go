package rlqs_test

import (
	"strings"
	"testing"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"

	"github.com/sluice-io/sluice/memstore"
)

// TestReportBytesGate: on the gRPC server sluice serve runs (envoyrls's
// codec), a report larger than any the stream's caps allow (here 4
// usages of the largest bucket ids: 9 KiB) ends the stream before it is
// decoded, counted as refused{reason="report_bytes"}; one within them is
// answered. (A 10 KB domain name decoded would have been NOT_FOUND.)
func TestReportBytesGate(t *testing.T) {
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	reg := prometheus.NewRegistry()
	cfg := fleetConfig()
	cfg.MaxUsagesPerReport = 4
	in := &instance{t: t, store: st, dir: rlsDir(t), cfg: cfg, reg: reg}
	in.start()
	t.Cleanup(in.stop)
	c := dialFrom(t, "127.0.0.1", in.addr)
	r, err := exchange(t, c, &rlqsv3.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"route": "api"}, 1, 0)}})
	if err != nil || len(r.GetBucketAction()) != 1 {
		t.Fatalf("a report within the caps: %v %v", r, err)
	}
	_, err = exchange(t, c, &rlqsv3.RateLimitQuotaUsageReports{Domain: strings.Repeat("d", 10000), BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"route": "api"}, 1, 0)}})
	wantCode(t, err, codes.ResourceExhausted, "a report of 10")
	if n := testutil.ToFloat64(refusedCounter(t, reg, "report_bytes")); n != 1 {
		t.Errorf("refused report_bytes = %v, want 1", n)
	}
}

// refusedCounter is sluice_rlqs_refused_total{reason} in reg.
func refusedCounter(t *testing.T, reg *prometheus.Registry, reason string) prometheus.Collector {
	t.Helper()
	return collectorFunc(func(ch chan<- prometheus.Metric) {
		mfs, _ := reg.Gather()
		var v float64
		for _, mf := range mfs {
			if mf.GetName() != "sluice_rlqs_refused_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "reason" && l.GetValue() == reason {
						v += m.GetCounter().GetValue()
					}
				}
			}
		}
		ch <- prometheus.MustNewConstMetric(prometheus.NewDesc("x", "x", nil, nil), prometheus.CounterValue, v)
	})
}
