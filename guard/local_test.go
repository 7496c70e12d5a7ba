package guard

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
)

// BenchmarkRemember is the Local policy's bookkeeping on every answer of
// the store, the last decision of each key: 100k keys asked in turn (the
// default bound), from 64 callers, as the Envoy service on Redis sees
// them in internal/loadtest/bench-envoy-cold.sh.
func BenchmarkRemember(b *testing.B) {
	l, err := newLocal(&Options{Clock: clock.NewSystem(), LocalMaxKeys: DefaultLocalMaxKeys})
	if err != nil {
		b.Fatal(err)
	}
	defer l.store.Close()
	reqs := make([]sluice.Request, 100_000)
	for i := range reqs {
		reqs[i] = sluice.Request{Key: "rls:edge:remote_address_10.0." + strconv.Itoa(i), Algorithm: sluice.FixedWindow,
			Limit: sluice.Limit{Rate: 100, Period: time.Minute}, Cost: 1}
	}
	d := sluice.Decision{Allowed: true, Limit: reqs[0].Limit, Remaining: 99, ResetAfter: 30 * time.Second}
	var next atomic.Int64
	now := time.Now().UnixNano()
	b.SetParallelism(32)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l.remember(&reqs[next.Add(1)%int64(len(reqs))], &d, now)
		}
	})
}

// A key's seed is the store's newest answer, taken once by Local; a newer
// answer for the same key seeds it again; a reset forgets it. Concurrent
// answers, takes and resets keep the count of kept keys exact.
func TestSeedTakenOncePerAnswer(t *testing.T) {
	l, err := newLocal(&Options{Clock: clock.NewSystem(), LocalMaxKeys: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer l.store.Close()
	r := req("k", 100)
	for i, remaining := range []int64{70, 40} {
		l.remember(&r, &sluice.Decision{Allowed: true, Limit: r.Limit, Remaining: remaining, ResetAfter: time.Minute}, 1)
		s, ok := l.takeSeed("k")
		if !ok || s.remaining != remaining || s.applied {
			t.Fatalf("answer %d: seed %+v %v, want remaining %d", i, s, ok, remaining)
		}
		if _, ok := l.takeSeed("k"); ok {
			t.Fatalf("answer %d: seed taken twice", i)
		}
	}
	l.remember(&r, &sluice.Decision{Allowed: true, Limit: r.Limit, Remaining: 10}, 1)
	l.forget("k")
	if s, ok := l.takeSeed("k"); ok {
		t.Fatalf("seed %+v after a reset", s)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				r := req("c"+strconv.Itoa((g*7+i)%1500), 100)
				switch i % 5 {
				case 3:
					l.takeSeed(r.Key)
				case 4:
					l.forget(r.Key)
				default:
					l.remember(&r, &sluice.Decision{Allowed: true, Limit: r.Limit, Remaining: int64(i % 100)}, 1)
				}
			}
		})
	}
	wg.Wait()
	if got, want := l.seedSize.Load(), int64(l.seeds.Size()); got != want || got > 1000 {
		t.Errorf("%d seeds counted, %d kept (bound 1000)", got, want)
	}
}
