// Package tracing adds OpenTelemetry traces to sluice: a span per request
// (HTTP or gRPC) carrying the decision (policies, algorithms, outcome,
// degraded, store latency), a span per store call, and a client span per
// gateway upstream call, with W3C trace context taken from incoming
// requests and sent upstream.
//
// Tracing is off unless an OTLP endpoint is configured through the standard
// environment (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT). When it is off, FromEnv returns a nil
// *Tracing, whose methods return what they are given unwrapped: the request
// path is the same code as a build without tracing. Spans never carry a raw
// key: keys are not recorded at all, only policy and algorithm names.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of sluice's spans.
const ScopeName = "github.com/sluice-io/sluice"

// ErrConfig means the OTEL_* environment asks for something sluice cannot do.
var ErrConfig = errors.New("tracing: unsupported configuration")

// Tracing holds a tracer provider and the W3C propagator. A nil *Tracing
// is tracing switched off: every method returns its argument unchanged.
type Tracing struct {
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	shutdown func(context.Context) error
	flush    func(context.Context) error
}

// New traces through tp (tests use an in-memory exporter).
func New(tp trace.TracerProvider) *Tracing {
	return &Tracing{
		tracer:   tp.Tracer(ScopeName),
		prop:     propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
		shutdown: func(context.Context) error { return nil },
		flush:    func(context.Context) error { return nil },
	}
}

// Enabled reports whether the environment asks for traces: an OTLP endpoint
// is set, OTEL_SDK_DISABLED is not true and OTEL_TRACES_EXPORTER is not
// "none".
func Enabled() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	if exp := os.Getenv("OTEL_TRACES_EXPORTER"); exp != "" && exp != "otlp" {
		return false
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// FromEnv returns nil when Enabled is false. Otherwise it builds an OTLP
// exporter (OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL: grpc, the default, or
// http/protobuf) and a batching tracer provider, both configured by the
// standard OTEL_* variables (endpoint, headers, timeout, sampler,
// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES). Shutdown flushes it.
func FromEnv(ctx context.Context, version string) (*Tracing, error) {
	if !Enabled() {
		return nil, nil
	}
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var client otlptrace.Client
	switch proto {
	case "", "grpc":
		client = otlptracegrpc.NewClient()
	case "http/protobuf":
		client = otlptracehttp.NewClient()
	default:
		return nil, fmt.Errorf("%w: OTEL_EXPORTER_OTLP_PROTOCOL=%q (grpc or http/protobuf)", ErrConfig, proto)
	}
	exp, err := otlptrace.New(ctx, client)
	if err != nil {
		return nil, fmt.Errorf("tracing: otlp exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		semconv.ServiceVersion(version),
	))
	if err != nil {
		res = resource.Default()
	}
	if os.Getenv("OTEL_SERVICE_NAME") == "" && !strings.Contains(os.Getenv("OTEL_RESOURCE_ATTRIBUTES"), "service.name=") {
		res, _ = resource.Merge(res, resource.NewSchemaless(semconv.ServiceName("sluice")))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	t := New(tp)
	t.shutdown, t.flush = tp.Shutdown, tp.ForceFlush
	return t, nil
}

// Flush exports the spans that have ended and waits for the exporter. It
// is safe on a nil *Tracing.
func (t *Tracing) Flush(ctx context.Context) error {
	if t == nil {
		return nil
	}
	if err := t.flush(ctx); err != nil {
		return fmt.Errorf("tracing: flush: %w", err)
	}
	return nil
}

// Shutdown flushes and stops the exporter. It is safe on a nil *Tracing.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	if err := t.shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}
