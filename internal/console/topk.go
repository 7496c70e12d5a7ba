package console

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// Hit is one limited identity under one policy: its denials over the
// window and when it passes again.
type Hit struct {
	// Identity is the identity as the console shows it: a key's name
	// ("key_name:acme") or, for a key the config does not name, "key:"
	// and its SHA-256 (which the look-up takes back); a gateway key's
	// name ("gw_key:acme") or client id ("gw_client:..."); a user id, a
	// check's key; never a raw API key.
	Identity string `json:"identity"`
	// Policy denied it: a policy of the config, or "gateway:" and the
	// gateway's limit ("gateway:rpm", "gateway:team_tpm", "gateway:budget").
	Policy string `json:"policy"`
	// Denies counts its denials in the window: exact unless Sampled.
	Denies float64 `json:"denies"`
	// Sampled reports that Denies is an estimate: in some interval of the
	// window the identity was denied more than Top's exact threshold, and
	// the denials past it were sampled (and scaled back up).
	Sampled bool `json:"sampled"`
	// RetryAt is when its last denial's Retry-After ends, Unix ms: its
	// Retry-After from the flush that sent it (at most FlushInterval
	// after the denial; the decision path reads no clock for it).
	RetryAt int64 `json:"retry_at"`
}

func (h *Hit) member() string { return h.Policy + "|" + h.Identity }

func fromMember(m string) Hit {
	p, id, _ := strings.Cut(m, "|")
	return Hit{Policy: p, Identity: id}
}

// TopSink keeps the denials of every replica, bounded, over Window.
type TopSink interface {
	// Add records a batch of hits at now.
	Add(ctx context.Context, hits []Hit, now time.Time) error
	// Top returns the n identities with the most denials in the Window
	// before now, most first.
	Top(ctx context.Context, n int, now time.Time) ([]Hit, error)
	// Shared reports whether the sink holds the fleet's denials.
	Shared() bool
}

// Bounds of the top-K.
const (
	// maxPending bounds the distinct hits a replica holds between flushes.
	maxPending = 1024
	// maxMembers bounds the members of one minute's set.
	maxMembers = 4096
	// FlushInterval is how often a replica sends its hits.
	FlushInterval = time.Second
)

// TopOptions configure a Top.
type TopOptions struct {
	// Exact is how many denials of one identity under one policy a
	// replica counts one by one in a FlushInterval (at least 1; Config's
	// TopExact). Past them it counts one denial in Sample, as Sample.
	Exact int
	// Sample is the sampling rate past Exact (at least 1, which counts
	// every denial; Config's TopSample).
	Sample int
	// Display, when not nil, turns an observed identity into the one the
	// list shows ("key:HASH" into "key_name:NAME"); called at each flush,
	// once per pending hit, never on the decision path.
	Display func(identity string) string
	// Log receives the flush failures; nil means slog.Default().
	Log *slog.Logger
}

// Top counts denials on the hot path and sends them to a TopSink once a
// FlushInterval. Small counts are exact: each identity's first Exact
// denials under a policy in an interval count one each; past them one
// denial in Sample counts Sample, so that an identity denied m > Exact
// times counts Exact + Sample x Binomial(m-Exact, 1/Sample): unbiased,
// with a standard deviation of sqrt((m-Exact)(Sample-1)), at most
// sqrt(Sample/(m-Exact)) of the count past Exact. Observe costs a read
// lock, a map look-up and two atomic operations per denial, and reads no
// clock (157 ns on a VM's clock source, more than all the rest); a write
// lock only for an identity's first denial of an interval.
type Top struct {
	sink    TopSink
	exact   int64
	sample  uint32
	display func(string) string
	log     *slog.Logger
	// mu guards pending: Observe counts under the read lock (atomics),
	// Flush swaps under the write lock, so no count falls between.
	mu      sync.RWMutex
	pending map[hitKey]*pendingHit
	dropped atomic.Int64
	// read is the last read of the sink, shared by Read's callers.
	read struct {
		sync.Mutex
		at   time.Time
		n    int
		hits []Hit
	}
}

// pendingHit is one identity's denials under one policy since the last
// flush.
type pendingHit struct {
	seen    atomic.Int64 // every denial observed
	sampled atomic.Int64 // the denials past exact that the sample kept
	retry   atomic.Int64 // the last denial's Retry-After, ns
}

