package fairqueue

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
)

var t0 = time.Unix(1_700_000_000, 0)

// arrival is one item offered at an offset from the start.
type arrival struct {
	at   time.Duration
	item Item
}

// record is what became of one arrival.
type record struct {
	arrival
	res Result
}

// simulate offers the arrivals to q, moving the fake clock from event to
// event (arrivals and the dispatcher's own wake-up times), and returns what
// became of each once every item left the queue.
func simulate(t *testing.T, q *Queue, clk *clock.Fake, arrivals []arrival) []record {
	t.Helper()
	slices.SortStableFunc(arrivals, func(a, b arrival) int { return int(a.at - b.at) })
	ctx := context.Background()
	start := clk.Now()
	var pending []*Waiter
	recs := make([]record, len(arrivals))
	index := map[*Waiter]int{}
	next := int64(0)
	i := 0
	for i < len(arrivals) || len(pending) > 0 {
		at := int64(-1)
		if i < len(arrivals) {
			at = start + int64(arrivals[i].at)
		}
		if next != 0 && (at < 0 || next < at) {
			at = next
		}
		if at < 0 {
			t.Fatalf("%d items wait but the dispatcher wants no wake-up", len(pending))
		}
		if at > clk.Now() {
			clk.Set(time.Unix(0, at))
		}
		for i < len(arrivals) && start+int64(arrivals[i].at) <= clk.Now() {
			it := arrivals[i].item
			w, err := q.Submit(ctx, &it)
			if err != nil {
				t.Fatal(err)
			}
			recs[i].arrival = arrivals[i]
			index[w] = i
			pending = append(pending, w)
			i++
		}
		next = q.Dispatch(ctx)
		pending = slices.DeleteFunc(pending, func(w *Waiter) bool {
			select {
			case <-w.Done():
				recs[index[w]].res = w.Result()
				return true
			default:
				return false
			}
		})
	}
	return recs
}

func newQueue(t *testing.T, opts Options) (*Queue, *clock.Fake, sluice.Store) {
	t.Helper()
	clk := clock.NewFake(t0)
	st, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	opts.Store, opts.Clock = st, clk
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = "{q}:"
	}
	q, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return q, clk, st
}

func even(key, class string, rate float64, offset, d time.Duration) []arrival {
	var out []arrival
	step := time.Duration(float64(time.Second) / rate)
	for at := offset; at < d; at += step {
		out = append(out, arrival{at: at, item: Item{Key: key, Group: "g", Class: class, Capacity: "m"}})
	}
	return out
}

func perSecond(rps int64, burst int64) []Limit {
	return []Limit{{Name: "rpm", Kind: Requests, Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: rps * 60, Period: time.Minute, Burst: burst}}}
}

// TestFairnessHeavyKey: one key offering 100 req/s and nine offering 2 req/s
// each share a capacity of 30 req/s: every light request is admitted within
// 1 s and the heavy key gets the rest, and the capacity is never exceeded.
func TestFairnessHeavyKey(t *testing.T) {
	const d = 20 * time.Second
	q, clk, _ := newQueue(t, Options{
		Capacities: map[string][]Limit{"m": perSecond(30, 5)},
		MaxWait:    2 * time.Second, MaxPerKey: 16,
	})
	arrivals := even("heavy", "", 100, 0, d)
	for k := range 9 {
		arrivals = append(arrivals, even(fmt.Sprintf("light%d", k), "", 2, time.Duration(k)*37*time.Millisecond+3*time.Millisecond, d)...)
	}
	recs := simulate(t, q, clk, arrivals)
	admitted := map[string]int{}
	offered := map[string]int{}
	maxWait := map[string]time.Duration{}
	var times []time.Duration
	for _, r := range recs {
		offered[r.item.Key]++
		if r.res.Outcome == Admitted {
			admitted[r.item.Key]++
			maxWait[r.item.Key] = max(maxWait[r.item.Key], r.res.Waited)
			times = append(times, r.at+r.res.Waited)
		}
	}
	total := 0
	for k := range 9 {
		key := fmt.Sprintf("light%d", k)
		if admitted[key] != offered[key] || maxWait[key] > time.Second {
			t.Errorf("%s: %d of %d admitted, longest wait %s; want all within 1s", key, admitted[key], offered[key], maxWait[key])
		}
		total += admitted[key]
	}
	total += admitted["heavy"]
	t.Logf("heavy: %d of %d admitted (%.1f/s), light: %d each; total %d", admitted["heavy"], offered["heavy"], float64(admitted["heavy"])/d.Seconds(), admitted["light0"], total)
	// The capacity admits at most 5 + 30/s over the run (which ends when
	// the last waiter leaves), and the queue should use nearly all of it.
	span := slices.Max(times)
	if limit := 5 + int(30*span.Seconds()); total > limit || total < limit*97/100 {
		t.Errorf("total admitted %d in %s, want within [%d, %d]", total, span, limit*97/100, limit)
	}
	checkWindows(t, times, time.Second, 5+30)
}

