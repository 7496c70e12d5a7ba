package tracing

import (
	"cmp"
	"net/http"
	"strconv"

	"github.com/sluice-io/sluice/internal/statuswriter"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Handler wraps h so that each request gets a server span, a child of the
// W3C traceparent the request carries. The span is named for the method
// and the route pattern that served it (never the raw path, which may hold
// a key) and records the status code; a 429 is the outcome "denied".
// Health checks and scrapes (/healthz, /readyz, /livez, /metrics) get no
// span: an orchestrator's probes every few seconds would otherwise be most
// of what an idle service exports. On a nil *Tracing it returns h.
func (t *Tracing) Handler(h http.Handler) http.Handler {
	if t == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if untraced[r.URL.Path] {
			h.ServeHTTP(w, r)
			return
		}
		ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := t.tracer.Start(ctx, "HTTP "+r.Method, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.request.method", r.Method)))
		defer span.End()
		rw := statuswriter.New(w)
		r = r.WithContext(ctx)
		h.ServeHTTP(rw, r)
		route := r.Pattern
		if route == "" {
			route = "unmatched"
		}
		status := cmp.Or(rw.Status(), http.StatusOK)
		span.SetName(r.Method + " " + routePath(route))
		span.SetAttributes(attribute.String("http.route", routePath(route)), attribute.Int("http.response.status_code", status))
		if status >= 500 {
			span.SetStatus(codes.Error, strconv.Itoa(status))
		}
	})
}

// untraced are the paths of probes and scrapes, which get no span.
var untraced = map[string]bool{"/healthz": true, "/readyz": true, "/livez": true, "/metrics": true}

// routePath drops the method a ServeMux pattern starts with.
func routePath(pattern string) string {
	for i := 0; i < len(pattern); i++ {
		if pattern[i] == ' ' {
			return pattern[i+1:]
		}
		if pattern[i] == '/' {
			break
		}
	}
	return pattern
}

// Transport wraps rt (nil means http.DefaultTransport) so that each
// upstream call gets a client span and carries its W3C traceparent. The
// span records the upstream host and status, not the URL's query. On a nil
// *Tracing it returns rt.
func (t *Tracing) Transport(rt http.RoundTripper) http.RoundTripper {
	if t == nil {
		return rt
	}
	if rt == nil {
		rt = http.DefaultTransport
	}
	return &transport{t: t, next: rt}
}

type transport struct {
	t    *Tracing
	next http.RoundTripper
}

func (tr *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, span := tr.t.tracer.Start(req.Context(), "upstream "+req.Method, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("http.request.method", req.Method),
			attribute.String("server.address", req.URL.Host),
			attribute.String("url.path", req.URL.Path),
		))
	req = req.Clone(ctx)
	tr.t.prop.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := tr.next.RoundTrip(req)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "upstream call failed")
		span.End()
		return nil, err
	}
	span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
	if resp.StatusCode >= 500 {
		span.SetStatus(codes.Error, strconv.Itoa(resp.StatusCode))
	}
	// The span covers the time to the response headers; a stream's body
	// is relayed after it ends.
	span.End()
	return resp, nil
}
