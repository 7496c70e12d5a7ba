package guard

import (
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/sluice-io/sluice"
)

// seedTable keeps, per key, the store's last answer for Local to seed
// from: a fixed table of slots indexed by the key's hash, its pages
// allocated on first use. A key whose slot another key took is simply not
// remembered, as a key past a map's bound would not be: Local then starts
// it from its full share, as it does a key the store never answered.
//
// It is on the path of every answer of the store, on every key: a map of
// strings cost an allocation per new key, a trim per quarter of the
// bound, and a live string per key for the collector to scan. Slots hold
// no pointer (the key is its 64-bit hash, the limit a fingerprint), so
// the collector skips the table, and a write takes one striped lock.
type seedTable struct {
	pages []atomic.Pointer[seedPage]
	shift uint // a hash's top bits pick its slot
	locks [seedLocks]sync.Mutex
}

const (
	seedPageSlots = 1 << 10
	// seedLocks stripes the slots' locks: slot i is under locks[i%seedLocks].
	seedLocks = 256
)

type seedPage [seedPageSlots]seedSlot

// seedSlot is one key's seed; tag 0 marks an empty slot.
type seedSlot struct {
	tag   uint64 // the key's hash, never 0
	print uint64 // fingerprint of the algorithm and limit it answered for
	seed
}

// newSeedTable holds up to n keys: n rounded up to a power of two slots,
// at least one page.
func newSeedTable(n int) *seedTable {
	slots := max(seedPageSlots, 1<<bits.Len(uint(max(n, 1)-1)))
	return &seedTable{
		pages: make([]atomic.Pointer[seedPage], slots/seedPageSlots),
		shift: uint(64 - bits.Len(uint(slots-1))),
	}
}

// slot returns the slot of hash h and the lock that guards it; with
// alloc false it returns nil when h's page was never written.
func (t *seedTable) slot(h uint64, alloc bool) (*seedSlot, *sync.Mutex) {
	i := h >> t.shift
	p := &t.pages[i/seedPageSlots]
	page := p.Load()
	if page == nil {
		if !alloc {
			return nil, nil
		}
		p.CompareAndSwap(nil, new(seedPage))
		page = p.Load()
	}
	return &page[i%seedPageSlots], &t.locks[i%seedLocks]
}

// keyHash is key's tag in the table, never 0.
func keyHash(key string) uint64 {
	return max(1, maphash.String(keySeed, key))
}

// limitPrint is the fingerprint of an algorithm and a limit; equal ones
// print equal (a calendar by its zone's pointer, as Limit's == compares).
func limitPrint(a sluice.Algorithm, l sluice.Limit) uint64 {
	return maphash.Comparable(keySeed, struct {
		a sluice.Algorithm
		l sluice.Limit
	}{a, l})
}

// put keeps s as key's seed, over whatever its slot held.
func (t *seedTable) put(key string, print uint64, s seed) {
	h := keyHash(key)
	sl, mu := t.slot(h, true)
	mu.Lock()
	*sl = seedSlot{tag: h, print: print, seed: s}
	mu.Unlock()
}

// take returns key's seed if it was not taken since it was put, and marks
// it taken.
func (t *seedTable) take(key string) (seedSlot, bool) {
	h := keyHash(key)
	sl, mu := t.slot(h, false)
	if sl == nil {
		return seedSlot{}, false
	}
	mu.Lock()
	defer mu.Unlock()
	if sl.tag != h || sl.applied {
		return seedSlot{}, false
	}
	s := *sl
	sl.applied = true
	return s, true
}

// drop forgets key's seed.
func (t *seedTable) drop(key string) {
	h := keyHash(key)
	sl, mu := t.slot(h, false)
	if sl == nil {
		return
	}
	mu.Lock()
	if sl.tag == h {
		*sl = seedSlot{}
	}
	mu.Unlock()
}