// checkWindows asserts that no window of length w holds more than limit
// admissions.
func checkWindows(t *testing.T, times []time.Duration, w time.Duration, limit int) {
	t.Helper()
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	j := 0
	for i := range times {
		for times[i]-times[j] >= w {
			j++
		}
		if n := i - j + 1; n > limit {
			t.Fatalf("%d admissions within %s ending at %s, limit %d", n, w, times[i], limit)
		}
	}
}

// shareOf is class's share of the admissions before until (after it, the
// queues drain without new arrivals).
func shareOf(recs []record, class string, until time.Duration) (share float64, counts map[string]int) {
	counts = map[string]int{}
	for _, r := range recs {
		if r.res.Outcome == Admitted && r.at+r.res.Waited < until {
			counts[r.item.Class]++
		}
	}
	total := 0
	for _, n := range counts {
		total += n
	}
	return float64(counts[class]) / float64(total), counts
}

var twoClasses = []Class{{Name: "interactive", Priority: 10, Share: 70}, {Name: "batch", Priority: 0, Share: 30}}

// TestPriorityShares: with interactive (70 %) and batch (30 %) both
// saturating a capacity, interactive gets 70 % ±3 and batch the rest; with
// batch idle interactive borrows all of it; with interactive idle batch
// borrows all of it.
func TestPriorityShares(t *testing.T) {
	const d = 10 * time.Second
	for _, tc := range []struct {
		name          string
		interactive   float64
		batch         float64
		wantShare     float64
		wantTotalRate float64
	}{
		{"both saturated", 300, 300, 0.70, 100},
		{"batch idle", 300, 0, 1, 100},
		{"interactive idle", 0, 300, 0, 100},
		{"interactive light", 20, 300, 0.20, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, clk, _ := newQueue(t, Options{
				Classes:    twoClasses,
				Capacities: map[string][]Limit{"m": perSecond(100, 20)},
				MaxWait:    time.Second, MaxPerKey: 64,
			})
			var arrivals []arrival
			if tc.interactive > 0 {
				arrivals = append(arrivals, even("i", "interactive", tc.interactive, 0, d)...)
			}
			if tc.batch > 0 {
				arrivals = append(arrivals, even("b", "batch", tc.batch, time.Millisecond, d)...)
			}
			recs := simulate(t, q, clk, arrivals)
			share, counts := shareOf(recs, "interactive", d)
			t.Logf("admitted %v: interactive share %.3f", counts, share)
			if share < tc.wantShare-0.03 || share > tc.wantShare+0.03 {
				t.Errorf("interactive share %.3f, want %.2f ±0.03", share, tc.wantShare)
			}
			total := counts["interactive"] + counts["batch"]
			if limit := 20 + int(tc.wantTotalRate*d.Seconds()); total > limit || total < limit*95/100 {
				t.Errorf("total %d, want within [%d, %d]", total, limit*95/100, limit)
			}
			if tc.name == "interactive light" {
				// Below its share, interactive is never refused.
				for _, r := range recs {
					if r.item.Class == "interactive" && r.res.Outcome != Admitted {
						t.Fatalf("interactive request at %s: %s", r.at, r.res.Outcome)
					}
				}
			}
		})
	}
}

