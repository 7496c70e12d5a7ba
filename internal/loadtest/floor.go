package loadtest

import (
	"context"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// EmptyRLS is Envoy's RateLimitService deciding nothing: every check is
// answered OVERALL OK with one OK status per descriptor, and no store is
// asked. Served on sluice's own gRPC server (envoyrls.NewGRPCServerFor),
// its CPU per request is the gRPC floor that the Envoy benchmarks measure
// sluice against (cmd/rlsfloor, BenchmarkEnvoyShouldRateLimit).
type EmptyRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

// ShouldRateLimit answers OK, with one OK status per descriptor.
func (EmptyRLS) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	n := len(req.GetDescriptors())
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	sts := make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
	for i := range sts {
		sts[i].Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = &sts[i]
	}
	return resp, nil
}
