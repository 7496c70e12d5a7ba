package tracing

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// GRPCServerOptions returns the options that give each gRPC call a server
// span, a child of the W3C traceparent in its metadata; health checks and
// reflection are not traced. On a nil *Tracing it returns none.
func (t *Tracing) GRPCServerOptions() []grpc.ServerOption {
	if t == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(&statsHandler{t: t})}
}

type statsHandler struct{ t *Tracing }

func (h *statsHandler) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	name := strings.TrimPrefix(info.FullMethodName, "/")
	if strings.HasPrefix(name, "grpc.health.") || strings.HasPrefix(name, "grpc.reflection.") {
		return ctx
	}
	md, _ := metadata.FromIncomingContext(ctx)
	ctx = h.t.prop.Extract(ctx, metadataCarrier(md))
	service, method, _ := strings.Cut(name, "/")
	ctx, _ = h.t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String("rpc.system", "grpc"),
		attribute.String("rpc.service", service),
		attribute.String("rpc.method", method),
	))
	return ctx
}

func (h *statsHandler) HandleRPC(ctx context.Context, s stats.RPCStats) {
	end, ok := s.(*stats.End)
	if !ok {
		return
	}
	span := trace.SpanFromContext(ctx)
	st, _ := status.FromError(end.Error)
	span.SetAttributes(attribute.Int("rpc.grpc.status_code", int(st.Code())))
	if end.Error != nil {
		span.SetStatus(codes.Error, st.Code().String())
	}
	span.End()
}

func (h *statsHandler) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}

func (h *statsHandler) HandleConn(context.Context, stats.ConnStats) {}

// metadataCarrier lets the propagator read and write gRPC metadata.
type metadataCarrier metadata.MD

func (c metadataCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c metadataCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c metadataCarrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}
