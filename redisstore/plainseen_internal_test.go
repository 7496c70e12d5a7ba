package redisstore

import (
	"strconv"
	"sync"
	"testing"
)

// The memory of seen window keys stays within its bound, keeps what it
// was told last, forgets on demand, and costs no allocation to ask or to
// update a key it holds.
func TestPlainSeen(t *testing.T) {
	p := newPlainSeen()
	if p.has("a", 1) {
		t.Fatal("an empty memory has a key")
	}
	p.add("a", 1)
	if !p.has("a", 1) || p.has("a", 2) {
		t.Fatal("has after add")
	}
	p.add("a", 2) // the next window
	if p.has("a", 1) || !p.has("a", 2) {
		t.Fatal("has after the next window's add")
	}
	p.forget("a")
	if p.has("a", 2) {
		t.Fatal("has after forget")
	}
	const n = 200_000
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 4 {
				b := "fw{k" + strconv.Itoa(i) + "}"
				p.add(b, 7)
				p.has(b, 7)
			}
		}()
	}
	wg.Wait()
	// The table is its bound: count the keys it still knows, of the
	// 200 000 cold ones added, and the slots in use.
	known, used := 0, 0
	for i := range n {
		if p.has("fw{k"+strconv.Itoa(i)+"}", 7) {
			known++
		}
	}
	for i := range p.slots {
		if p.slots[i].Load() != 0 {
			used++
		}
	}
	if known > plainSeenSlots || known != used || used < n*7/10 {
		t.Fatalf("%d keys known, %d slots used, of %d slots", known, used, plainSeenSlots)
	}
	// 100 000 keys in use: a fresh memory keeps about 93 % of them, and
	// about as many in their next window, whose tags take the slots of
	// the older window's (the memory full of 200 000 others' tags keeps
	// fewer: about 88 %).
	kept := func(p *plainSeen, start int64) int {
		for i := range 100_000 {
			p.add("fw{k"+strconv.Itoa(i)+"}", start)
		}
		n := 0
		for i := range 100_000 {
			if p.has("fw{k"+strconv.Itoa(i)+"}", start) {
				n++
			}
		}
		return n
	}
	fresh := newPlainSeen()
	for w := range int64(2) {
		if k := kept(fresh, w+1); k < 91_000 {
			t.Fatalf("window %d: %d of 100 000 keys known, want at least 91 000", w+1, k)
		}
	}
	if k := kept(p, 8); k < 80_000 {
		t.Fatalf("after 200 000 others: %d of 100 000 keys known", k)
	}
	// The key added last, after the concurrent adds (k199999 was not: the
	// other workers could still evict it from its full shard).
	b := "fw{last}"
	p.add(b, 7)
	if !p.has(b, 7) {
		t.Fatal("the last key added is gone")
	}
	if a := testing.AllocsPerRun(1000, func() {
		if p.has(b, 7) {
			p.add(b, 8)
			p.add(b, 7)
		}
	}); a != 0 {
		t.Fatalf("%.1f allocations to ask and update", a)
	}
	if a := testing.AllocsPerRun(1000, func() { p.add(strconv.Itoa(1), 1); p.forget("1") }); a > 1 {
		t.Fatalf("%.1f allocations to add a new key and forget it", a)
	}
}

// BenchmarkPlainSeen: the memory's cost per plain decision (ask, then
// record), on a full memory of cold keys.
func BenchmarkPlainSeen(b *testing.B) {
	p := newPlainSeen()
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = "fw{rls:{edge}:remote_address=10.0." + strconv.Itoa(i) + "}"
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			k := keys[i%len(keys)]
			if !p.has(k, 1) {
				p.add(k, 1)
			}
			i += 7
		}
	})
}
