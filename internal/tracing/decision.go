package tracing

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-io/sluice"
)

// Decision is one policy's decision of a request, as Annotate records it.
type Decision struct {
	// Policy is the policy's configured name (never a key).
	Policy string
	// Algorithm is the algorithm that decided.
	Algorithm sluice.Algorithm
	// Shadow marks a policy that counts but never denies.
	Shadow bool
	// Decision is the store's answer.
	Decision sluice.Decision
}

// Recording reports whether ctx carries a span that records: callers
// building Annotate's arguments check it first, so that tracing off costs
// one context look-up.
func Recording(ctx context.Context) bool {
	return trace.SpanFromContext(ctx).IsRecording()
}

// Annotate puts a request's decisions on its span: sluice.policy and
// sluice.algorithm (one entry per policy), sluice.outcome (allowed or
// denied, shadow policies aside) and sluice.degraded (a failure policy
// answered instead of the store).
func Annotate(ctx context.Context, ds []Decision) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() || len(ds) == 0 {
		return
	}
	policies := make([]string, len(ds))
	algs := make([]string, len(ds))
	allowed, degraded := true, false
	var shadowDenied []string
	for i, d := range ds {
		policies[i], algs[i] = d.Policy, d.Algorithm.String()
		degraded = degraded || d.Decision.Degraded
		switch {
		case !d.Decision.Allowed && d.Shadow:
			shadowDenied = append(shadowDenied, d.Policy)
		case !d.Decision.Allowed:
			allowed = false
		}
	}
	attrs := []attribute.KeyValue{
		attribute.StringSlice("sluice.policy", policies),
		attribute.StringSlice("sluice.algorithm", algs),
		attribute.String("sluice.outcome", outcome(allowed)),
		attribute.Bool("sluice.degraded", degraded),
	}
	if len(shadowDenied) > 0 {
		attrs = append(attrs, attribute.StringSlice("sluice.shadow_denied", shadowDenied))
	}
	span.SetAttributes(attrs...)
}

// Set puts attrs on ctx's span if it records. Callers check Recording
// first, so that tracing off does not even build attrs.
func Set(ctx context.Context, attrs ...attribute.KeyValue) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(attrs...)
	}
}
