package gateway

import (
	"context"
	"encoding/json"

	"go.opentelemetry.io/otel/attribute"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/tracing"
)

// The request span's attributes follow OpenTelemetry's GenAI semantic
// conventions (gen_ai.*) where they have one, and sluice's decision
// attributes (sluice.policy, sluice.outcome, sluice.degraded) as the
// service's and the Envoy service's spans carry them. A model the client
// names is recorded as its metric label (a configured model or "other"):
// the client's string may hold anything.

// genAIOperation is gen_ai.operation.name for an endpoint.
func genAIOperation(ep endpoint) string {
	switch ep {
	case epCompletions:
		return "text_completion"
	case epEmbeddings:
		return "embeddings"
	case epCountTokens:
		return "count_tokens"
	}
	return "chat" // chat completions, responses, messages
}

// genAIProvider is gen_ai.provider.name (and the older gen_ai.system).
func genAIProvider(ep endpoint) string {
	if ep.anthropic() {
		return "anthropic"
	}
	return "openai"
}

// traceRequest puts what the client asked for on the request's span: the
// operation, the provider, the model's label, the completion budget named
// and whether it streams. Callers check tracing.Recording first.
func traceRequest(ctx context.Context, c *call) {
	attrs := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", genAIOperation(c.ep)),
		attribute.String("gen_ai.provider.name", genAIProvider(c.ep)),
		attribute.String("gen_ai.system", genAIProvider(c.ep)),
		attribute.String("gen_ai.request.model", c.model),
		attribute.Bool("sluice.gateway.stream", c.stream),
	}
	if c.maxTokens > 0 {
		attrs = append(attrs, attribute.Int64("gen_ai.request.max_tokens", c.maxTokens))
	}
	tracing.Set(ctx, attrs...)
}

// traceAdmit puts an admission decision on the request's span: the tier,
// the model's metric label (a configured model or "other", never the
// client's string), the limits decided (sluice.policy: tier/limit, such as
// "pro/tpm" or "pro/team_budget"), the outcome (sluice.outcome: allowed or
// denied; sluice.gateway.outcome: admitted, limited, too_large or
// store_error) and whether a failure policy answered instead of the store.
// Never the client's key. Callers check tracing.Recording first.
func traceAdmit(ctx context.Context, c *call, outcome string, ds []sluice.Decision) {
	degraded := false
	for _, d := range ds {
		degraded = degraded || d.Degraded
	}
	policies := make([]string, 0, len(c.specs))
	for _, s := range c.specs {
		p := c.client.tier.name + "/" + s.reason()
		if s.model != "" {
			p += "@" + s.model
		}
		policies = append(policies, p)
	}
	result := "denied"
	if outcome == "admitted" {
		result = "allowed"
	}
	tracing.Set(ctx,
		attribute.String("sluice.tier", c.client.tier.name),
		attribute.String("sluice.model", c.model),
		attribute.StringSlice("sluice.policy", policies),
		attribute.String("sluice.outcome", result),
		attribute.String("sluice.gateway.outcome", outcome),
		attribute.Bool("sluice.degraded", degraded))
}

// traceResponse puts what the upstream answered on the request's span, as
// the handler returns: the model that answered (its label, as for the
// request) and the tokens the upstream reported. Callers check
// tracing.Recording first.
func (g *Gateway) traceResponse(ctx context.Context, c *call) {
	if c.respModel == "" && c.captured != nil {
		var body struct {
			Model string `json:"model"`
		}
		if json.Unmarshal(c.captured, &body) == nil {
			c.respModel = body.Model
		}
	}
	c.readCapturedUsage() // settle's first step; it reads once
	var attrs []attribute.KeyValue
	if c.respModel != "" {
		attrs = append(attrs, attribute.String("gen_ai.response.model", g.modelLabel(c.respModel)))
	}
	if c.usageSeen {
		in, out := c.prompt, c.completion
		if c.ep.anthropic() {
			in = addSat(addSat(c.anth.input, c.anth.cacheCreation), c.anth.cacheRead) // unweighted
		}
		attrs = append(attrs, attribute.Int64("gen_ai.usage.input_tokens", in), attribute.Int64("gen_ai.usage.output_tokens", out))
	}
	if c.status != 0 {
		attrs = append(attrs, attribute.Int("sluice.gateway.upstream_status", c.status))
	}
	tracing.Set(ctx, attrs...)
}

// modelLabel is a model's label: the model when it is configured, or a
// snapshot of one (gpt-4o-2024-08-06 of gpt-4o), else "other".
func (g *Gateway) modelLabel(m string) string {
	if g.models[m] || g.models[modelBase(m)] {
		return m
	}
	return "other"
}