// TestPriorityPool: without reserved shares, the higher class takes the
// whole capacity while it is saturated.
func TestPriorityPool(t *testing.T) {
	q, clk, _ := newQueue(t, Options{
		Classes:    []Class{{Name: "hi", Priority: 1}, {Name: "lo"}},
		Capacities: map[string][]Limit{"m": perSecond(50, 5)},
		MaxWait:    time.Second, MaxPerKey: 64,
	})
	arrivals := append(even("a", "hi", 100, 0, 5*time.Second), even("b", "lo", 100, 0, 5*time.Second)...)
	recs := simulate(t, q, clk, arrivals)
	share, counts := shareOf(recs, "hi", 5*time.Second)
	if share < 0.95 {
		t.Fatalf("high class got %.3f of %v, want nearly all", share, counts)
	}
}

// TestPriorityAfterPoll: a lower class that was tried later than a higher
// one does not get a freed concurrency slot first: the classes share what
// they learnt of the pool, so both are ready when it frees.
func TestPriorityAfterPoll(t *testing.T) {
	q, clk, st := newQueue(t, Options{
		Classes:    []Class{{Name: "hi", Priority: 1}, {Name: "lo"}},
		Capacities: map[string][]Limit{"m": {{Name: "concurrency", Kind: Concurrency, Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: 1, Period: time.Minute}}}},
		MaxWait:    time.Minute, Poll: 10 * time.Millisecond,
	})
	ctx := context.Background()
	holder, _ := q.Submit(ctx, &Item{Key: "h", Class: "hi", Capacity: "m", Lease: "h"})
	lo, _ := q.Submit(ctx, &Item{Key: "lo", Class: "lo", Capacity: "m", Lease: "lo"})
	q.Dispatch(ctx)
	clk.Advance(5 * time.Millisecond)
	hi, _ := q.Submit(ctx, &Item{Key: "hi", Class: "hi", Capacity: "m", Lease: "hi"})
	q.Dispatch(ctx)
	if _, err := st.ApplyAll(ctx, sluice.OpRefund, holder.Result().Pool); err != nil {
		t.Fatal(err)
	}
	for range 2 { // lo's last try is older: it would be retried first
		clk.Advance(5 * time.Millisecond)
		q.Dispatch(ctx)
	}
	if hi.Result().Outcome != Admitted || lo.Result().Outcome != Pending {
		t.Fatalf("hi %s, lo %s: the higher class must take the freed slot", hi.Result().Outcome, lo.Result().Outcome)
	}
}

// TestBounds: the queue holds at most MaxPerKey items of one key,
// MaxPerGroup of one group and MaxTotal in all; the rest are Full at once.
func TestBounds(t *testing.T) {
	q, clk, _ := newQueue(t, Options{
		Capacities: map[string][]Limit{"m": perSecond(1, 1)},
		MaxWait:    time.Hour, MaxPerKey: 3, MaxPerGroup: 5, MaxTotal: 7,
	})
	_ = clk
	ctx := context.Background()
	submit := func(key, group string) Outcome {
		w, err := q.Submit(ctx, &Item{Key: key, Group: group, Capacity: "m"})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-w.Done():
			return w.Result().Outcome
		default:
			return Pending
		}
	}
	if o := submit("a", "g1"); o != Admitted {
		t.Fatalf("first: %s", o)
	}
	var got []Outcome
	for range 5 {
		got = append(got, submit("a", "g1"))
	}
	want := []Outcome{Pending, Pending, Pending, Full, Full}
	if !slices.Equal(got, want) {
		t.Fatalf("per key: %v, want %v", got, want)
	}
	got = got[:0]
	for _, k := range []string{"b", "c", "d"} {
		got = append(got, submit(k, "g1"))
	}
	if want := []Outcome{Pending, Pending, Full}; !slices.Equal(got, want) {
		t.Fatalf("per group: %v, want %v", got, want)
	}
	got = got[:0]
	for _, k := range []string{"e", "f", "g"} {
		got = append(got, submit(k, "g2"))
	}
	if want := []Outcome{Pending, Pending, Full}; !slices.Equal(got, want) {
		t.Fatalf("total: %v, want %v", got, want)
	}
	if q.Depth("default") != 7 {
		t.Fatalf("depth %d", q.Depth("default"))
	}
}

