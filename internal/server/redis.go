package server

import (
	"context"
	"errors"
	"io"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/config"
)

// ErrNoRedis means the config names a Redis store but this build cannot
// open one yet.
var ErrNoRedis = errors.New("server: the redis store is not available in this build")

// openRedis opens the Redis store a config names.
func openRedis(_ context.Context, _ config.StoreSection) (sluice.Store, io.Closer, error) {
	return nil, nil, ErrNoRedis
}
