package console

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/sluice-io/sluice/internal/redistest"
)

// counters is one replica's cumulative counts, as its metrics hold them.
type counters struct {
	mu sync.Mutex
	m  map[SeriesKey]Totals
}

func (c *counters) add(k SeriesKey, d, x float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.m[k]
	t.Decisions += d
	t.Denials += x
	c.m[k] = t
}

func (c *counters) read() map[SeriesKey]Totals {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.m)
}

// sum adds up one series' points of a chart.
func sum(ch FleetChart, k SeriesKey) (d, x float64, points int) {
	for _, s := range ch.Series {
		if s.SeriesKey == k {
			for _, p := range s.Points {
				d += p.Decisions
				x += p.Denials
			}
			return d, x, len(s.Points)
		}
	}
	return 0, 0, 0
}

// testFleet checks a sink (one per replica, on one store): the charts are
// the sum of every replica's flushed counts, in the bucket of each flush,
// downsampled for the longer ranges; counts leave a range as it passes.
func testFleet(t *testing.T, sinks ...FleetSink) {
	ctx := context.Background()
	t0 := time.Unix(1_800_000_000, 0) // a start of every resolution's bucket
	k1, k2 := SeriesKey{"api", "free"}, SeriesKey{"api", "pro"}
	var cs []*counters
	var fs []*Fleet
	for _, s := range sinks {
		c := &counters{m: map[SeriesKey]Totals{}}
		cs, fs = append(cs, c), append(fs, NewFleet(c.read, s, time.Second, nil))
	}
	flush := func(at time.Time) {
		t.Helper()
		for _, f := range fs {
			if err := f.Flush(ctx, at); err != nil {
				t.Fatal(err)
			}
		}
	}
	flush(t0)
	cs[0].add(k1, 10, 3)
	cs[len(cs)-1].add(k1, 5, 1)
	cs[len(cs)-1].add(k2, 7, 0)
	flush(t0.Add(5 * time.Second))
	cs[0].add(k1, 20, 0)
	flush(t0.Add(25 * time.Second))
	const wantD = 35.0
	now := t0.Add(30 * time.Second)
	for _, r := range Resolutions {
		ch, err := fs[0].Chart(ctx, r, now)
		if err != nil {
			t.Fatal(err)
		}
		d, x, n := sum(ch, k1)
		if d != wantD || x != 4 {
			t.Errorf("%s: %v decisions, %v denials, want %v and 4", r.Name, d, x, wantD)
		}
		if want := int(r.Range/r.Bucket) + 1; n != want {
			t.Errorf("%s: %d points, want %d", r.Name, n, want)
		}
		if d, _, _ := sum(ch, k2); d != 7 {
			t.Errorf("%s: %v decisions of %v, want 7", r.Name, d, k2)
		}
		if ch.Shared != sinks[0].Shared() || ch.BucketMS != r.Bucket.Milliseconds() {
			t.Errorf("%s: %+v", r.Name, ch)
		}
	}
	// The 15-minute chart: one point per 10 s bucket, the flush at t0+25s
	// in the bucket from t0+20s.
	ch, _ := fs[0].Chart(ctx, Resolutions[0], now.Add(time.Second)) // within the cache: the same answer
	for _, s := range ch.Series {
		if s.SeriesKey != k1 {
			continue
		}
		// now (t0+30s) starts a bucket: the last point, empty so far.
		p := s.Points[len(s.Points)-2]
		if p.At != t0.Add(20*time.Second).UnixMilli() || p.Decisions != 20 || s.Points[len(s.Points)-1].Decisions != 0 {
			t.Errorf("the last points: %+v", s.Points[len(s.Points)-2:])
		}
	}
	// 16 minutes on, the counts have left the 15-minute range, not the
	// hour's.
	later := t0.Add(16 * time.Minute)
	if ch, err := fs[0].Chart(ctx, Resolutions[0], later); err != nil || len(ch.Series) != 0 {
		t.Errorf("15m, 16 minutes on: %+v %v", ch.Series, err)
	}
	if ch, err := fs[0].Chart(ctx, Resolutions[1], later); err != nil {
		t.Fatal(err)
	} else if d, _, _ := sum(ch, k1); d != wantD {
		t.Errorf("1h, 16 minutes on: %v decisions", d)
	}
}

func TestMemoryFleet(t *testing.T) { testFleet(t, NewMemoryFleet()) }

// TestMemoryFleetBounded: two days of flushes leave at most
// MaxFleetBuckets buckets.
func TestMemoryFleetBounded(t *testing.T) {
	m := NewMemoryFleet()
	t0 := time.Unix(1_800_000_000, 0)
	for at := t0; at.Before(t0.Add(48 * time.Hour)); at = at.Add(30 * time.Second) {
		if err := m.Add(context.Background(), map[SeriesKey]Totals{{"p", "t"}: {Decisions: 1}}, at); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(m.buckets); n > MaxFleetBuckets {
		t.Fatalf("%d buckets, bound %d", n, MaxFleetBuckets)
	}
}

// TestRedisFleet: two replicas' flushes on one Redis add up, on a Cluster
// too (every bucket shares the hash tag); every bucket expires after its
// range and two buckets.
func TestRedisFleet(t *testing.T) {
	t.Run("standalone", func(t *testing.T) { testRedisFleet(t, []string{redistest.Standalone(t).Addr}) })
	t.Run("cluster", func(t *testing.T) { testRedisFleet(t, redistest.SharedCluster(t).Addrs()) })
}

func testRedisFleet(t *testing.T, addrs []string) {
	cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	prefix := redistest.Prefix(t) + ":{fleet}"
	conn := func() rueidis.Client { return cl }
	a, b := NewRedisFleet(conn, prefix), NewRedisFleet(conn, prefix)
	testFleet(t, a, b)
	at := time.Unix(1_800_000_000, 0).Add(25 * time.Second)
	for _, r := range Resolutions {
		key := a.key(r, bucketOf(at, r.Bucket))
		ttl, err := cl.Do(context.Background(), cl.B().Ttl().Key(key).Build()).AsInt64()
		if err != nil || ttl <= 0 || ttl > int64(r.keep()/time.Second) {
			t.Errorf("%s: TTL %d (%v), want 1 to %d", key, ttl, err, int64(r.keep()/time.Second))
		}
	}
}