// TestBoundsBytes: the waiting items' bytes (request bodies) are bounded
// together: a caller cannot fill memory with large waiting bodies.
func TestBoundsBytes(t *testing.T) {
	q, _, _ := newQueue(t, Options{
		Capacities: map[string][]Limit{"m": perSecond(1, 1)},
		MaxWait:    time.Hour, MaxBytes: 10 << 20,
	})
	ctx := context.Background()
	var got []Outcome
	for i, size := range []int64{1, 4 << 20, 4 << 20, 4 << 20, 2 << 20, -1} {
		w, err := q.Submit(ctx, &Item{Key: fmt.Sprint(i), Capacity: "m", Bytes: size})
		if err != nil {
			t.Fatal(err)
		}
		o := Pending
		select {
		case <-w.Done():
			o = w.Result().Outcome
		default:
		}
		got = append(got, o)
	}
	want := []Outcome{Admitted, Pending, Pending, Full, Pending, Full}
	if !slices.Equal(got, want) {
		t.Fatalf("%v, want %v", got, want)
	}
	if q.bytes != 10<<20 {
		t.Fatalf("bytes %d", q.bytes)
	}
}

// TestTimeoutAndCancel: an item waits at most MaxWait; a canceled item
// leaves at once and is never charged, so the next one takes its turn.
func TestTimeoutAndCancel(t *testing.T) {
	q, clk, _ := newQueue(t, Options{
		Capacities: map[string][]Limit{"m": perSecond(1, 1)},
		MaxWait:    1500 * time.Millisecond,
	})
	ctx := context.Background()
	sub := func(key string) *Waiter {
		w, err := q.Submit(ctx, &Item{Key: key, Capacity: "m"})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	first := sub("a")
	if first.Result().Outcome != Admitted {
		t.Fatal("first not admitted")
	}
	w1, w2, w3 := sub("b"), sub("c"), sub("d")
	if !q.Cancel(w1) || w1.Result().Outcome != Canceled {
		t.Fatal("cancel")
	}
	if q.Cancel(w1) {
		t.Fatal("second cancel reported true")
	}
	next := q.Dispatch(ctx)
	if next != t0.Add(time.Second).UnixNano() {
		t.Fatalf("next wake %s, want t0+1s", time.Unix(0, next).Sub(t0))
	}
	clk.Set(time.Unix(0, next))
	q.Dispatch(ctx)
	if r := w2.Result(); r.Outcome != Admitted || r.Waited != time.Second || !r.Queued {
		t.Fatalf("w2: %+v", r)
	}
	clk.Set(t0.Add(1500 * time.Millisecond))
	q.Dispatch(ctx)
	if r := w3.Result(); r.Outcome != Timeout || r.Waited != 1500*time.Millisecond {
		t.Fatalf("w3: %+v", r)
	}
	if q.Depth("default") != 0 || q.total != 0 || len(q.perKey) != 0 || len(q.perGroup) != 0 || len(q.perCap) != 0 {
		t.Fatalf("queue not empty: %d %v %v", q.total, q.perKey, q.perGroup)
	}
}

// TestDeniedWhenWaitCannotHelp: a key whose own limit frees only after
// MaxWait is denied at once, and so is a cost beyond the capacity's burst.
func TestDeniedWhenWaitCannotHelp(t *testing.T) {
	q, _, _ := newQueue(t, Options{
		Capacities: map[string][]Limit{"m": {{Name: "tpm", Kind: Tokens, Algorithm: sluice.GCRA, Limit: sluice.PerMinute(1000)}}},
		MaxWait:    time.Second,
	})
	ctx := context.Background()
	own := []sluice.Request{{Key: "{k}:rpd", Algorithm: sluice.GCRA, Limit: sluice.PerDay(1), Cost: 1}}
	w, _ := q.Submit(ctx, &Item{Key: "k", Capacity: "m", Tokens: 10, Reqs: own})
	if w.Result().Outcome != Admitted {
		t.Fatalf("%+v", w.Result())
	}
	w, _ = q.Submit(ctx, &Item{Key: "k", Capacity: "m", Tokens: 10, Reqs: own})
	if r := w.Result(); r.Outcome != Denied || r.Decisions[0].Allowed || r.PoolDenied() {
		t.Fatalf("rpd: %+v", r)
	}
	w, _ = q.Submit(ctx, &Item{Key: "k2", Capacity: "m", Tokens: 1001})
	if r := w.Result(); r.Outcome != Denied {
		t.Fatalf("too large: %+v", r)
	}
	if _, err := q.Submit(ctx, &Item{Key: "k", Capacity: "nope"}); !errors.Is(err, ErrInvalidItem) {
		t.Fatalf("unknown capacity: %v", err)
	}
	if _, err := q.Submit(ctx, &Item{Key: "k", Class: "nope"}); !errors.Is(err, ErrInvalidItem) {
		t.Fatalf("unknown class: %v", err)
	}
	if _, err := q.Submit(ctx, &Item{Key: "k", Tokens: -1}); !errors.Is(err, ErrInvalidItem) {
		t.Fatalf("negative tokens: %v", err)
	}
}

// TestDeniedWhenOwnLimitSpentBehindCapacity: while the capacity is
// exhausted (known from an earlier denial, so no try reaches the store) or
// other items wait for it, an item whose own limit (a spent budget, a
// daily limit) frees only after MaxWait is still denied at once, with its
// own limit's decisions, rather than waiting MaxWait for capacity first.
// An item whose own limit frees within MaxWait queues as before.
func TestDeniedWhenOwnLimitSpentBehindCapacity(t *testing.T) {
	q, _, _ := newQueue(t, Options{Capacities: map[string][]Limit{"m": perSecond(1, 1)}, MaxWait: 5 * time.Second})
	ctx := context.Background()
	spent := []sluice.Request{{Key: "{s}:rpd", Algorithm: sluice.GCRA, Limit: sluice.PerDay(1), Cost: 1}}
	if w, _ := q.Submit(ctx, &Item{Key: "s", Reqs: spent}); w.Result().Outcome != Admitted {
		t.Fatal("s's only request of the day")
	}
	if w, _ := q.Submit(ctx, &Item{Key: "a", Capacity: "m"}); w.Result().Outcome != Admitted {
		t.Fatal("a")
	}
	// The capacity denies b and is known exhausted for a second.
	b, _ := q.Submit(ctx, &Item{Key: "b", Capacity: "m"})
	if r := b.Result(); r.Outcome != Pending || !r.PoolDenied() {
		t.Fatalf("b: %+v", r)
	}
	// b gives up: nothing waits, but every option of the capacity is
	// known exhausted. Then b waits again, ahead on the capacity.
	q.Cancel(b)
	for _, name := range []string{"exhausted", "behind b"} {
		if name == "behind b" {
			if b, _ = q.Submit(ctx, &Item{Key: "b", Capacity: "m"}); b.Result().Outcome != Pending {
				t.Fatalf("b again: %+v", b.Result())
			}
		}
		w, _ := q.Submit(ctx, &Item{Key: "s", Capacity: "m", Reqs: spent})
		r := w.Result()
		if r.Outcome != Denied || r.Queued || len(r.Decisions) != 1 || r.Decisions[0].Allowed || r.Decisions[0].RetryAfter < time.Hour {
			t.Fatalf("%s: spent own limit: %+v", name, r)
		}
	}
	// An own limit that frees within MaxWait: the item waits.
	soon := []sluice.Request{{Key: "{n}:rps", Algorithm: sluice.GCRA, Limit: sluice.PerSecond(1), Cost: 1}}
	if w, _ := q.Submit(ctx, &Item{Key: "n", Reqs: soon}); w.Result().Outcome != Admitted {
		t.Fatal("n")
	}
	w, _ := q.Submit(ctx, &Item{Key: "n", Capacity: "m", Reqs: soon})
	if r := w.Result(); r.Outcome != Pending || q.Depth("default") != 2 {
		t.Fatalf("n: %+v, depth %d", r, q.Depth("default"))
	}
}

// TestSubmitAfterRun: once Run has returned, an item is still admitted at
// once when its limits allow, but one that would wait is canceled rather
// than left waiting with no dispatcher to admit or expire it.
func TestSubmitAfterRun(t *testing.T) {
	q, _, _ := newQueue(t, Options{Capacities: map[string][]Limit{"m": perSecond(1, 1)}, MaxWait: time.Minute})
	ctx, stop := context.WithCancel(context.Background())
	stop()
	q.Run(ctx)
	for i, want := range []Outcome{Admitted, Canceled} {
		w, err := q.Submit(context.Background(), &Item{Key: "k", Capacity: "m"})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-w.Done():
		default:
			t.Fatalf("item %d waits after Run returned", i)
		}
		if r := w.Result(); r.Outcome != want || r.Queued {
			t.Fatalf("item %d: %+v, want %s", i, r, want)
		}
	}
}

