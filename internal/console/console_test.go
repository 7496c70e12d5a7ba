package console

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/sluice-io/sluice/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func TestSeries(t *testing.T) {
	totals := map[SeriesKey]Totals{}
	s := NewSeries(func() map[SeriesKey]Totals {
		out := map[SeriesKey]Totals{}
		for k, v := range totals {
			out[k] = v
		}
		return out
	}, time.Second)
	t0 := time.Unix(1000, 0)
	k := SeriesKey{"api", "free"}
	s.Sample(t0)
	totals[k] = Totals{Decisions: 10, Denials: 4}
	s.Sample(t0.Add(2 * time.Second))
	got := s.Snapshot()
	if len(got) != 1 || len(got[0].Points) != 1 || got[0].Points[0].Decisions != 5 || got[0].Points[0].Denials != 2 {
		t.Fatalf("rates: %+v", got)
	}
	for i := range 2000 { // bounded to Window/interval points
		s.Sample(t0.Add(time.Duration(3+i) * time.Second))
	}
	if n := len(s.Snapshot()[0].Points); n != int(Window/time.Second) {
		t.Fatalf("%d points kept", n)
	}
}

func TestConfigBounds(t *testing.T) {
	c := Config{Enabled: true}
	if err := c.Validate(); err != nil || c.SampleInterval != DefaultSampleInterval || c.TopSample != DefaultTopSample {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	for _, bad := range []Config{{SampleInterval: time.Millisecond}, {SampleInterval: time.Hour}, {TopSample: -1}, {TopSample: 1 << 21}} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// testTop checks a sink: counts add up across batches (and, for Redis,
// across replicas), the list is sorted and bounded, retry times kept.
func testTop(t *testing.T, sinks ...TopSink) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	for i, s := range sinks {
		tops := NewTop(s, 1, nil)
		for j := range 5 {
			tops.Observe("user:"+strconv.Itoa(j), "api", now.UnixMilli()+int64(i))
		}
		for range 10 {
			tops.Observe("tenant:hot", "api", now.UnixMilli()+5000)
		}
		if err := tops.Flush(ctx, now.Add(time.Duration(i)*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	top, err := sinks[0].Top(ctx, 3, now.Add(time.Duration(len(sinks))*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	want := float64(10 * len(sinks))
	if len(top) != 3 || top[0].Identity != "tenant:hot" || top[0].Denies != want || top[0].RetryAt != now.UnixMilli()+5000 || top[1].Denies != float64(len(sinks)) {
		t.Fatalf("top: %+v", top)
	}
	// Past the window, nothing.
	if top, _ := sinks[0].Top(ctx, 3, now.Add(Window+time.Duration(len(sinks))*time.Minute)); len(top) != 0 {
		t.Fatalf("after the window: %+v", top)
	}
}

func TestMemoryTop(t *testing.T) { testTop(t, NewMemoryTop()) }

// TestRedisTop: two replicas' sinks on one Redis add up.
func TestRedisTop(t *testing.T) {
	t.Run("standalone", func(t *testing.T) { testRedisTop(t, []string{redistest.Standalone(t).Addr}) })
	// Every minute's set shares the hash tag: ZUNION reads them in one slot.
	t.Run("cluster", func(t *testing.T) { testRedisTop(t, redistest.SharedCluster(t).Addrs()) })
}

func testRedisTop(t *testing.T, addrs []string) {
	cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	prefix := redistest.Prefix(t) + ":{topk}"
	conn := func() rueidis.Client { return cl }
	testTop(t, NewRedisTop(conn, prefix), NewRedisTop(conn, prefix))
}

func TestTopBounded(t *testing.T) {
	tops := NewTop(NewMemoryTop(), 1, nil)
	for i := range maxPending + 10 {
		tops.Observe("u"+strconv.Itoa(i), "p", 0)
	}
	if len(tops.pending) != maxPending || tops.dropped.Load() != 10 {
		t.Fatalf("pending %d dropped %d", len(tops.pending), tops.dropped.Load())
	}
}

// BenchmarkObserve is the top-K's cost per denial on the hot path, with
// the default sample: compare it with a decision's CPU
// (BenchmarkTopKOverhead in internal/server, ~6500 ns per denied HTTP
// decision).
func BenchmarkObserve(b *testing.B) {
	tops := NewTop(NewMemoryTop(), DefaultTopSample, nil)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if tops.Sampled() {
				tops.Observe("user:42", "api", 0)
			}
		}
	})
}
