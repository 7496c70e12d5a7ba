package console

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// Resolution is one range of the fleet charts and the bucket it reads:
// every flush adds to the bucket of each resolution, so a longer range is
// downsampled when it is written, not when it is read.
type Resolution struct {
	// Name is how the API names the range: "15m", "1h", "6h", "24h".
	Name string
	// Range is how far back the chart looks; Bucket is one point.
	Range, Bucket time.Duration
}

// Resolutions are the fleet charts' ranges, shortest first: each about 60
// to 90 points.
var Resolutions = []Resolution{
	{"15m", 15 * time.Minute, 10 * time.Second},
	{"1h", time.Hour, time.Minute},
	{"6h", 6 * time.Hour, 5 * time.Minute},
	{"24h", 24 * time.Hour, 20 * time.Minute},
}

// ResolutionOf returns the resolution named name.
func ResolutionOf(name string) (Resolution, bool) {
	for _, r := range Resolutions {
		if r.Name == name {
			return r, true
		}
	}
	return Resolution{}, false
}

// keep is how long a bucket of r is kept: its range and two buckets (the
// one being written and the one the range starts in).
func (r Resolution) keep() time.Duration { return r.Range + 2*r.Bucket }

// MaxFleetBuckets is how many buckets of every resolution a sink holds at
// most: each expires after its resolution's range and two buckets.
var MaxFleetBuckets = func() int {
	n := 0
	for _, r := range Resolutions {
		n += int(r.keep()/r.Bucket) + 1
	}
	return n
}()

// FleetSink keeps every replica's counts per bucket.
type FleetSink interface {
	// Add adds counts of the interval that ended at now.
	Add(ctx context.Context, counts map[SeriesKey]Totals, now time.Time) error
	// Read returns the counts per series of r's buckets from the one
	// holding now-Range to the one holding now, oldest first.
	Read(ctx context.Context, r Resolution, now time.Time) (map[SeriesKey][]Totals, error)
	// Shared reports whether the sink holds the fleet's counts.
	Shared() bool
}

// FleetPoint is one bucket's counts: decisions (checks) and denials.
type FleetPoint struct {
	At        int64   `json:"t"` // the bucket's start, Unix ms
	Decisions float64 `json:"c"`
	Denials   float64 `json:"x"`
}

// FleetSeries is one series of a FleetChart.
type FleetSeries struct {
	SeriesKey
	Points []FleetPoint `json:"points"`
}

// FleetChart is what the console draws for one range.
type FleetChart struct {
	Range    string `json:"range"`
	BucketMS int64  `json:"bucket_ms"`
	// IntervalMS is how often each replica flushes its counts.
	IntervalMS int64         `json:"interval_ms"`
	From       int64         `json:"from"` // Unix ms
	Now        int64         `json:"now"`  // Unix ms
	Shared     bool          `json:"shared"`
	Series     []FleetSeries `json:"series"`
}

// Fleet sends this replica's decision counts to a FleetSink once an
// interval (a pipeline to Redis, never a call per decision: the counts are
// the metrics' counters, read and differenced at each flush), and reads
// the fleet's sums for the charts, at most once a second per range.
type Fleet struct {
	read     func() map[SeriesKey]Totals
	sink     FleetSink
	interval time.Duration
	log      *slog.Logger
	mu       sync.Mutex
	last     map[SeriesKey]Totals
	cache    struct {
		sync.Mutex
		at     map[string]time.Time
		charts map[string]FleetChart
	}
}

// NewFleet flushes the counts read returns into sink every interval.
func NewFleet(read func() map[SeriesKey]Totals, sink FleetSink, interval time.Duration, log *slog.Logger) *Fleet {
	if log == nil {
		log = slog.Default()
	}
	// The counters start at zero with the process: its first flush sends
	// what they counted until then.
	f := &Fleet{read: read, sink: sink, interval: interval, log: log, last: map[SeriesKey]Totals{}}
	f.cache.at, f.cache.charts = map[string]time.Time{}, map[string]FleetChart{}
	return f
}

// Sink returns the sink.
func (f *Fleet) Sink() FleetSink { return f.sink }

// Flush adds the counts since the last flush (the first: since the
// counters started) to the sink; counts a failed Add did not store are
// sent with the next.
func (f *Fleet) Flush(ctx context.Context, now time.Time) error {
	cur := f.read()
	f.mu.Lock()
	defer f.mu.Unlock()
	delta := map[SeriesKey]Totals{}
	for k, t := range cur {
		p := f.last[k]
		d := Totals{Decisions: max(0, t.Decisions-p.Decisions), Denials: max(0, t.Denials-p.Denials)}
		if (d.Decisions > 0 || d.Denials > 0) && len(delta) < maxSeries {
			delta[k] = d
		}
	}
	if len(delta) > 0 {
		if err := f.sink.Add(ctx, delta, now); err != nil {
			return fmt.Errorf("console: fleet counts: %w", err)
		}
	}
	f.last = cur
	return nil
}

