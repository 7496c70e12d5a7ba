package envoyrls

import (
	"context"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"

	"github.com/sluice-io/sluice/internal/tracing"
)

// traceCheck puts a ShouldRateLimit decision on the call's span: the
// domain as configured (or "_unknown_"), each decided descriptor's
// configured full key ("domain.key_value.subkey", or "domain._override_"
// for a descriptor carrying its own limit) and algorithm, the outcome,
// degraded, the overall code and the number of descriptors. Never a
// descriptor's value: Envoy's values can be API keys. Callers check
// tracing.Recording first.
func traceCheck(ctx context.Context, dom *domainConfig, n int, items []item, resp *rlsv3.RateLimitResponse) {
	domain := unknownDomain
	if dom != nil {
		domain = dom.name
	}
	ds := make([]tracing.Decision, 0, len(items))
	for i := range items {
		it := &items[i]
		if !it.decided {
			continue // unlimited, unmatched or replaced: no store answer
		}
		policy := domain + "." + overrideRule
		if it.rule != nil {
			policy = it.rule.fullKey
		}
		ds = append(ds, tracing.Decision{Policy: policy, Algorithm: it.algo, Shadow: it.shadow, Decision: it.decision})
	}
	tracing.Annotate(ctx, ds)
	tracing.Set(ctx,
		attribute.String("sluice.domain", domain),
		attribute.Int("sluice.descriptors", n),
		attribute.String("sluice.envoy.code", resp.GetOverallCode().String()))
}