// NewTop counts denials into sink.
func NewTop(sink TopSink, o TopOptions) *Top {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &Top{sink: sink, exact: int64(max(1, o.Exact)), sample: uint32(max(1, o.Sample)), display: o.Display, log: o.Log, pending: map[hitKey]*pendingHit{}}
}

// hitKey is a pending hit's key: no string is built per denial.
type hitKey struct{ policy, identity string }

// Sink returns the sink.
func (t *Top) Sink() TopSink { return t.sink }

// Exact is how many denials of an identity under a policy count one by
// one each FlushInterval; Sample is the sampling rate past them.
func (t *Top) Exact() int { return int(t.exact) }

// Sample is the sampling rate past Exact: one denial in Sample counts.
func (t *Top) Sample() int { return int(t.sample) }

// Read returns the n identities with the most denials at now, as the
// sink's Top, reading the sink at most once a FlushInterval: callers at
// once wait for one read, and later ones within the interval get its
// answer. The sink changes only when a replica flushes, and the console's
// readers are whoever reaches the listener, while each read of a Redis
// sink costs Redis work and up to windowMinutes x topPerMinute members.
func (t *Top) Read(ctx context.Context, n int, now time.Time) ([]Hit, error) {
	r := &t.read
	r.Lock()
	defer r.Unlock()
	if r.hits != nil && n <= r.n && !now.Before(r.at) && now.Sub(r.at) < FlushInterval {
		return slices.Clone(r.hits[:min(n, len(r.hits))]), nil
	}
	hits, err := t.sink.Top(ctx, n, now)
	if err != nil {
		return nil, err
	}
	r.at, r.n, r.hits = now, n, hits
	return slices.Clone(hits), nil
}

// Observe records a denial of identity under policy, which asked it to
// retry after retry.
func (t *Top) Observe(identity, policy string, retry time.Duration) {
	k := hitKey{policy, identity}
	t.mu.RLock()
	if h := t.pending[k]; h != nil {
		t.count(h, retry)
		t.mu.RUnlock()
		return
	}
	t.mu.RUnlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.pending[k]
	if h == nil {
		if len(t.pending) >= maxPending {
			t.dropped.Add(1)
			return
		}
		h = &pendingHit{}
		t.pending[k] = h
	}
	t.count(h, retry)
}

// count adds one denial to h: exactly up to t.exact, then one in t.sample.
func (t *Top) count(h *pendingHit, retry time.Duration) {
	if h.seen.Add(1) > t.exact && (t.sample <= 1 || rand.Uint32N(t.sample) == 0) {
		h.sampled.Add(1)
	}
	h.retry.Store(int64(retry))
}

// Flush sends the pending hits.
func (t *Top) Flush(ctx context.Context, now time.Time) error {
	t.mu.Lock()
	if len(t.pending) == 0 {
		t.mu.Unlock()
		return nil
	}
	hits := make([]Hit, 0, len(t.pending))
	for k, h := range t.pending {
		seen, sampled := h.seen.Load(), h.sampled.Load()
		exact := min(seen, t.exact)
		hits = append(hits, Hit{Identity: k.identity, Policy: k.policy, RetryAt: now.Add(time.Duration(h.retry.Load())).UnixMilli(),
			Denies: float64(exact) + float64(sampled)*float64(t.sample), Sampled: seen > t.exact && t.sample > 1})
	}
	clear(t.pending)
	t.mu.Unlock()
	if t.display != nil {
		for i := range hits {
			hits[i].Identity = t.display(hits[i].Identity)
		}
	}
	return t.sink.Add(ctx, hits, now)
}

// Run flushes every FlushInterval until ctx is done.
func (t *Top) Run(ctx context.Context) error {
	tk := time.NewTicker(FlushInterval)
	defer tk.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-tk.C:
			err := t.Flush(ctx, now)
			if err != nil && !failing {
				t.log.Warn("console: cannot record the top limited identities", "err", err)
			}
			failing = err != nil
		}
	}
}

// minute numbers the minute of t, the sets' bucket.
func minute(t time.Time) int64 { return t.Unix() / 60 }

