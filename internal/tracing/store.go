package tracing

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-io/sluice"
)

// Store wraps s so that each call is a span ("sluice.store ApplyAll")
// recording the operation, the number of requests, their algorithms, the
// outcome and the store's latency, which is also put on the calling
// request's span as sluice.store.latency_ms. Keys are never recorded. On a
// nil *Tracing it returns s.
//
// Only calls made for a traced request get a span: a call whose context
// carries no span (the guard's probes and heartbeats, background flushes
// and renewals) is passed through untraced, so that an idle process
// exports nothing. The wrapper's Unwrap lets the guard find the optional
// interfaces (Pinger, Sharded, Membership) of the store below.
func (t *Tracing) Store(s sluice.Store) sluice.Store {
	if t == nil {
		return s
	}
	return &store{t: t, next: s}
}

type store struct {
	t    *Tracing
	next sluice.Store
}

// Unwrap returns the wrapped store.
func (s *store) Unwrap() sluice.Store { return s.next }

func (s *store) Apply(ctx context.Context, op sluice.Op, req sluice.Request) (sluice.Decision, error) {
	parent := trace.SpanFromContext(ctx)
	if !parent.SpanContext().IsValid() {
		return s.next.Apply(ctx, op, req) // no request to trace: no root span
	}
	ctx, span := s.t.tracer.Start(ctx, "sluice.store Apply", trace.WithSpanKind(trace.SpanKindClient))
	start := time.Now()
	d, err := s.next.Apply(ctx, op, req)
	s.finish(parent, span, start, op, []sluice.Request{req}, []sluice.Decision{d}, err)
	return d, err
}

func (s *store) ApplyAll(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	parent := trace.SpanFromContext(ctx)
	if !parent.SpanContext().IsValid() {
		return s.next.ApplyAll(ctx, op, reqs)
	}
	ctx, span := s.t.tracer.Start(ctx, "sluice.store ApplyAll", trace.WithSpanKind(trace.SpanKindClient))
	start := time.Now()
	ds, err := s.next.ApplyAll(ctx, op, reqs)
	s.finish(parent, span, start, op, reqs, ds, err)
	return ds, err
}

func (s *store) finish(parent, span trace.Span, start time.Time, op sluice.Op, reqs []sluice.Request, ds []sluice.Decision, err error) {
	ms := float64(time.Since(start).Microseconds()) / 1000
	algs := make([]string, len(reqs))
	for i, r := range reqs {
		algs[i] = r.Algorithm.String()
	}
	span.SetAttributes(
		attribute.String("sluice.op", op.String()),
		attribute.Int("sluice.requests", len(reqs)),
		attribute.StringSlice("sluice.algorithm", algs),
	)
	if err != nil {
		span.RecordError(storeErrorClass(err))
		span.SetStatus(codes.Error, "store call failed")
	} else if len(ds) > 0 {
		allowed := true
		for _, d := range ds {
			allowed = allowed && d.Allowed
		}
		span.SetAttributes(attribute.String("sluice.outcome", outcome(allowed)))
	}
	span.End()
	if parent.IsRecording() {
		parent.SetAttributes(attribute.Float64("sluice.store.latency_ms", ms))
	}
}

func outcome(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "denied"
}

// storeErrorClass is what a span records of a store error: the sentinel
// it wraps, never its message, since sluice's errors name the request's
// key ("cost 5, burst 1 for key ...") and a caller can provoke them.
func storeErrorClass(err error) error {
	for _, sentinel := range []error{
		sluice.ErrCostExceedsBurst, sluice.ErrInvalidCalendar, sluice.ErrInvalidLimit, sluice.ErrInvalidCost,
		sluice.ErrUnknownAlgorithm, sluice.ErrInvalidRequest, sluice.ErrUnavailable,
		context.DeadlineExceeded, context.Canceled,
	} {
		if errors.Is(err, sentinel) {
			return sentinel
		}
	}
	return errStore
}

var errStore = errors.New("store error")
