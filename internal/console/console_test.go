package console

import (
	"context"
	"fmt"
	"math"
	"runtime"
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
	if err := c.Validate(); err != nil || c.SampleInterval != DefaultSampleInterval || c.TopSample != DefaultTopSample || c.TopExact != DefaultTopExact {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	for _, bad := range []Config{{SampleInterval: time.Millisecond}, {SampleInterval: time.Hour}, {TopSample: -1}, {TopSample: 1 << 21}, {TopExact: -1}, {TopExact: 1 << 21}} {
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
		tops := NewTop(s, TopOptions{Sample: 1})
		for j := range 5 {
			tops.Observe("user:"+strconv.Itoa(j), "api", time.Duration(i)*time.Millisecond)
		}
		for range 10 {
			tops.Observe("tenant:hot", "api", 5*time.Second)
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
	if len(top) != 3 || top[0].Identity != "tenant:hot" || top[0].Denies != want || top[0].RetryAt != now.Add(time.Duration(len(sinks)-1)*time.Minute+5*time.Second).UnixMilli() || top[1].Denies != float64(len(sinks)) {
		t.Fatalf("top: %+v", top)
	}
	if top[0].Sampled || top[1].Sampled {
		t.Fatalf("exact counts marked sampled: %+v", top)
	}
	// A sampled count stays marked sampled through the sink, and the
	// others stay exact.
	later := now.Add(time.Duration(len(sinks)) * time.Minute)
	if err := sinks[0].Add(ctx, []Hit{{Identity: "tenant:flood", Policy: "api", Denies: 1000, Sampled: true}}, later); err != nil {
		t.Fatal(err)
	}
	if top, err := sinks[len(sinks)-1].Top(ctx, 2, later); err != nil || len(top) != 2 || top[0].Identity != "tenant:flood" || !top[0].Sampled || top[1].Sampled {
		t.Fatalf("with a sampled count: %+v %v", top, err)
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
	tops := NewTop(NewMemoryTop(), TopOptions{Sample: 1})
	for i := range maxPending + 10 {
		tops.Observe("u"+strconv.Itoa(i), "p", 0)
	}
	if len(tops.pending) != maxPending || tops.dropped.Load() != 10 {
		t.Fatalf("pending %d dropped %d", len(tops.pending), tops.dropped.Load())
	}
}

// BenchmarkObserve is the top-K's cost per denial on the hot path, with
// the defaults (exact up to 100, then one in 16), one identity past its
// exact count (the flood's case) and 1000 identities: compare it with a
// decision's CPU (BenchmarkTopKOverhead in internal/server, ~3-7 us per
// denied HTTP decision).
func BenchmarkObserve(b *testing.B) {
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = "user:" + strconv.Itoa(i)
	}
	for _, n := range []int{1, len(ids)} {
		b.Run(strconv.Itoa(n)+"-identities", func(b *testing.B) {
			tops := NewTop(NewMemoryTop(), TopOptions{Exact: DefaultTopExact, Sample: DefaultTopSample})
			b.ReportAllocs()
			var seq atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1))
				for pb.Next() {
					tops.Observe(ids[i%n], "api", 0)
					i++
				}
			})
		})
	}
}

