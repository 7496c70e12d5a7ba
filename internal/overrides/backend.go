package overrides

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/rueidis"
)

// Backend keeps the overrides. Implementations are safe for concurrent
// use.
type Backend interface {
	// Load returns every override and the version they are at.
	Load(ctx context.Context) ([]Override, int64, error)
	// Version returns the version, which every change moves; a cheap call.
	Version(ctx context.Context) (int64, error)
	// Put stores o under o.ID(), returning the override it replaced (nil
	// for none). It errs with ErrFull past MaxOverrides or MaxWildcards,
	// counted in the store itself (not in a replica's snapshot, which may
	// be stale), so that the bounds hold for the fleet.
	Put(ctx context.Context, o Override) (*Override, error)
	// Delete removes the override id, returning it, or ErrNotFound.
	Delete(ctx context.Context, id string) (*Override, error)
	// Shared reports whether every replica sees the same overrides.
	Shared() bool
}

// Memory keeps overrides in the process: each instance has its own.
type Memory struct {
	mu      sync.Mutex
	m       map[string]Override
	version int64
}

// NewMemory returns an empty Memory backend.
func NewMemory() *Memory { return &Memory{m: map[string]Override{}} }

// Load implements Backend.
func (b *Memory) Load(context.Context) ([]Override, int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Override, 0, len(b.m))
	for _, o := range b.m {
		out = append(out, o)
	}
	return out, b.version, nil
}

// Version implements Backend.
func (b *Memory) Version(context.Context) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.version, nil
}

// Put implements Backend.
func (b *Memory) Put(_ context.Context, o Override) (*Override, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	old, ok := b.m[o.ID()]
	if !ok {
		if len(b.m) >= MaxOverrides {
			return nil, fmt.Errorf("%w: at most %d", ErrFull, MaxOverrides)
		}
		if o.Wildcard() {
			wild := 0
			for _, x := range b.m {
				if x.Wildcard() {
					wild++
				}
			}
			if wild >= MaxWildcards {
				return nil, fmt.Errorf("%w: at most %d with '*'", ErrFull, MaxWildcards)
			}
		}
	}
	b.m[o.ID()] = o
	b.version++
	if !ok {
		return nil, nil
	}
	return &old, nil
}

// Delete implements Backend.
func (b *Memory) Delete(_ context.Context, id string) (*Override, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	old, ok := b.m[id]
	if !ok {
		return nil, ErrNotFound
	}
	delete(b.m, id)
	b.version++
	return &old, nil
}

// Shared implements Backend: false, each instance has its own.
func (b *Memory) Shared() bool { return false }

//go:embed lua/change.lua
var changeSrc string

var changeScript = rueidis.NewLuaScript(changeSrc)

// DefaultPrefix is the Redis key prefix of the overrides; its hash tag
// keeps the hash and the version in one Cluster slot.
const DefaultPrefix = "sluice:{overrides}"

// Redis keeps overrides in a Redis hash (PREFIX:set, field ID, value JSON)
// beside a version counter (PREFIX:version) that every change increments
// in the same script.
type Redis struct {
	client  func() rueidis.Client
	set     string
	version string
}

// NewRedis returns a Redis backend. client returns the connection, or nil
// while there is none; prefix defaults to DefaultPrefix and must hold a
// hash tag for Cluster.
func NewRedis(client func() rueidis.Client, prefix string) *Redis {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return &Redis{client: client, set: prefix + ":set", version: prefix + ":version"}
}

func (b *Redis) conn() (rueidis.Client, error) {
	c := b.client()
	if c == nil {
		return nil, fmt.Errorf("%w: not connected", ErrUnavailable)
	}
	return c, nil
}

// Load implements Backend: the version, then the hash, so that a change
// between the two is seen again at the next poll.
func (b *Redis) Load(ctx context.Context) ([]Override, int64, error) {
	c, err := b.conn()
	if err != nil {
		return nil, 0, err
	}
	v, err := b.Version(ctx)
	if err != nil {
		return nil, 0, err
	}
	m, err := c.Do(ctx, c.B().Hgetall().Key(b.set).Build()).AsStrMap()
	if err != nil {
		return nil, 0, fmt.Errorf("%w: HGETALL: %w", ErrUnavailable, err)
	}
	out := make([]Override, 0, len(m))
	for id, raw := range m {
		var o Override
		if err := json.Unmarshal([]byte(raw), &o); err != nil || o.ID() != id {
			continue // not ours, or damaged: skipped, never trusted
		}
		out = append(out, o)
	}
	return out, v, nil
}

// Version implements Backend.
func (b *Redis) Version(ctx context.Context) (int64, error) {
	c, err := b.conn()
	if err != nil {
		return 0, err
	}
	v, err := c.Do(ctx, c.B().Get().Key(b.version).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("%w: GET version: %w", ErrUnavailable, err)
	}
	return v, nil
}

// Put implements Backend.
func (b *Redis) Put(ctx context.Context, o Override) (*Override, error) {
	raw, err := json.Marshal(o)
	if err != nil {
		return nil, fmt.Errorf("overrides: encode: %w", err)
	}
	wild := "0"
	if o.Wildcard() {
		wild = "1"
	}
	return b.change(ctx, o.ID(), string(raw), wild)
}

// Delete implements Backend.
func (b *Redis) Delete(ctx context.Context, id string) (*Override, error) {
	return b.change(ctx, id, "", "0")
}

func (b *Redis) change(ctx context.Context, id, raw, wild string) (*Override, error) {
	c, err := b.conn()
	if err != nil {
		return nil, err
	}
	res := changeScript.Exec(ctx, c, []string{b.set, b.version},
		[]string{id, raw, fmt.Sprint(MaxOverrides), wild, fmt.Sprint(MaxWildcards)})
	if err := res.Error(); err != nil {
		if re, ok := rueidis.IsRedisErr(err); ok && strings.HasPrefix(re.Error(), "FULL") {
			return nil, fmt.Errorf("%w: %s", ErrFull, strings.TrimPrefix(re.Error(), "FULL "))
		}
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	arr, err := res.ToArray()
	if err != nil || len(arr) != 2 {
		return nil, fmt.Errorf("%w: unexpected reply", ErrUnavailable)
	}
	old, err1 := arr[0].ToString()
	v, err2 := arr[1].AsInt64()
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("%w: unexpected reply: %w", ErrUnavailable, err)
	}
	if v < 0 {
		return nil, ErrNotFound
	}
	if old == "" {
		return nil, nil
	}
	var o Override
	if err := json.Unmarshal([]byte(old), &o); err != nil {
		return nil, nil // the old value was damaged; it is gone now
	}
	return &o, nil
}

// Shared implements Backend: true.
func (b *Redis) Shared() bool { return true }
