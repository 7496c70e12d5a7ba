package envoyrls

import (
	"context"
	"errors"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/guard"
	"github.com/sluice-io/sluice/internal/redistest"
)

// downStore fails every call, as an unreachable Redis does.
type downStore struct{ sluice.Store }

var errDown = errors.New("dial tcp: connection refused")

func (downStore) Apply(context.Context, sluice.Op, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, errDown
}

func (downStore) ApplyAll(context.Context, sluice.Op, []sluice.Request) ([]sluice.Decision, error) {
	return nil, errDown
}

// TestDegradedAnswers: while the store is down, a failure policy's answer
// carries sluice-degraded naming the policy (with or without the rate-limit
// headers), a fail_closed denial is OVER_LIMIT, and the error policy is a
// gRPC error (UNAVAILABLE on the wire) for Envoy's failure_mode_deny to
// decide.
func TestDegradedAnswers(t *testing.T) {
	for _, c := range []struct {
		policy  guard.Policy
		code    rlsv3.RateLimitResponse_Code
		headers bool
	}{
		{guard.FailClosed, rlsv3.RateLimitResponse_OVER_LIMIT, false},
		{guard.FailOpen, rlsv3.RateLimitResponse_OK, true},
		{guard.Local, rlsv3.RateLimitResponse_OK, false},
		{guard.ReturnError, 0, false},
	} {
		t.Run(c.policy.String(), func(t *testing.T) {
			factory := func(t *testing.T, clk *clock.Fake) sluice.Store {
				g, err := guard.New(downStore{memStore(t, clk)}, guard.Options{Policy: c.policy, Timeout: -1, Clock: clk})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { g.Close() })
				// Wait for the probe to open the circuit: under local, a
				// call that fails while its node still counts as working
				// is denied rather than spent locally.
				if !redistest.PollUntil(time.Now().Add(10*time.Second), func() bool { return g.Stats().Open != 0 }) {
					t.Fatal("the probe did not open the circuit")
				}
				return g
			}
			e := newEnv(t, factory, "testdata/config", func(o *Options) { o.ResponseHeaders = c.headers })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "test-domain", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key3", "h")}})
			if c.policy == guard.ReturnError {
				if status.Code(err) != codes.Unavailable {
					t.Fatalf("error policy: %v, %v; want UNAVAILABLE", resp, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetOverallCode() != c.code {
				t.Errorf("code %v, want %v", resp.GetOverallCode(), c.code)
			}
			got := ""
			for _, h := range resp.GetResponseHeadersToAdd() {
				if h.GetKey() == DegradedHeader {
					got = h.GetValue()
				}
			}
			if got != c.policy.String() {
				t.Errorf("%s = %q, want %q (headers %v)", DegradedHeader, got, c.policy, resp.GetResponseHeadersToAdd())
			}
		})
	}
}
