package memstore

import (
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"unsafe"
)

// The GCRA keys' table.
//
// A GCRA key is one allocation without pointers, which the collector never
// scans: its state (a gcell: the theoretical arrival time, the refill time
// of its burst, the key's length) followed by a copy of the key's bytes.
// The table finds it by the key's hash among gshards shards, each an
// open-addressed array of pointers to cells, probed linearly. A key thus
// costs its cell (16 bytes and the key, in the allocator's size class) and
// a slot of 8 bytes in a table kept between a third and three quarters
// full: no map entry, no separate key string (xsync.Map took 24 bytes of
// entry, a copied key and a 16-byte cell besides its table: 78.8 bytes a
// key at 100k keys, against 46 here; see docs/BENCHMARKS.md).
//
// Reads take no lock: a lookup loads the shard's slot array and then the
// slots, each atomically. Inserts and deletes lock their shard. A shard
// grows (or, after evictions, shrinks) by building a new array and
// publishing it; a reader still on the old one sees the cells it held,
// which stay valid, and a reader that misses a key just inserted goes on
// to insert it, under the lock, where it finds it. A deleted key's slot
// holds the table's tombstone, so that the probes past it go on; a
// deleted cell's TAT is set to dead first (memstore.go), so that a reader
// who already held it looks the key up again.

const (
	gshardBits = 6
	gshards    = 1 << gshardBits
	gminSlots  = 8
	// gcellSize is a cell's header; the key's bytes follow it.
	gcellSize = int(unsafe.Sizeof(gcell{}))
)

// gcell is a GCRA key's state, followed in memory by its key's bytes.
type gcell struct {
	tat  atomic.Int64
	span atomic.Uint32 // refill time of the whole burst, ns, as float32 bits (evict.go)
	klen uint32
}

// newGcell returns a cell for key, whose limit's burst refills in span.
func newGcell(key string, span int64) *gcell {
	// One word more than the header and key need only for an empty key,
	// so that the key's address stays inside the allocation.
	words := make([]uint64, (gcellSize+max(len(key), 1)+7)/8)
	c := (*gcell)(unsafe.Pointer(&words[0]))
	c.klen = uint32(len(key))
	copy(unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(c), gcellSize)), len(key)), key)
	c.span.Store(math.Float32bits(float32(span)))
	return c
}

// gcellBytes is what newGcell allocates for a key of n bytes.
func gcellBytes(n int) int64 {
	return allocSize((gcellSize + max(n, 1) + 7) / 8 * 8)
}

// key returns c's key, which shares c's memory.
func (c *gcell) key() string {
	return unsafe.String((*byte)(unsafe.Add(unsafe.Pointer(c), gcellSize)), int(c.klen))
}

// setSpan records the burst's refill time of the limit that last charged
// c, if it changed.
func (c *gcell) setSpan(span int64) {
	if b := math.Float32bits(float32(span)); c.span.Load() != b {
		c.span.Store(b)
	}
}

// spanNs is the refill time setSpan recorded, in ns (float32 precision).
func (c *gcell) spanNs() int64 {
	return int64(math.Float32frombits(c.span.Load()))
}

//go:linkname strhash runtime.strhash
//go:noescape
func strhash(p unsafe.Pointer, h uintptr) uintptr

// gtable maps GCRA keys to their cells (see above).
type gtable struct {
	seed   uintptr // of the keys' hash, random per table
	tomb   gcell   // the address of a deleted key's slot
	shards [gshards]gshard
}

type gshard struct {
	tab  atomic.Pointer[gslots]
	mu   sync.Mutex
	live int // cells in tab; guarded by mu
	used int // slots not nil (cells and tombstones); guarded by mu
	_    [64 - 8 - 8 - 16]byte
}

type gslots struct {
	s []atomic.Pointer[gcell] // a power of two long
}

func newGtable() *gtable {
	g := &gtable{seed: uintptr(rand.Uint64())}
	for i := range g.shards {
		g.shards[i].tab.Store(&gslots{s: make([]atomic.Pointer[gcell], gminSlots)})
	}
	return g
}

