package server

import "github.com/sluice-io/sluice/internal/tracing"

// traceDecisions lists an outcome's decisions for the request's span
// (policy and algorithm names, never keys).
func traceDecisions(out *outcome) []tracing.Decision {
	ds := make([]tracing.Decision, len(out.targets))
	for i, t := range out.targets {
		ds[i] = tracing.Decision{Policy: t.policy.Name, Algorithm: t.req.Algorithm, Shadow: t.policy.Shadow, Decision: out.decisions[i]}
	}
	return ds
}
