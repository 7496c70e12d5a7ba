package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

// DefaultGRPCAddr is where envoyproxy/ratelimit listens for gRPC, and so
// where sluice does by default.
const DefaultGRPCAddr = ":8081"

// Register adds the rate-limit service to a gRPC server.
func (s *Service) Register(g *grpc.Server) {
	rlsv3.RegisterRateLimitServiceServer(g, s)
}

// NewGRPCServer returns a gRPC server that serves the rate-limit service,
// the gRPC health service (SERVING for "" and for
// envoy.service.ratelimit.v3.RateLimitService) and server reflection.
//
// Streams are served by a fixed pool of workers, one per CPU, rather than a
// goroutine each: the calls are short, and this saves a goroutine start and
// its stack growth per call.
func (s *Service) NewGRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	opts = append([]grpc.ServerOption{grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0)))}, opts...)
	g := grpc.NewServer(opts...)
	s.Register(g)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, hs)
	reflection.Register(g)
	return g
}

// Serve answers gRPC on lis until ctx is done, then stops gracefully. It
// returns nil after a stop that ctx asked for.
func (s *Service) Serve(ctx context.Context, lis net.Listener, opts ...grpc.ServerOption) error {
	g := s.NewGRPCServer(opts...)
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(lis) }()
	select {
	case err := <-errc:
		if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("envoyrls: serve gRPC: %w", err)
		}
		return nil
	case <-ctx.Done():
		g.GracefulStop()
		<-errc
		return nil
	}
}