// windowMinutes is the buckets a Top read sums.
const windowMinutes = int64(Window / time.Minute)

// MemoryTop keeps the hits of this instance only.
type MemoryTop struct {
	mu      sync.Mutex
	buckets map[int64]map[string]memHit
	retry   map[string]int64
}

// memHit is one member's denials in one minute.
type memHit struct {
	denies  float64
	sampled bool
}

// NewMemoryTop returns an empty MemoryTop.
func NewMemoryTop() *MemoryTop {
	return &MemoryTop{buckets: map[int64]map[string]memHit{}, retry: map[string]int64{}}
}

// Add implements TopSink.
func (m *MemoryTop) Add(_ context.Context, hits []Hit, now time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := minute(now)
	for b := range m.buckets {
		if b <= cur-windowMinutes {
			delete(m.buckets, b)
		}
	}
	bk := m.buckets[cur]
	if bk == nil {
		bk = map[string]memHit{}
		m.buckets[cur] = bk
	}
	if len(m.retry) > 4*maxMembers {
		clear(m.retry)
	}
	for _, h := range hits {
		k := h.member()
		v, ok := bk[k]
		if !ok && len(bk) >= maxMembers {
			continue
		}
		v.denies += h.Denies
		v.sampled = v.sampled || h.Sampled
		bk[k] = v
		m.retry[k] = max(m.retry[k], h.RetryAt)
	}
	return nil
}

// Top implements TopSink.
func (m *MemoryTop) Top(_ context.Context, n int, now time.Time) ([]Hit, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sum := map[string]memHit{}
	cur := minute(now)
	for b, bk := range m.buckets {
		if b > cur-windowMinutes && b <= cur {
			for k, v := range bk {
				s := sum[k]
				s.denies += v.denies
				s.sampled = s.sampled || v.sampled
				sum[k] = s
			}
		}
	}
	out := make([]Hit, 0, len(sum))
	for k, v := range sum {
		h := fromMember(k)
		h.Denies, h.Sampled, h.RetryAt = v.denies, v.sampled, m.retry[k]
		out = append(out, h)
	}
	return topN(out, n), nil
}

// Shared implements TopSink: false.
func (m *MemoryTop) Shared() bool { return false }

func topN(hits []Hit, n int) []Hit {
	slices.SortFunc(hits, func(a, b Hit) int {
		return cmp.Or(cmp.Compare(b.Denies, a.Denies), cmp.Compare(a.Identity, b.Identity), cmp.Compare(a.Policy, b.Policy))
	})
	return hits[:min(n, len(hits))]
}

// DefaultTopPrefix is the Redis key prefix of the top-K; its hash tag
// keeps every bucket in one Cluster slot, so one pipeline reads them.
const DefaultTopPrefix = "sluice:{topk}"

// RedisTop keeps the fleet's hits in Redis: a sorted set per minute
// (PREFIX:m:MINUTE, member "policy|identity", score the denials), trimmed
// to its maxMembers highest after each batch and expiring after the
// window, a hash of retry times (PREFIX:retry) and one of the last minute
// each member's count was sampled (PREFIX:est) that expire with them. A read sums the highest members of the window's minutes (Top): a
// sliding window rather than a decay, with the same bound.
type RedisTop struct {
	client func() rueidis.Client
	prefix string
}

// NewRedisTop returns a RedisTop on the connection client returns (nil
// while there is none); prefix defaults to DefaultTopPrefix.
func NewRedisTop(client func() rueidis.Client, prefix string) *RedisTop {
	if prefix == "" {
		prefix = DefaultTopPrefix
	}
	return &RedisTop{client: client, prefix: prefix}
}

func (r *RedisTop) bucket(m int64) string { return r.prefix + ":m:" + strconv.FormatInt(m, 10) }

