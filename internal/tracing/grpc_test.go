package tracing

import (
	"context"
	"net"
	"testing"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/emptypb"
)

// TestGRPCServerSpans: a gRPC call gets a server span continuing the
// traceparent in its metadata, and the handler sees that span; health
// checks are not traced.
func TestGRPCServerSpans(t *testing.T) {
	tr, exp := newTest(t)
	seen := make(chan trace.SpanContext, 1)
	desc := grpc.ServiceDesc{
		ServiceName: "test.Echo",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Ping", Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(emptypb.Empty)
			if err := dec(in); err != nil {
				return nil, err
			}
			seen <- trace.SpanContextFromContext(ctx)
			return in, nil
		}}},
	}
	s := grpc.NewServer(tr.GRPCServerOptions()...)
	s.RegisterService(&desc, struct{}{})
	healthpb.RegisterHealthServer(s, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	defer s.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", traceparent)
	if err := conn.Invoke(ctx, "/test.Echo/Ping", &emptypb.Empty{}, &emptypb.Empty{}); err != nil {
		t.Fatal(err)
	}
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	s.GracefulStop() // every HandleRPC(End) has run
	sc := <-seen
	span := spanByName(t, exp.GetSpans(), "test.Echo/Ping")
	if span.SpanKind != trace.SpanKindServer || span.SpanContext.TraceID().String() != incomingTrace || span.Parent.SpanID().String() != incomingSpan {
		t.Errorf("span %+v does not continue the incoming traceparent as a server span", span.SpanContext)
	}
	if sc.SpanID() != span.SpanContext.SpanID() {
		t.Error("the handler's context does not carry the call's span")
	}
	if a := attrs(span); a["rpc.service"] != "test.Echo" || a["rpc.method"] != "Ping" || a["rpc.grpc.status_code"] != "0" {
		t.Errorf("attributes %v", a)
	}
	if n := len(exp.GetSpans()); n != 1 {
		t.Errorf("%d spans, want 1 (health checks are not traced)", n)
	}
}
