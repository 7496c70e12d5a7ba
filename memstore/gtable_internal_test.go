package memstore

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"
)

// checkLoad fails unless every shard of g holds want cells in a slot array
// filled to between a third and three quarters (gslotBytes relies on the
// third), or is at its smallest.
func checkLoad(t *testing.T, g *gtable, want int) {
	t.Helper()
	n := 0
	for k := range g.shards {
		sh := &g.shards[k]
		size := len(sh.tab.Load().s)
		if size > gminSlots && (sh.live*3 < size || sh.used*4 > size*3) {
			t.Errorf("shard %d: %d cells (%d slots used) in %d slots", k, sh.live, sh.used, size)
		}
		n += sh.live
	}
	if n != want {
		t.Errorf("%d cells, want %d", n, want)
	}
}

// TestGtableGrowShrink: keys inserted are found and counted once; deleted
// ones are gone, the others still found past the tombstones; the tables
// stay between a third and three quarters full as they grow and shrink.
func TestGtableGrowShrink(t *testing.T) {
	g := newGtable()
	const n = 20_000
	for i := range n {
		c, added := g.loadOrCreate("k"+strconv.Itoa(i), int64(i))
		if !added || c.key() != "k"+strconv.Itoa(i) || c.spanNs() != int64(float32(i)) {
			t.Fatalf("key %d: added %v, cell key %q span %d", i, added, c.key(), c.spanNs())
		}
		if _, added := g.loadOrCreate("k"+strconv.Itoa(i), 0); added {
			t.Fatalf("key %d created twice", i)
		}
	}
	checkLoad(t, g, n)
	// Delete all but every tenth key.
	gone := g.deleteMatching(func(c *gcell) bool {
		i, _ := strconv.Atoi(c.key()[1:])
		return i%10 != 0
	})
	if gone != n-n/10 {
		t.Fatalf("deleted %d, want %d", gone, n-n/10)
	}
	checkLoad(t, g, n/10)
	for i := range n {
		c, _ := g.load("k" + strconv.Itoa(i))
		if (c != nil) != (i%10 == 0) {
			t.Fatalf("key %d found %v after deleting", i, c != nil)
		}
	}
	// Keys deleted and inserted again reuse the table.
	for i := range n {
		if i%10 != 0 {
			g.loadOrCreate("k"+strconv.Itoa(i), 1)
		}
	}
	checkLoad(t, g, n)
	g.deleteMatching(func(*gcell) bool { return true })
	checkLoad(t, g, 0)
	for k := range g.shards {
		if size := len(g.shards[k].tab.Load().s); size != gminSlots {
			t.Fatalf("shard %d of an empty table holds %d slots", k, size)
		}
	}
	if c, _ := g.load(""); c != nil {
		t.Fatal("the empty key found in an empty table")
	}
}

// TestGtableConcurrent: goroutines creating the same keys at once, while
// others read them and a sweeper deletes, create each key once at a time
// and always find a key's one cell.
func TestGtableConcurrent(t *testing.T) {
	g := newGtable()
	const n, workers = 3000, 4
	var created atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				k := "k" + strconv.Itoa((i*7+w)%n)
				c, added := g.loadOrCreate(k, 1)
				if added {
					created.Add(1)
				}
				if c.key() != k {
					t.Errorf("cell of %q holds %q", k, c.key())
					return
				}
				if c2, _ := g.load(k); c2 != nil && c2 != c && c.tat.Load() != dead {
					t.Errorf("two live cells for %q", k)
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 20 {
			g.deleteMatching(func(c *gcell) bool {
				if c.key()[1] == '1' && c.tat.CompareAndSwap(0, dead) {
					created.Add(-1)
					return true
				}
				return false
			})
		}
	}()
	wg.Wait()
	live := 0
	for k := range g.shards {
		live += g.shards[k].live
	}
	if int64(live) != created.Load() {
		t.Fatalf("%d cells held, %d created and not deleted", live, created.Load())
	}
}

// TestGcellKeyCopied: a cell holds its own copy of the key, so a caller's
// buffer is neither kept nor read later.
func TestGcellKeyCopied(t *testing.T) {
	g := newGtable()
	buf := []byte("a key in a request body")
	c, _ := g.loadOrCreate(unsafe.String(&buf[0], 5), 1) // aliases buf
	copy(buf, "XXXXX")
	if c.key() != "a key" {
		t.Fatalf("cell key %q", c.key())
	}
	if c2, _ := g.load("a key"); c2 != c {
		t.Fatal("key not found by value")
	}
}
