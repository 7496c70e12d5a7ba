package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
)

// DefaultGRPCAddr is where envoyproxy/ratelimit listens for gRPC, and so
// where sluice does by default.
const DefaultGRPCAddr = ":8081"

// gRPC server defaults; see NewGRPCServer.
const (
	minStreamWorkers    = 64
	streamWorkersPerCPU = 16
	// streamWindow bounds what a client can send on a stream before its
	// call reads it (16 KiB: requests are a few hundred bytes; a larger
	// one is let in as it is read): with maxPeerCalls, what a peer's
	// calls hold before they are read (fairness.go).
	streamWindow = 16 << 10
	connWindow   = 1 << 20
	// maxStreams bounds the calls in flight on one connection. Envoy opens
	// another connection when its pool reaches the bound; a client that
	// opens streams and never reads their answers holds at most this many
	// goroutines a connection (gRPC's default is 2^32-1).
	maxStreams = 1024
	// keepaliveMinTime is the shortest interval between a client's
	// keepalive pings (with or without calls in flight): a client that
	// pings more often gets GOAWAY (ENHANCE_YOUR_CALM, "too_many_pings")
	// on its third. gRPC's default is 5 minutes, without calls not at all,
	// which cuts off an idle Envoy that pings every 30 s.
	keepaliveMinTime = 5 * time.Second
	// keepaliveTime and keepaliveTimeout: the server pings a connection
	// silent for keepaliveTime and closes it when no answer comes within
	// keepaliveTimeout, so a vanished client's connection does not hold
	// its place in its peer's budget.
	keepaliveTime    = time.Minute
	keepaliveTimeout = 20 * time.Second
)

// Register adds the rate-limit service to a gRPC server.
func (s *Service) Register(g *grpc.Server) {
	rlsv3.RegisterRateLimitServiceServer(g, s)
}

// NewGRPCServer returns a gRPC server that serves the rate-limit service,
// the gRPC health service (SERVING for "" and for
// envoy.service.ratelimit.v3.RateLimitService) and server reflection.
// opts are applied after the defaults below, so they can override them.
//
// The defaults are tuned for many short unary calls:
//
//   - Streams are served by a fixed pool of at least 64 workers (16 per CPU)
//     rather than a new goroutine each. A worker keeps the stack the call
//     path grew, where a new goroutine grows its stack again (copying it
//     two or three times) on every call; that copying was an eighth of the
//     server's CPU at 64 calls in flight. The pool must cover the calls in
//     flight: gRPC starts a goroutine for a call that finds every worker
//     busy.
//   - At most 1024 calls in flight on one connection (HTTP/2's
//     SETTINGS_MAX_CONCURRENT_STREAMS; gRPC's default has no bound).
//   - Flow-control windows are static (16 KiB per stream, 1 MiB per
//     connection; requests are a few hundred bytes), which turns off the
//     bandwidth-delay estimator and the PING frames it sends while data
//     flows.
//   - A message is read if it is at most 4 MiB (gRPC refuses a larger one
//     from its length) and decoded if it is at most
//     DefaultMaxRequestBytes (else it is OVER_LIMIT), and each call passes
//     its peer's budgets (fairness.go) when its connection was accepted
//     by Serve or Runner.
//   - Keepalive is enforced: a client may ping every 5 s at most; the
//     server pings a connection silent for a minute and closes it if no
//     answer comes in 20 s.
func (s *Service) NewGRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	return NewGRPCServerFor(s, opts...)
}

// NewGRPCServerFor is NewGRPCServer for any RateLimitService handler h:
// the same options, codec, health and reflection services. Benchmarks use
// it to measure the gRPC floor, a handler that decides nothing, on exactly
// the server sluice runs.
func NewGRPCServerFor(h rlsv3.RateLimitServiceServer, opts ...grpc.ServerOption) *grpc.Server {
	defaults := []grpc.ServerOption{
		grpc.NumStreamWorkers(uint32(max(minStreamWorkers, streamWorkersPerCPU*runtime.GOMAXPROCS(0)))),
		grpc.StaticStreamWindowSize(streamWindow),
		grpc.MaxConcurrentStreams(maxStreams),
		grpc.StaticConnWindowSize(connWindow),
		grpc.ForceServerCodecV2(newCodec()), // descriptor values of any bytes (codec.go)
		grpc.MaxRecvMsgSize(readBound),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: keepaliveTime, Timeout: keepaliveTimeout}),
	}
	opts = append(defaults, opts...)
	g := grpc.NewServer(opts...)
	g.RegisterService(&rateLimitServiceDesc, h) // ShouldRateLimit behind the peer's budgets
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, hs)
	reflection.Register(g)
	return g
}

// Serve answers gRPC on lis until ctx is done, then stops gracefully. It
// returns nil after a stop that ctx asked for. Its connections are
// accepted within the default Limits (fairness.go) unless lis is
// Runner's, which has its own.
func (s *Service) Serve(ctx context.Context, lis net.Listener, opts ...grpc.ServerOption) error {
	return s.serve(ctx, guardListener(lis, Limits{}, s.log, s.metrics), nil, opts...)
}

// Extra is another service served on the same gRPC server, such as the
// quota service of internal/rlqs.
type Extra interface {
	// Register adds the service to the server.
	Register(g *grpc.Server)
	// Drain ends the service's long-lived streams, so that the graceful
	// stop that follows does not wait for them forever.
	Drain()
}

// serve is Serve on a guarded listener, with extras on the same server.
func (s *Service) serve(ctx context.Context, lis net.Listener, extras []Extra, opts ...grpc.ServerOption) error {
	g := s.NewGRPCServer(opts...)
	for _, e := range extras {
		e.Register(g)
	}
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(lis) }()
	select {
	case err := <-errc:
		if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("envoyrls: serve gRPC: %w", err)
		}
		return nil
	case <-ctx.Done():
		for _, e := range extras {
			e.Drain()
		}
		g.GracefulStop()
		<-errc
		return nil
	}
}