// TestAddUsage: a correction made later decays as if made at the
// admission, so that settling for the actual leaves exactly the usage an
// admission with the actual would have left; usage never goes negative,
// and a correction for an unknown key adds none.
func TestAddUsage(t *testing.T) {
	q, clk, _ := newQueue(t, Options{HalfLife: 10 * time.Second, MaxWait: time.Second})
	w, _ := q.Submit(context.Background(), &Item{Key: "a", Usage: 1000})
	if w.Result().Outcome != Admitted || w.Result().At != t0.UnixNano() {
		t.Fatalf("%+v", w.Result())
	}
	clk.Advance(10 * time.Second) // one half-life
	q.AddUsage("a", 10-1000, w.Result().At)
	if u := q.RecentUsage("a"); u < 4.999 || u > 5.001 {
		t.Fatalf("usage %v, want 5 (10 used, half of it left)", u)
	}
	q.AddUsage("a", -1e9, clk.Now())
	q.AddUsage("nobody", -5, clk.Now())
	if u, n := q.RecentUsage("a"), len(q.usage); u != 0 || n != 1 {
		t.Fatalf("usage %v, %d keys", u, n)
	}
}

// TestOptionsInvalid: shares over 100 %, bad limits and missing parts are
// refused.
func TestOptionsInvalid(t *testing.T) {
	st, _ := memstore.New(memstore.Options{})
	t.Cleanup(func() { _ = st.Close() })
	for name, o := range map[string]Options{
		"no store":       {},
		"shares":         {Store: st, Classes: []Class{{Name: "a", Share: 60}, {Name: "b", Share: 50}}},
		"dup class":      {Store: st, Classes: []Class{{Name: "a"}, {Name: "a"}}},
		"neg wait":       {Store: st, MaxWait: -1},
		"no prefix":      {Store: st, Capacities: map[string][]Limit{"m": perSecond(1, 1)}},
		"bad kind":       {Store: st, KeyPrefix: "p", Capacities: map[string][]Limit{"m": {{Name: "x", Kind: Concurrency, Algorithm: sluice.GCRA, Limit: sluice.PerSecond(1)}}}},
		"bad limit":      {Store: st, KeyPrefix: "p", Capacities: map[string][]Limit{"m": {{Name: "x", Kind: Requests, Algorithm: sluice.GCRA}}}},
		"share negative": {Store: st, Classes: []Class{{Name: "a", Share: -1}}},
	} {
		if _, err := New(o); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestConcurrencyCapacity: a concurrency capacity admits a waiter when a
// holder's lease is refunded, and the waiter holds its own lease.
func TestConcurrencyCapacity(t *testing.T) {
	q, clk, st := newQueue(t, Options{
		Capacities: map[string][]Limit{"m": {{Name: "concurrency", Kind: Concurrency, Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: 1, Period: time.Minute}}}},
		MaxWait:    time.Second, Poll: 10 * time.Millisecond,
	})
	ctx := context.Background()
	a, _ := q.Submit(ctx, &Item{Key: "a", Capacity: "m", Lease: "la"})
	b, _ := q.Submit(ctx, &Item{Key: "b", Capacity: "m", Lease: "lb"})
	if a.Result().Outcome != Admitted {
		t.Fatal("a")
	}
	next := q.Dispatch(ctx)
	if next != t0.Add(10*time.Millisecond).UnixNano() {
		t.Fatalf("concurrency waits are polled: next %s", time.Unix(0, next).Sub(t0))
	}
	clk.Set(time.Unix(0, next))
	q.Dispatch(ctx)
	if b.Result().Outcome != Pending {
		t.Fatal("b admitted while a holds the slot")
	}
	if _, err := st.ApplyAll(ctx, sluice.OpRefund, a.Result().Pool); err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Millisecond)
	q.Dispatch(ctx)
	r := b.Result()
	if r.Outcome != Admitted || r.Pool[0].Lease != "lb" {
		t.Fatalf("b: %+v", r)
	}
}

