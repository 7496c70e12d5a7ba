package envoyrls

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"sync/atomic"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
)

// benchRequests are 100k distinct one-descriptor requests, as in the
// envoyproxy/ratelimit reference run.
func benchRequests(domain, key string, n int) []*rlsv3.RateLimitRequest {
	out := make([]*rlsv3.RateLimitRequest, n)
	for i := range out {
		out[i] = &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: "10.0." + strconv.Itoa(i)}}},
		}}
	}
	return out
}

// BenchmarkService measures the service's own work per ShouldRateLimit
// (lookup, keys, one ApplyAll on the memory store, the response), without
// gRPC. The baseline is BenchmarkMemstoreApplyAll, the store call alone.
func BenchmarkService(b *testing.B) {
	store, err := memstore.New(memstore.Options{Clock: clock.NewSystem(), MaxKeys: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	svc, err := New(Options{Store: store, ConfigDir: "testdata/config", Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	reqs := benchRequests("test-domain", "key2", 100_000) // 20/min fixed window
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			if _, err := svc.ShouldRateLimit(ctx, reqs[next.Add(1)%int64(len(reqs))]); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkGRPC is BenchmarkService through a real gRPC server and client
// on loopback, both in this process: 64 calls in flight.
func BenchmarkGRPC(b *testing.B) {
	store, err := memstore.New(memstore.Options{Clock: clock.NewSystem(), MaxKeys: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	svc, err := New(Options{Store: store, ConfigDir: "testdata/config", Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx, lis) }()
	defer func() { cancel(); <-done }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	reqs := benchRequests("test-domain", "key2", 100_000)
	var next atomic.Int64
	b.SetParallelism(32) // 64 in flight on 2 CPUs
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := client.ShouldRateLimit(ctx, reqs[next.Add(1)%int64(len(reqs))]); err != nil {
				b.Fatal(err)
			}
		}
	})
}
