package gateway

import (
	"context"

	"go.opentelemetry.io/otel/attribute"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/tracing"
)

// traceAdmit puts an admission decision on the request's span: the tier,
// the model's metric label (a configured model or "other", never the
// client's string), the outcome (admitted, limited, too_large or
// store_error) and whether a failure policy answered instead of the store.
// Never the client's key. Callers check tracing.Recording first.
func traceAdmit(ctx context.Context, c *call, outcome string, ds []sluice.Decision) {
	degraded := false
	for _, d := range ds {
		degraded = degraded || d.Degraded
	}
	tracing.Set(ctx,
		attribute.String("sluice.tier", c.client.tier.name),
		attribute.String("sluice.model", c.model),
		attribute.String("sluice.gateway.outcome", outcome),
		attribute.Bool("sluice.degraded", degraded))
}
