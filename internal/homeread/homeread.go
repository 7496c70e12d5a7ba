// Package homeread reads global keys' state at their home region for
// status answers (the gateway's and `sluice serve`'s /v1/status), and
// keeps each read a moment, shared by every caller.
//
// Outside a global key's home, a region decides it from its share, and a
// peek of the share says only what this region holds. A status answer
// reads the home's state too (region.Store's PeekHome, across regions:
// for the answer, never for admission) and answers what this region can
// still spend: what the home has left plus this region's share
// (SourceHome). What other regions hold in their shares is not counted:
// they alone can spend it (a window's share until its window ends, a
// bucket's until it is spent or flows back), nor a fetch in flight
// (charged at home, not yet credited to the share): the answer is low by
// at most those, never high. When the home does not answer within the
// timeout the answer keeps the share's figure, and says so
// (SourceShare).
//
// The home's answer is kept per store key for Options.Reuse, shared by
// every caller of that key on this instance, and concurrent callers wait
// for the one read in flight: a flood of status calls costs the home at
// most one read per global key per Reuse per instance, and a home that
// does not answer costs each call no more than one timeout per Reuse (a
// failure is kept as long). At most Options.MaxKeys keys are kept; past
// them a call answers the share's figure.
package homeread

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/region"
)

// Defaults of Options.
const (
	DefaultReuse   = time.Second
	DefaultTimeout = time.Second
	DefaultMaxKeys = 4096
)

// The remaining_source of a global row of a status answer.
const (
	// SourceHome means the remaining counts the home's remaining (plus,
	// outside the home, this region's share).
	SourceHome = "home"
	// SourceShare means the remaining is this region's share alone: the
	// home did not answer in time.
	SourceShare = "share"
)

// Options configure a Cache.
type Options struct {
	// Reuse is how long a home's answer (or failure) is kept per key;
	// zero is DefaultReuse.
	Reuse time.Duration
	// Timeout bounds one read at a home; zero is DefaultTimeout.
	Timeout time.Duration
	// MaxKeys bounds the keys kept; zero is DefaultMaxKeys.
	MaxKeys int
	// Now is the clock the kept answers age by; nil is time.Now.
	Now func() time.Time
}

// Cache keeps the homes' answers per store key. The zero value and nil
// read nothing; New makes one that reads. It is safe for concurrent use.
type Cache struct {
	rs      *region.Store
	reuse   time.Duration
	maxKeys int
	now     func() time.Time
	timeout atomic.Int64 // ns

	mu sync.Mutex
	m  map[string]*read
}

// read is one read of a key's state at its home; d and err are set
// before done is closed, at under Cache.mu.
type read struct {
	done chan struct{}
	at   time.Time
	d    sluice.Decision
	err  error
}

// New returns a Cache reading at the homes of rs's global keys; with rs
// nil (no regions) it reads nothing.
func New(rs *region.Store, o Options) *Cache {
	if o.Reuse <= 0 {
		o.Reuse = DefaultReuse
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxKeys <= 0 {
		o.MaxKeys = DefaultMaxKeys
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	c := &Cache{rs: rs, reuse: o.Reuse, maxKeys: o.MaxKeys, now: o.Now, m: map[string]*read{}}
	c.timeout.Store(int64(o.Timeout))
	return c
}

// Enabled reports whether c reads at homes: it was made by New over a
// region.Store.
func (c *Cache) Enabled() bool { return c != nil && c.rs != nil }

// SetTimeout changes the bound of the reads started from now on.
func (c *Cache) SetTimeout(d time.Duration) { c.timeout.Store(int64(d)) }

func (r *read) finished() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// Get returns the home's decision for req's key (an OpPeek there of cost
// 0, whatever req's: one answer serves every caller of the key), read
// now or at most Reuse ago, and whether there is one: false when c reads
// nothing, the key has no home (regional or asynchronous), the home did
// not answer within Timeout, MaxKeys are kept, or ctx ended first.
func (c *Cache) Get(ctx context.Context, req sluice.Request) (sluice.Decision, bool) {
	if !c.Enabled() {
		return sluice.Decision{}, false
	}
	req.Cost = 0
	t := c.now()
	c.mu.Lock()
	e := c.m[req.Key]
	if e != nil && (!e.finished() || c.fresh(e, t)) {
		c.mu.Unlock()
		select {
		case <-e.done:
			return e.d, e.err == nil
		case <-ctx.Done():
			return sluice.Decision{}, false
		}
	}
	if e == nil && len(c.m) >= c.maxKeys {
		for k, v := range c.m {
			if v.finished() && !c.fresh(v, t) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= c.maxKeys {
			c.mu.Unlock()
			return sluice.Decision{}, false
		}
	}
	e = &read{done: make(chan struct{})}
	c.m[req.Key] = e
	c.mu.Unlock()
	// Not the caller's deadline: others may wait for this read.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(c.timeout.Load()))
	d, err := c.rs.PeekHome(rctx, req)
	cancel()
	c.mu.Lock()
	e.d, e.err, e.at = d, err, c.now()
	c.mu.Unlock()
	close(e.done)
	return d, err == nil
}

// fresh reports whether finished read e, at t, is within Reuse. c.mu is
// held.
func (c *Cache) fresh(e *read, t time.Time) bool {
	return t.Sub(e.at) < c.reuse && !t.Before(e.at)
}

// Merge is what a status answers for a global key decided d from this
// region's share for a request of cost, with hd the home's decision for
// the key (Get's): the home's remaining added to the share's (at most
// capacity), the home's reset time, and admitted when the share admits
// or the home has cost left (a check here would wait for a fetch from
// it); a denial keeps the share's retry time.
func Merge(d, hd sluice.Decision, cost, capacity int64) sluice.Decision {
	d.Remaining = min(max(d.Remaining, 0)+max(hd.Remaining, 0), capacity)
	d.ResetAfter = hd.ResetAfter
	d.Allowed = d.Allowed || hd.Remaining >= cost
	if d.Allowed {
		d.RetryAfter = 0
	}
	return d
}
