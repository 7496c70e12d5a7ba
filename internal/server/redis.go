package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/guard"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/lease"
	"github.com/sluice-io/sluice/redisstore"
)

// openRedis opens the Redis store a config names. It does not fail when
// Redis is down: the store connects when Redis appears, and the guard
// around it answers by the failure policy meanwhile. The guard, not the
// store, applies the failure policy. Decisions go through a lease.Store,
// which leases the requests with UseLease (policies with `lease: true`)
// and passes the others through.
func openRedis(ctx context.Context, sc config.StoreSection, log *slog.Logger) (sluice.Store, io.Closer, error) {
	// The guard's store calls wait past its deadline for a live node's late
	// reply (guard.Options.LateGrace): the store must not end them first.
	s, err := redisstore.New(ctx, redisstore.Options{
		URL:              sc.URL,
		Timeout:          guard.StoreTimeout(sc.Timeout, 0),
		DisableDenyCache: !sc.LocalCache,
		PlainWindows:     sc.PlainWindows,
		Logger:           log,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("server: open redis store: %w", err)
	}
	l, err := lease.New(lease.Options{Store: s, Instances: max(sc.Instances, 0), Logger: log})
	if err != nil {
		_ = s.Close()
		return nil, nil, fmt.Errorf("server: %w", err)
	}
	if sc.Region != "" {
		return openRegions(ctx, sc, l, s, leaseCloser{l, s}, log) // regions.go
	}
	return l, leaseCloser{l, s}, nil
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