// Run flushes every interval until ctx is done.
func (f *Fleet) Run(ctx context.Context) error {
	t := time.NewTicker(f.interval)
	defer t.Stop()
	_ = f.Flush(ctx, time.Now())
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			fctx, cancel := context.WithTimeout(ctx, f.interval)
			err := f.Flush(fctx, now)
			cancel()
			if err != nil {
				f.log.Warn("console: flushing the fleet's counts", "err", err)
			}
		}
	}
}

// chartCache is how long one read of a range serves its callers.
const chartCache = time.Second

// Chart returns the fleet's counts over r at now, reading the sink at most
// once a second per range whoever asks (the endpoint needs no token).
func (f *Fleet) Chart(ctx context.Context, r Resolution, now time.Time) (FleetChart, error) {
	c := &f.cache
	c.Lock()
	defer c.Unlock()
	if at, ok := c.at[r.Name]; ok && !now.Before(at) && now.Sub(at) < chartCache {
		return c.charts[r.Name], nil
	}
	counts, err := f.sink.Read(ctx, r, now)
	if err != nil {
		return FleetChart{}, err
	}
	first := bucketOf(now.Add(-r.Range), r.Bucket)
	out := FleetChart{Range: r.Name, BucketMS: r.Bucket.Milliseconds(), IntervalMS: f.interval.Milliseconds(), From: now.Add(-r.Range).UnixMilli(), Now: now.UnixMilli(),
		Shared: f.sink.Shared(), Series: []FleetSeries{}}
	for k, ts := range counts {
		s := FleetSeries{SeriesKey: k, Points: make([]FleetPoint, len(ts))}
		for i, t := range ts {
			s.Points[i] = FleetPoint{At: (first + int64(i)) * r.Bucket.Milliseconds(), Decisions: t.Decisions, Denials: t.Denials}
		}
		out.Series = append(out.Series, s)
	}
	slices.SortFunc(out.Series, func(a, b FleetSeries) int {
		return strings.Compare(a.Policy+"\x00"+a.Tier, b.Policy+"\x00"+b.Tier)
	})
	c.at[r.Name], c.charts[r.Name] = now, out
	return out, nil
}

// bucketOf is the number of the bucket of size b that holds t.
func bucketOf(t time.Time, b time.Duration) int64 { return t.UnixMilli() / b.Milliseconds() }

// buckets returns the numbers of r's buckets from now-Range to now.
func buckets(r Resolution, now time.Time) (first, last int64) {
	return bucketOf(now.Add(-r.Range), r.Bucket), bucketOf(now, r.Bucket)
}

// field is a series' field in a bucket: "c" (decisions) or "x" (denials),
// the policy and the tier, separated by 0x1f.
func field(kind byte, k SeriesKey) string {
	return string(kind) + "\x1f" + k.Policy + "\x1f" + k.Tier
}

func fromField(f string) (kind byte, k SeriesKey, ok bool) {
	parts := strings.SplitN(f, "\x1f", 3)
	if len(parts) != 3 || len(parts[0]) != 1 {
		return 0, k, false
	}
	return parts[0][0], SeriesKey{Policy: parts[1], Tier: parts[2]}, true
}

// MemoryFleet is the instance's own FleetSink, for the memory store.
type MemoryFleet struct {
	mu      sync.Mutex
	buckets map[memBucket]map[SeriesKey]Totals
}

type memBucket struct {
	res string
	n   int64
}

// NewMemoryFleet returns an empty MemoryFleet.
func NewMemoryFleet() *MemoryFleet {
	return &MemoryFleet{buckets: map[memBucket]map[SeriesKey]Totals{}}
}

// Add implements FleetSink, dropping the buckets past their resolution's
// range.
func (m *MemoryFleet) Add(_ context.Context, counts map[SeriesKey]Totals, now time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range Resolutions {
		oldest := bucketOf(now.Add(-r.keep()), r.Bucket)
		for b := range m.buckets {
			if b.res == r.Name && b.n < oldest {
				delete(m.buckets, b)
			}
		}
		key := memBucket{r.Name, bucketOf(now, r.Bucket)}
		bk := m.buckets[key]
		if bk == nil {
			bk = map[SeriesKey]Totals{}
			m.buckets[key] = bk
		}
		for k, t := range counts {
			if _, ok := bk[k]; !ok && len(bk) >= maxSeries {
				continue
			}
			s := bk[k]
			s.Decisions += t.Decisions
			s.Denials += t.Denials
			bk[k] = s
		}
	}
	return nil
}

