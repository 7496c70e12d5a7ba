package rlqs_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/envoyrls"
	"github.com/sluice-io/sluice/internal/rlqs"
	"github.com/sluice-io/sluice/memstore"
)

// BenchmarkStreams is the whole per-report path as sluice serve runs it:
// the gRPC server of the Envoy port (envoyrls.Runner: its guarded
// listener, codec and stream workers), the quota service's goroutines
// and the memory store, with 200 streams of 10 buckets each (16 streams
// per client address, the per-client cap), each reporting once an
// interval on a fake clock. One iteration is one interval: every stream
// sends its report and reads its answer (the demand alternates by more
// than 10 % between intervals, so every report changes its shares and is
// answered, as while a fleet's demand moves). ns/op and allocs/op are per
// interval of 200 reports, cpu-ns/report the process's CPU per report, the
// clients' side included.
func BenchmarkStreams(b *testing.B) {
	const streams, buckets = 200, 10
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	clk := clock.NewFake(time.Unix(1e9, 0))
	q, err := rlqs.New(rlqs.Options{Store: st, Clock: clk, Logger: slog.New(slog.DiscardHandler), Config: &rlqs.Config{ReportInterval: time.Second,
		Domains: []rlqs.Domain{{Domain: "envoy", Policies: []rlqs.Policy{{Name: "p", Match: map[string]string{"route": "*"}, RequestsPerUnit: 1 << 30, Unit: "second"}}}}}})
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rls.yaml"), []byte("domain: rls\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	svc, err := envoyrls.New(envoyrls.Options{Store: st, ConfigDir: dir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	listening := make(chan string, 1)
	r := &envoyrls.Runner{Service: svc, GRPCAddr: "127.0.0.1:0", Extras: []envoyrls.Extra{q},
		OnListen: func(_ string, a net.Addr) { listening <- a.String() }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	var addr string
	select {
	case addr = <-listening:
	case err := <-done:
		b.Fatal(err)
	}

	// Two reports per stream, sent in turn: demand 50 and 100 a bucket.
	type client struct {
		s    rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
		msgs [2]*rlqsv3.RateLimitQuotaUsageReports
	}
	cs := make([]client, streams)
	sctx, scancel := context.WithCancel(context.Background())
	defer scancel()
	var conn *grpc.ClientConn
	for i := range cs {
		if i%16 == 0 {
			d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(fmt.Sprintf("127.0.1.%d", 1+i/16))}}
			conn, err = grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
		}
		s, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(sctx)
		if err != nil {
			b.Fatal(err)
		}
		cs[i].s = s
		for k, allowed := range []uint64{50, 100} {
			m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "envoy"}
			for j := range buckets {
				m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
					BucketId:    &rlqsv3.BucketId{Bucket: map[string]string{"route": fmt.Sprintf("r%d", j), "envoy": fmt.Sprint(i)}},
					TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: allowed})
			}
			cs[i].msgs[k] = m
		}
	}
	interval := func(k int) {
		clk.Advance(time.Second)
		for i := range cs {
			if err := cs[i].s.Send(cs[i].msgs[k%2]); err != nil {
				b.Fatal(err)
			}
		}
		for i := range cs {
			a, err := cs[i].s.Recv()
			if err != nil || len(a.GetBucketAction()) != buckets {
				b.Fatalf("stream %d: %d actions, %v", i, len(a.GetBucketAction()), err)
			}
		}
	}
	interval(0) // every bucket new: created, then measured in steady state
	interval(1)
	b.ReportAllocs()
	cpu0 := processCPU(b)
	b.ResetTimer()
	for k := 0; k < b.N; k++ {
		interval(k)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*streams), "ns/report")
	// CPU, not wall time, is the figure on a shared machine: this
	// process's (server and clients), per report.
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N*streams), "cpu-ns/report")
}

// processCPU is this process's CPU time (user and system) in ns.
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
