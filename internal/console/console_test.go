package console

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// TestRedisTopReadsBounded: a read of the top list takes at most
// topPerMinute members of each minute from Redis, not the window's whole
// union. The page refreshes it every few seconds and anyone who reaches
// the listener may ask for it; full minute sets of long identities (15 x
// 4096 members of ~520 bytes, which callers choose) made each read a
// ZUNION of 32 MB that held Redis for 0.4 s, to show 20. An identity
// limited in every minute still sums them all.
func TestRedisTopReadsBounded(t *testing.T) {
	srv := redistest.NewStandalone(t)
	cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	sink := NewRedisTop(func() rueidis.Client { return cl }, redistest.Prefix(t)+":{topk}")
	now := time.Unix(1_800_000_000, 0)
	long := strings.Repeat("x", 500)
	for m := range windowMinutes {
		at := now.Add(time.Duration(m-windowMinutes+1) * time.Minute)
		for b := range maxMembers / maxPending {
			hits := make([]Hit, maxPending)
			for i := range hits {
				hits[i] = Hit{Identity: fmt.Sprintf("user:%d:%d:%d:%s", m, b, i, long), Policy: "api", Denies: 1, RetryAt: 1}
			}
			if b == 0 {
				hits[1] = Hit{Identity: "tenant:steady", Policy: "api", Denies: 2, RetryAt: 3}
			}
			if m == windowMinutes-1 && b == 0 {
				hits[0] = Hit{Identity: "tenant:hot", Policy: "api", Denies: 100, RetryAt: 7}
			}
			if err := sink.Add(ctx, hits, at); err != nil {
				t.Fatal(err)
			}
		}
	}
	sent := func() int64 {
		info, err := srv.Info(ctx, "stats")
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(info["total_net_output_bytes"], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := sent()
	top, err := sink.Top(ctx, 20, now)
	if err != nil {
		t.Fatal(err)
	}
	// At most topPerMinute members of ~530 bytes a minute; the INFO
	// reply in between counts too, a few KiB.
	if got, most := sent()-before, int64(windowMinutes*topPerMinute*600); got > most {
		t.Errorf("one read of 20 hits took %d bytes from Redis, more than %d", got, most)
	}
	if len(top) != 20 || top[0].Identity != "tenant:hot" || top[0].Denies != 100 || top[0].RetryAt != 7 ||
		top[1].Identity != "tenant:steady" || top[1].Denies != float64(2*windowMinutes) || top[1].RetryAt != 3 || top[2].Denies != 1 {
		t.Fatalf("top: %.300v", top[:min(3, len(top))])
	}
}

// countingSink counts the reads of a sink.
type countingSink struct {
	TopSink
	reads atomic.Int64
}

func (c *countingSink) Top(ctx context.Context, n int, now time.Time) ([]Hit, error) {
	c.reads.Add(1)
	return c.TopSink.Top(ctx, n, now)
}

// TestTopReadShared: the console's readers (anyone who reaches the
// listener) share one read of the sink per FlushInterval, however many
// ask at once: the sink changes only when a replica flushes, and each
// read of a Redis sink costs Redis work and bytes.
func TestTopReadShared(t *testing.T) {
	ctx := context.Background()
	sink := &countingSink{TopSink: NewMemoryTop()}
	tops := NewTop(sink, 1, nil)
	now := time.Unix(1_800_000_000, 0)
	tops.Observe("tenant:a", "api", 1)
	if err := tops.Flush(ctx, now); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if top, err := tops.Read(ctx, 20, now); err != nil || len(top) != 1 || top[0].Identity != "tenant:a" {
				t.Errorf("read: %+v %v", top, err)
			}
		})
	}
	wg.Wait()
	if n := sink.reads.Load(); n != 1 {
		t.Fatalf("50 readers at once: %d reads of the sink", n)
	}
	// A hit flushed meanwhile shows from the next FlushInterval on.
	tops.Observe("tenant:b", "api", 1)
	if err := tops.Flush(ctx, now); err != nil {
		t.Fatal(err)
	}
	if top, _ := tops.Read(ctx, 20, now.Add(FlushInterval-1)); len(top) != 1 || sink.reads.Load() != 1 {
		t.Fatalf("within the interval: %+v, %d reads", top, sink.reads.Load())
	}
	if top, _ := tops.Read(ctx, 20, now.Add(FlushInterval)); len(top) != 2 || sink.reads.Load() != 2 {
		t.Fatalf("after the interval: %+v, %d reads", top, sink.reads.Load())
	}
	// A longer list than the one read is read again; a shorter one is cut.
	if top, _ := tops.Read(ctx, 1, now.Add(FlushInterval)); len(top) != 1 || sink.reads.Load() != 2 {
		t.Fatalf("shorter: %+v, %d reads", top, sink.reads.Load())
	}
	if top, _ := tops.Read(ctx, 30, now.Add(FlushInterval)); len(top) != 2 || sink.reads.Load() != 3 {
		t.Fatalf("longer: %+v, %d reads", top, sink.reads.Load())
	}
}