// Read implements FleetSink.
func (m *MemoryFleet) Read(_ context.Context, r Resolution, now time.Time) (map[SeriesKey][]Totals, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	first, last := buckets(r, now)
	out := map[SeriesKey][]Totals{}
	for n := first; n <= last; n++ {
		for k, t := range m.buckets[memBucket{r.Name, n}] {
			s := out[k]
			if s == nil {
				s = make([]Totals, last-first+1)
				out[k] = s
			}
			s[n-first] = t
		}
	}
	return out, nil
}

// Shared implements FleetSink: false.
func (m *MemoryFleet) Shared() bool { return false }

// DefaultFleetPrefix is the Redis key prefix of the fleet's counts; its
// hash tag keeps every bucket in one Cluster slot, so one pipeline
// writes or reads them.
const DefaultFleetPrefix = "sluice:{fleet}"

// RedisFleet keeps the fleet's counts in Redis: a hash per resolution and
// bucket (PREFIX:RANGE:BUCKET, fields "c" and "x" per policy and tier,
// HINCRBY by each replica's flush), expiring after its range and two
// buckets. So Redis holds at most MaxFleetBuckets hashes of two fields per
// series, whatever the fleet's size or traffic.
type RedisFleet struct {
	client func() rueidis.Client
	prefix string
}

// NewRedisFleet returns a RedisFleet on the connection client returns (nil
// while there is none); prefix defaults to DefaultFleetPrefix.
func NewRedisFleet(client func() rueidis.Client, prefix string) *RedisFleet {
	if prefix == "" {
		prefix = DefaultFleetPrefix
	}
	return &RedisFleet{client: client, prefix: prefix}
}

func (r *RedisFleet) key(res Resolution, n int64) string {
	return r.prefix + ":" + res.Name + ":" + strconv.FormatInt(n, 10)
}

// Add implements FleetSink: one pipeline, HINCRBY per series and
// resolution, and an EXPIRE per resolution.
func (r *RedisFleet) Add(ctx context.Context, counts map[SeriesKey]Totals, now time.Time) error {
	c := r.client()
	if c == nil {
		return fmt.Errorf("redis not connected")
	}
	keys := slices.SortedFunc(maps.Keys(counts), func(a, b SeriesKey) int {
		return strings.Compare(a.Policy+"\x00"+a.Tier, b.Policy+"\x00"+b.Tier)
	})
	cmds := make(rueidis.Commands, 0, len(Resolutions)*(2*len(keys)+1))
	for _, res := range Resolutions {
		key := r.key(res, bucketOf(now, res.Bucket))
		for _, k := range keys {
			t := counts[k]
			if d := int64(t.Decisions + 0.5); d > 0 {
				cmds = append(cmds, c.B().Hincrby().Key(key).Field(field('c', k)).Increment(d).Build())
			}
			if x := int64(t.Denials + 0.5); x > 0 {
				cmds = append(cmds, c.B().Hincrby().Key(key).Field(field('x', k)).Increment(x).Build())
			}
		}
		cmds = append(cmds, c.B().Expire().Key(key).Seconds(int64(res.keep()/time.Second)).Build())
	}
	for _, res := range c.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			return fmt.Errorf("fleet counts: %w", err)
		}
	}
	return nil
}

// Read implements FleetSink: one pipeline of HGETALL, one per bucket.
func (r *RedisFleet) Read(ctx context.Context, res Resolution, now time.Time) (map[SeriesKey][]Totals, error) {
	c := r.client()
	if c == nil {
		return nil, fmt.Errorf("redis not connected")
	}
	first, last := buckets(res, now)
	cmds := make(rueidis.Commands, 0, last-first+1)
	for n := first; n <= last; n++ {
		cmds = append(cmds, c.B().Hgetall().Key(r.key(res, n)).Build())
	}
	out := map[SeriesKey][]Totals{}
	for i, reply := range c.DoMulti(ctx, cmds...) {
		m, err := reply.AsIntMap()
		if err != nil {
			return nil, fmt.Errorf("fleet counts: %w", err)
		}
		for f, v := range m {
			kind, k, ok := fromField(f)
			if !ok {
				continue
			}
			s := out[k]
			if s == nil {
				if len(out) >= maxSeries {
					continue
				}
				s = make([]Totals, last-first+1)
				out[k] = s
			}
			switch kind {
			case 'c':
				s[i].Decisions += float64(v)
			case 'x':
				s[i].Denials += float64(v)
			}
		}
	}
	return out, nil
}

// Shared implements FleetSink: true.
func (r *RedisFleet) Shared() bool { return true }
