package server

import (
	"context"
	"fmt"
	"io"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/metrics"
	"github.com/sluice-io/sluice/redisstore"
)

// redisStore adapts the Redis store, which applies the timeout, circuit
// breaker and failure policy itself, to SelfGuarded.
type redisStore struct {
	*redisstore.Store
}

// StoreStats implements SelfGuarded.
func (r redisStore) StoreStats() metrics.StoreStats {
	st := r.Stats()
	out := metrics.StoreStats{Calls: st.Calls, Errors: st.Errors, Degraded: st.Degraded, CacheHits: st.CacheHits, CircuitOpens: st.BreakerOpens}
	switch st.Circuit {
	case "open":
		out.Circuit = metrics.CircuitOpen
	case "half_open":
		out.Circuit = metrics.CircuitHalfOpen
	}
	return out
}

// Ping implements SelfGuarded.
func (r redisStore) Ping(ctx context.Context) error {
	c := r.Client()
	return c.Do(ctx, c.B().Ping().Build()).Error()
}

// openRedis opens the Redis store a config names, with its failure policy.
func openRedis(ctx context.Context, sc config.StoreSection) (sluice.Store, io.Closer, error) {
	policy, err := redisstore.ParsePolicy(sc.FailurePolicy)
	if err != nil {
		return nil, nil, fmt.Errorf("server: %w", err)
	}
	s, err := redisstore.New(ctx, redisstore.Options{
		URL:              sc.URL,
		Timeout:          sc.Timeout,
		Policy:           policy,
		Instances:        sc.Instances,
		LocalMaxKeys:     sc.MaxKeys,
		DisableDenyCache: !sc.LocalCache,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("server: open redis store: %w", err)
	}
	return redisStore{s}, s, nil
}