// TestTopExactSmallCounts: below the exact threshold every denial counts
// one, with the default sample of 16: an identity denied twice shows 2
// (not 16, as one sampled denial scaled by 16 did), one denied 15 times
// shows 15 (a sample could miss it whole), and neither is marked sampled,
// on the memory sink and on Redis.
func TestTopExactSmallCounts(t *testing.T) {
	sinks := map[string]func(t *testing.T) TopSink{
		"memory": func(*testing.T) TopSink { return NewMemoryTop() },
		"redis": func(t *testing.T) TopSink {
			cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{redistest.Standalone(t).Addr}, DisableCache: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cl.Close)
			return NewRedisTop(func() rueidis.Client { return cl }, redistest.Prefix(t)+":{topk}")
		},
	}
	for name, sink := range sinks {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			now := time.Unix(1_800_000_000, 0)
			tops := NewTop(sink(t), TopOptions{Exact: DefaultTopExact, Sample: DefaultTopSample})
			counts := map[string]int{"tenant:one": 1, "tenant:two": 2, "tenant:fifteen": 15, "tenant:hundred": DefaultTopExact}
			// Over three flushes in two minutes: the sums stay exact.
			for f := range 3 {
				for id, n := range counts {
					for i := range n {
						if i%3 == f {
							tops.Observe(id, "api", 0)
						}
					}
				}
				if err := tops.Flush(ctx, now.Add(time.Duration(f)*30*time.Second)); err != nil {
					t.Fatal(err)
				}
			}
			top, err := tops.Read(ctx, 10, now.Add(time.Minute+30*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]float64{}
			for _, h := range top {
				got[h.Identity] = h.Denies
				if h.Sampled {
					t.Errorf("%s marked sampled with %v denials", h.Identity, h.Denies)
				}
			}
			for id, n := range counts {
				if got[id] != float64(n) {
					t.Errorf("%s: %v denials, want %d exactly (all: %v)", id, got[id], n, got)
				}
			}
		})
	}
}

// TestTopLargeCountsBounded: past the exact threshold the count is an
// unbiased estimate marked sampled: exact + sample x Binomial(m-exact,
// 1/sample), whose standard deviation is sqrt((m-exact)(sample-1)); the
// test allows 6 of them (a false failure once in 10^9 runs). Each round
// draws afresh, so the mean of the rounds is within 6 of its own, smaller,
// deviation too: a biased scaling (such as counting the exact denials
// again) fails it.
func TestTopLargeCountsBounded(t *testing.T) {
	const exact, sample, m, rounds = 10, 16, 20_000, 20
	sd := math.Sqrt(float64((m - exact) * (sample - 1)))
	var sum float64
	for r := range rounds {
		tops := NewTop(NewMemoryTop(), TopOptions{Exact: exact, Sample: sample})
		for range m {
			tops.Observe("tenant:flood", "api", 0)
		}
		for range 3 {
			tops.Observe("tenant:small", "api", 0)
		}
		now := time.Unix(1_800_000_000, 0)
		if err := tops.Flush(context.Background(), now); err != nil {
			t.Fatal(err)
		}
		top, _ := tops.Sink().Top(context.Background(), 2, now)
		if len(top) != 2 || top[0].Identity != "tenant:flood" || !top[0].Sampled || top[1].Denies != 3 || top[1].Sampled {
			t.Fatalf("round %d: %+v", r, top)
		}
		if d := math.Abs(top[0].Denies - m); d > 6*sd {
			t.Fatalf("round %d: %v denials for %d, off by %.0f > 6 sd (%.0f)", r, top[0].Denies, m, d, 6*sd)
		}
		sum += top[0].Denies
	}
	if d := math.Abs(sum/rounds - m); d > 6*sd/math.Sqrt(rounds) {
		t.Fatalf("mean of %d rounds %.0f for %d: biased by %.0f", rounds, sum/rounds, m, d)
	}
}

// TestTopConcurrentExact: denials observed by parallel callers while the
// flusher runs are each counted once: the flush swaps the pending hits
// under the write lock that excludes the counting. Under -race.
func TestTopConcurrentExact(t *testing.T) {
	const workers, each = 4, 2000
	sink := NewMemoryTop()
	tops := NewTop(sink, TopOptions{Exact: 1 << 20, Sample: DefaultTopSample, Display: func(id string) string { return "shown:" + id }})
	now := time.Unix(1_800_000_000, 0)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		for {
			select {
			case <-stop:
				return
			default:
				_ = tops.Flush(context.Background(), now)
				runtime.Gosched()
			}
		}
	}()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				tops.Observe("tenant:a", "api", 0)
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-flushed
	if err := tops.Flush(context.Background(), now); err != nil {
		t.Fatal(err)
	}
	top, _ := sink.Top(context.Background(), 1, now)
	if len(top) != 1 || top[0].Identity != "shown:tenant:a" || top[0].Denies != workers*each || top[0].Sampled {
		t.Fatalf("top: %+v, want %d exact denials of shown:tenant:a", top, workers*each)
	}
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
	tops := NewTop(sink, TopOptions{Sample: 1})
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
