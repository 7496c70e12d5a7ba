package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/lease"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/redisstore"
)

// OpenStore opens the store that the `store:` section names: the memory
// store, or Redis with the error policy, so that a Redis outage answers
// 503 instead of silently enforcing per-replica limits. Its local
// over-limit cache is off: a token limit denied for one request's cost may
// still admit a smaller one. Redis is wrapped in a lease.Store, which
// leases the limits of tiers with `lease: true` and passes the rest
// through. Close the returned Closer when done.
func OpenStore(ctx context.Context, sc StoreConfig, log *slog.Logger) (sluice.Store, io.Closer, error) {
	if sc.URL == "" || sc.URL == "memory" {
		st, err := memstore.New(memstore.Options{MaxKeys: sc.MaxKeys})
		if err != nil {
			return nil, nil, fmt.Errorf("gateway: store: %w", err)
		}
		return st, st, nil
	}
	st, err := redisstore.New(ctx, redisstore.Options{
		URL: sc.URL, Timeout: sc.Timeout, DisableDenyCache: true, Logger: log,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("gateway: store: %w", err)
	}
	// Leased tiers' requests carry UseLease; the others pass through.
	l, err := lease.New(lease.Options{Store: st, CallTimeout: sc.Timeout, Logger: log})
	if err != nil {
		_ = st.Close()
		return nil, nil, fmt.Errorf("gateway: store: %w", err)
	}
	return l, leaseCloser{l, st}, nil
}

// leaseCloser gives leased capacity back, then closes the Redis store.
type leaseCloser struct {
	l *lease.Store
	s *redisstore.Store
}

func (c leaseCloser) Close() error {
	_ = c.l.Close()
	return c.s.Close()
}