// Add implements TopSink: one pipeline per batch.
func (r *RedisTop) Add(ctx context.Context, hits []Hit, now time.Time) error {
	c := r.client()
	if c == nil {
		return fmt.Errorf("console: top-K: redis not connected")
	}
	cur := minute(now)
	key, retry, est := r.bucket(cur), r.prefix+":retry", r.prefix+":est"
	ttl := int64(Window/time.Second) + 120
	cmds := make(rueidis.Commands, 0, 3*len(hits)+5)
	for i := range hits {
		h := &hits[i]
		cmds = append(cmds,
			c.B().Zincrby().Key(key).Increment(h.Denies).Member(h.member()).Build(),
			c.B().Hset().Key(retry).FieldValue().FieldValue(h.member(), strconv.FormatInt(h.RetryAt, 10)).Build())
		if h.Sampled {
			cmds = append(cmds, c.B().Hset().Key(est).FieldValue().FieldValue(h.member(), strconv.FormatInt(cur, 10)).Build())
		}
	}
	cmds = append(cmds,
		c.B().Zremrangebyrank().Key(key).Start(0).Stop(-maxMembers-1).Build(),
		c.B().Expire().Key(key).Seconds(ttl).Build(),
		c.B().Expire().Key(retry).Seconds(ttl).Build(),
		c.B().Expire().Key(est).Seconds(ttl).Build())
	for _, res := range c.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			return fmt.Errorf("console: top-K: %w", err)
		}
	}
	// The retry hash grows with distinct members; past a bound it is
	// dropped whole (it only tells when identities pass again).
	for _, h := range []string{retry, est} {
		if n, err := c.Do(ctx, c.B().Hlen().Key(h).Build()).AsInt64(); err == nil && n > 4*maxMembers {
			c.Do(ctx, c.B().Del().Key(h).Build())
		}
	}
	return nil
}

// topPerMinute is how many of each minute's highest members a Redis read
// sums: a read costs Redis O(log N + topPerMinute) per minute and sends at
// most windowMinutes x topPerMinute members.
const topPerMinute = 64

// Top implements TopSink. It sums the topPerMinute highest members of each
// of the window's minutes (one pipeline of ZREVRANGE), then reads the
// retry times of the n it answers. Summing whole minutes instead (ZUNION
// of up to windowMinutes x maxMembers identities that callers choose, ~30
// MB of 512-byte ones) held Redis, and with it every decision of the
// fleet, for 0.4 s per read, and anyone who reaches the listener may read.
// An identity counts in a minute where it is among the topPerMinute most
// denied: the list's bound, exact for identities limited steadily.
func (r *RedisTop) Top(ctx context.Context, n int, now time.Time) ([]Hit, error) {
	c := r.client()
	if c == nil {
		return nil, fmt.Errorf("console: top-K: redis not connected")
	}
	if n <= 0 {
		return []Hit{}, nil
	}
	cur := minute(now)
	cmds := make(rueidis.Commands, 0, windowMinutes)
	for m := cur - windowMinutes + 1; m <= cur; m++ {
		cmds = append(cmds, c.B().Zrange().Key(r.bucket(m)).Min("+inf").Max("-inf").Byscore().Rev().Limit(0, topPerMinute).Withscores().Build())
	}
	sum := map[string]float64{}
	for _, res := range c.DoMulti(ctx, cmds...) {
		zs, err := res.AsZScores()
		if err != nil {
			return nil, fmt.Errorf("console: top-K: %w", err)
		}
		for _, z := range zs {
			sum[z.Member] += z.Score
		}
	}
	out := make([]Hit, 0, len(sum))
	for m, v := range sum {
		h := fromMember(m)
		h.Denies = v
		out = append(out, h)
	}
	out = topN(out, n)
	if len(out) == 0 {
		return out, nil
	}
	members := make([]string, len(out))
	for i := range out {
		members[i] = out[i].member()
	}
	res := c.DoMulti(ctx, c.B().Hmget().Key(r.prefix+":retry").Field(members...).Build(),
		c.B().Hmget().Key(r.prefix+":est").Field(members...).Build())
	if vals, err := res[0].ToArray(); err == nil {
		for i := range min(len(vals), len(out)) {
			if v, err := vals[i].AsInt64(); err == nil {
				out[i].RetryAt = v
			}
		}
	}
	// Sampled when a minute of the window was: the hash keeps the last.
	if vals, err := res[1].ToArray(); err == nil {
		for i := range min(len(vals), len(out)) {
			if v, err := vals[i].AsInt64(); err == nil && v > cur-windowMinutes {
				out[i].Sampled = true
			}
		}
	}
	return out, nil
}

// Shared implements TopSink: true.
func (r *RedisTop) Shared() bool { return true }