// TestCancelFlood: 400 callers wait for 4 concurrency slots and give up in
// random order while the slots free up, with a real dispatcher and clock;
// afterwards nothing is left behind: no waiting item, no concurrency lease
// held by a caller that gave up (run with -race).
func TestCancelFlood(t *testing.T) {
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	capLimit := sluice.Limit{Rate: 4, Period: time.Minute}
	q, err := New(Options{
		Store: st, KeyPrefix: "{q}:", MaxWait: time.Minute, Poll: time.Millisecond,
		Capacities: map[string][]Limit{"m": {{Name: "concurrency", Kind: Concurrency, Algorithm: sluice.Concurrency, Limit: capLimit}}},
		MaxPerKey:  1000, MaxPerGroup: 1000, MaxTotal: 1000,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { q.Run(ctx); close(done) }()
	release := func(res Result) {
		if _, err := st.ApplyAll(context.Background(), sluice.OpRefund, res.Pool); err != nil {
			t.Error(err)
		}
		q.Kick()
	}
	var holders []Result
	for i := range 4 {
		res, err := q.Admit(ctx, &Item{Key: "holder", Capacity: "m", Lease: fmt.Sprintf("h%d", i)})
		if err != nil || res.Outcome != Admitted {
			t.Fatalf("holder %d: %v %+v", i, err, res)
		}
		holders = append(holders, res)
	}
	const n = 400
	cancels := make([]context.CancelFunc, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var admitted atomic.Int64
	outcomes := map[Outcome]int{}
	for i := range n {
		cctx, cancel := context.WithCancel(context.Background())
		cancels[i] = cancel
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := q.Admit(cctx, &Item{Key: fmt.Sprintf("k%d", i%10), Capacity: "m", Lease: fmt.Sprintf("l%d", i)})
			if err != nil {
				t.Error(err)
				return
			}
			if res.Outcome == Admitted {
				admitted.Add(1)
				release(res) // the request ran and settled
			}
			mu.Lock()
			outcomes[res.Outcome]++
			mu.Unlock()
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for q.Depth("default") < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d callers queued", q.Depth("default"), n)
		}
		runtime.Gosched()
	}
	order := rand.Perm(n)
	for j, i := range order {
		if j%100 == 0 && len(holders) > 0 {
			// Free a slot and let a waiter take it, while the others
			// keep leaving.
			before := admitted.Load()
			release(holders[0])
			holders = holders[1:]
			for admitted.Load() == before {
				if time.Now().After(deadline) {
					t.Fatal("no waiter took a freed slot")
				}
				runtime.Gosched()
			}
		}
		cancels[i]()
	}
	wg.Wait()
	stop()
	<-done
	t.Logf("outcomes: %v", outcomes)
	if outcomes[Canceled] == 0 || outcomes[Admitted] == 0 {
		t.Fatalf("want both canceled and admitted callers: %v", outcomes)
	}
	if q.total != 0 || len(q.perKey) != 0 || len(q.perCap) != 0 || q.Depth("default") != 0 {
		t.Fatalf("queue holds %d items after every caller left", q.total)
	}
	d, err := st.Apply(context.Background(), sluice.OpPeek, sluice.Request{Key: "{q}:m:pool:concurrency", Algorithm: sluice.Concurrency, Limit: capLimit})
	if err != nil {
		t.Fatal(err)
	}
	if d.Remaining != capLimit.Rate {
		t.Fatalf("%d concurrency slots still held after every caller left", capLimit.Rate-d.Remaining)
	}
}
