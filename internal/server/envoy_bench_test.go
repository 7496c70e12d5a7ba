package server

import (
	"context"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/envoyrls"
	"github.com/sluice-io/sluice/internal/loadtest"
	"github.com/sluice-io/sluice/internal/metrics"
	"github.com/sluice-io/sluice/internal/redistest"
)

// BenchmarkEnvoyShouldRateLimit is internal/loadtest/bench-envoy-cold.sh
// in one process: Envoy checks over 100k cold keys (one fixed-window
// descriptor each, deploy/envoy/ratelimit's edge domain, 100/min), 64 in
// flight, on the store stack `sluice serve` builds (guard, lease.Store,
// the store), beside an empty handler that answers OK and asks no store
// (loadtest.EmptyRLS, rlsfloor's), all in the same run; "plain" is Redis with
// store.plain_windows.
//
//   - handler/...: ShouldRateLimit called directly: the service's own
//     work per request, no gRPC.
//   - grpc/...: through the gRPC server `sluice serve` runs
//     (envoyrls.NewGRPCServerFor) and a client on loopback, both in this
//     process.
//
// cpu-ns/op is this process's CPU (user + system) per request, so a
// redis-server's CPU is not in it; compare the store stacks with empty by
// their ratio.
func BenchmarkEnvoyShouldRateLimit(b *testing.B) {
	reqs := coldEnvoyRequests(100_000)
	backends := []string{"empty", "memory", "redis", "plain"}
	handlers := map[string]rlsv3.RateLimitServiceServer{}
	for _, backend := range backends {
		handlers[backend] = envoyBenchHandler(b, backend)
	}
	b.Run("handler", func(b *testing.B) {
		for _, backend := range backends {
			h := handlers[backend]
			b.Run(backend, func(b *testing.B) {
				runEnvoyBench(b, reqs, h.ShouldRateLimit)
			})
		}
	})
	b.Run("grpc", func(b *testing.B) {
		for _, backend := range backends {
			h := handlers[backend]
			b.Run(backend, func(b *testing.B) {
				client := envoyBenchGRPC(b, h)
				runEnvoyBench(b, reqs, func(ctx context.Context, r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
					return client.ShouldRateLimit(ctx, r)
				})
			})
		}
	})
}

// coldEnvoyRequests are n one-descriptor requests on n distinct keys, as
// `sluice loadtest --domain edge --descriptor 'remote_address=10.0.{key}'`.
func coldEnvoyRequests(n int) []*rlsv3.RateLimitRequest {
	out := make([]*rlsv3.RateLimitRequest, n)
	for i := range out {
		out[i] = &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0." + strconv.Itoa(i)}}},
		}}
	}
	return out
}

func runEnvoyBench(b *testing.B, reqs []*rlsv3.RateLimitRequest, call func(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error)) {
	var next atomic.Int64
	b.SetParallelism(benchConns / max(1, runtimeProcs()))
	b.ReportAllocs()
	b.ResetTimer()
	cpu0, w0 := processCPU(), writeCalls()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			resp, err := call(ctx, reqs[next.Add(1)%int64(len(reqs))])
			if err != nil {
				b.Error(err)
				return
			}
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				b.Errorf("overall code %v", resp.GetOverallCode())
				return
			}
		}
	})
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
	if w0 >= 0 {
		b.ReportMetric(float64(writeCalls()-w0)/float64(b.N), "writes/op")
	}
}

// writeCalls is the number of write system calls this process has made
// (syscw in /proc/self/io), or -1 where that is not known.
func writeCalls() int64 {
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return -1
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "syscw: "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}

// processCPU is this process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// envoyBenchHandler builds the Envoy service as `sluice serve` does on
// backend ("memory" or "redis"), or the empty handler ("empty").
func envoyBenchHandler(b *testing.B, backend string) rlsv3.RateLimitServiceServer {
	if backend == "empty" {
		return loadtest.EmptyRLS{}
	}
	url, plain := "memory", "false"
	switch backend {
	case "redis":
		url = redistest.Standalone(b).URL()
	case "plain": // Redis with store.plain_windows
		url, plain = redistest.Standalone(b).URL(), "true"
	}
	// As the script's sluice.yaml: the store with a 1s timeout.
	cfg, err := config.Parse("bench.yaml", []byte("store:\n  url: "+url+"\n  timeout: 1s\n  plain_windows: "+plain+"\n"))
	if err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	store, closer, err := openStore(context.Background(), cfg.Store, log)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = closer.Close() })
	g, err := newGuard(store, cfg.Store, nil, log)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = g.Close() })
	m := metrics.New()
	srv, err := New(Options{Store: g, Config: cfg, Metrics: m, Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	svc, err := envoyrls.New(envoyrls.Options{Store: srv.guard.store, ConfigDir: "../../deploy/envoy/ratelimit", Logger: log, Registerer: m.Registry})
	if err != nil {
		b.Fatal(err)
	}
	return svc
}

// envoyBenchGRPC serves h on loopback as `sluice serve` does and returns a
// client of it.
func envoyBenchGRPC(b *testing.B, h rlsv3.RateLimitServiceServer) rlsv3.RateLimitServiceClient {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	g := envoyrls.NewGRPCServerFor(h)
	go func() { _ = g.Serve(lis) }()
	b.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}