// hash is key's hash: the runtime's string hash (AES-based where the CPU
// has it, as Go's maps use), seeded per table so that callers cannot pick
// keys that collide. hash/maphash.String computes the same hash with 40
// more instructions of wrapping.
func (g *gtable) hash(key string) uint64 {
	return uint64(strhash(unsafe.Pointer(&key), g.seed))
}

func (g *gtable) shard(h uint64) *gshard { return &g.shards[h>>(64-gshardBits)] }

// load returns key's cell, or nil, and key's hash.
func (g *gtable) load(key string) (*gcell, uint64) {
	h := g.hash(key)
	t := g.shard(h).tab.Load()
	m := uint64(len(t.s) - 1)
	for i := h & m; ; i = (i + 1) & m {
		c := t.s[i].Load()
		if c == nil {
			return nil, h
		}
		if int(c.klen) == len(key) && c != &g.tomb && c.key() == key {
			return c, h
		}
	}
}

// loadOrCreate returns key's cell, creating it (for a limit whose burst
// refills in span) if key is new, and reports whether it did.
func (g *gtable) loadOrCreate(key string, span int64) (*gcell, bool) {
	c, h := g.load(key)
	if c != nil {
		return c, false
	}
	sh := g.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.used+1 > len(sh.tab.Load().s)*3/4 {
		g.rehash(sh, sh.live+1)
	}
	t := sh.tab.Load()
	m := uint64(len(t.s) - 1)
	free := -1
	for i := h & m; ; i = (i + 1) & m {
		c := t.s[i].Load()
		if c == nil {
			if free < 0 {
				free = int(i)
				sh.used++
			}
			break
		}
		if c == &g.tomb {
			if free < 0 {
				free = int(i)
			}
			continue
		}
		if int(c.klen) == len(key) && c.key() == key {
			return c, false // inserted since load
		}
	}
	c = newGcell(key, span)
	t.s[free].Store(c)
	sh.live++
	return c, true
}

// rehash gives sh a new slot array, the smallest that n cells fill to at
// most 2/3, holding its cells without tombstones: more than a third full
// (past gminSlots), which a shard stays until it grows at 3/4 (to 3/8) or
// shrinks under 1/3 (deleteMatching). So a slot costs at most 24 bytes a
// key (gslotBytes). sh.mu must be held.
func (g *gtable) rehash(sh *gshard, n int) {
	size := gminSlots
	for n*3 > size*2 {
		size *= 2
	}
	old := sh.tab.Load()
	t := &gslots{s: make([]atomic.Pointer[gcell], size)}
	m := uint64(size - 1)
	for i := range old.s {
		c := old.s[i].Load()
		if c == nil || c == &g.tomb {
			continue
		}
		j := g.hash(c.key()) & m
		for t.s[j].Load() != nil {
			j = (j + 1) & m
		}
		t.s[j].Store(c)
	}
	sh.used = sh.live
	sh.tab.Store(t)
}

// deleteMatching removes every cell for which del reports true, calling
// it under the cell's shard lock, and returns how many it removed. A
// shard left less than a third full shrinks.
func (g *gtable) deleteMatching(del func(c *gcell) bool) int {
	n := 0
	for k := range g.shards {
		sh := &g.shards[k]
		sh.mu.Lock()
		t := sh.tab.Load()
		for i := range t.s {
			c := t.s[i].Load()
			if c == nil || c == &g.tomb || !del(c) {
				continue
			}
			t.s[i].Store(&g.tomb)
			sh.live--
			n++
		}
		if len(t.s) > gminSlots && sh.live*3 < len(t.s) {
			g.rehash(sh, sh.live)
		}
		sh.mu.Unlock()
	}
	return n
}

// rangeCells calls f on cells, shard by shard without locks, while f
// reports true.
func (g *gtable) rangeCells(f func(c *gcell) bool) {
	for k := range g.shards {
		t := g.shards[k].tab.Load()
		for i := range t.s {
			if c := t.s[i].Load(); c != nil && c != &g.tomb && !f(c) {
				return
			}
		}
	}
}
