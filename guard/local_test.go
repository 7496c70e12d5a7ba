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
// answer for the same key seeds it again; a reset forgets it; an answer
// for another limit does not seed it. Concurrent answers, takes and
// resets leave every slot either empty or one key's whole seed.
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
		if !ok || s.remaining != remaining || s.applied || s.print != limitPrint(r.Algorithm, r.Limit) {
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
	kept := 0
	for g := range 8 {
		for i := range 2000 {
			r := req("c"+strconv.Itoa((g*7+i)%1500), 100)
			pr, _ := l.seeds.pair(keyHash(r.Key), false)
			if pr == nil {
				continue
			}
			sl := seedIn(pr, keyHash(r.Key))
			if sl == nil {
				continue
			}
			kept++
			if sl.print != limitPrint(r.Algorithm, r.Limit) || sl.remaining < 0 || sl.remaining >= 100 || sl.at != 1 {
				t.Fatalf("key %s: torn seed %+v", r.Key, *sl)
			}
		}
	}
	if kept == 0 {
		t.Error("no key kept its seed")
	}
}

// A seed answers only for the algorithm and limit it was taken under:
// their fingerprint tells every field apart, the calendar's zone too.
func TestLimitPrint(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skip(err)
	}
	base := sluice.Limit{Rate: 100, Period: time.Minute}
	day := sluice.Limit{Rate: 100, Period: 24 * time.Hour, Calendar: sluice.Calendar{Unit: sluice.Day}}
	want := limitPrint(sluice.FixedWindow, base)
	if got := limitPrint(sluice.FixedWindow, sluice.Limit{Rate: 100, Period: time.Minute}); got != want {
		t.Fatalf("equal limits print %x and %x", got, want)
	}
	others := map[string]uint64{
		"algorithm": limitPrint(sluice.GCRA, base),
		"rate":      limitPrint(sluice.FixedWindow, sluice.Limit{Rate: 101, Period: time.Minute}),
		"period":    limitPrint(sluice.FixedWindow, sluice.Limit{Rate: 100, Period: time.Hour}),
		"burst":     limitPrint(sluice.FixedWindow, sluice.Limit{Rate: 100, Period: time.Minute, Burst: 5}),
		"calendar":  limitPrint(sluice.FixedWindow, day),
	}
	day.Calendar.Location = berlin
	others["zone"] = limitPrint(sluice.FixedWindow, day)
	for what, p := range others {
		if p == want {
			t.Errorf("another %s prints as the limit", what)
		}
	}
	if others["zone"] == others["calendar"] {
		t.Error("a calendar in another zone prints as UTC's")
	}
}

// The seeds table keeps most keys up to its bound: two slots per hash
// keep about 84 % of 11000 keys in 16384 slots, where one slot per hash
// would keep 73 % (each figure many standard deviations from the 79 %
// asserted), and it never grows.
func TestSeedTableKeepsKeys(t *testing.T) {
	tbl := newSeedTable(16384)
	const keys = 11000
	for i := range keys {
		tbl.put("k"+strconv.Itoa(i), 1, seed{remaining: int64(i), at: int64(i)})
	}
	kept := 0
	for i := range keys {
		if s, ok := tbl.take("k" + strconv.Itoa(i)); ok {
			if s.remaining != int64(i) {
				t.Fatalf("key %d: seed of another key %+v", i, s)
			}
			kept++
		}
	}
	if kept < keys*79/100 {
		t.Errorf("%d of %d keys kept, want ≥ 79 %%", kept, keys)
	}
	if n := len(tbl.pages) * seedPageSlots; n != 16384 {
		t.Errorf("%d slots, want 16384", n)
	}
	for n, want := range map[int]int{0: 1024, 1000: 1024, 1025: 2048, 100_000: 1 << 17, 1 << 40: maxSeedSlots} {
		if got := len(newSeedTable(n).pages) * seedPageSlots; got != want {
			t.Errorf("newSeedTable(%d): %d slots, want %d", n, got, want)
		}
	}
}
