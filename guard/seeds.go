package guard

import (
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/sluice-io/sluice"
)

// seedTable keeps, per key, the store's last answer for Local to seed
// from: a fixed table of slots, its pages allocated on first use. A key
// may sit in either slot of the pair its hash picks (2-way set
// associative); a new key takes an empty one, else the one answered
// longer ago. A key pushed out is simply not remembered, as a key past a
// map's bound would not be: Local then starts it from its full share, as
// it does a key the store never answered.
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
	// seedLocks stripes the locks: the pair of slots i is under
	// locks[(i/2)%seedLocks].
	seedLocks = 256
)

type seedPage [seedPageSlots]seedSlot

// seedSlot is one key's seed; tag 0 marks an empty slot.
type seedSlot struct {
	tag   uint64 // the key's hash, never 0
	print uint64 // fingerprint of the algorithm and limit it answered for
	seed
}

// maxSeedSlots bounds the table whatever LocalMaxKeys says (an operator's
// 10^12 would otherwise be 8 GB of page pointers at start): 4 Mi slots,
// 192 MiB when every page is written.
const maxSeedSlots = 1 << 22

// newSeedTable holds up to n keys: n rounded up to a power of two slots,
// at least one page and at most maxSeedSlots.
func newSeedTable(n int) *seedTable {
	slots := max(seedPageSlots, 1<<bits.Len(uint(min(max(n, 1), maxSeedSlots)-1)))
	return &seedTable{
		pages: make([]atomic.Pointer[seedPage], slots/seedPageSlots),
		shift: uint(64 - bits.Len(uint(slots-1))),
	}
}

// pair returns the two slots hash h may sit in and the lock that guards
// them; with alloc false it returns nil when their page was never written.
func (t *seedTable) pair(h uint64, alloc bool) (*[2]seedSlot, *sync.Mutex) {
	i := h >> t.shift &^ 1
	p := &t.pages[i/seedPageSlots]
	page := p.Load()
	if page == nil {
		if !alloc {
			return nil, nil
		}
		p.CompareAndSwap(nil, new(seedPage))
		page = p.Load()
	}
	return (*[2]seedSlot)(page[i%seedPageSlots:]), &t.locks[i/2%seedLocks]
}

// seedIn returns the slot of the pair holding tag h, or nil.
func seedIn(pr *[2]seedSlot, h uint64) *seedSlot {
	for i := range pr {
		if pr[i].tag == h {
			return &pr[i]
		}
	}
	return nil
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

// put keeps s as key's seed: in its slot, else in an empty one of the
// pair, else over the one answered longer ago.
func (t *seedTable) put(key string, print uint64, s seed) {
	h := keyHash(key)
	pr, mu := t.pair(h, true)
	mu.Lock()
	sl := seedIn(pr, h)
	switch {
	case sl != nil:
	case pr[0].tag == 0:
		sl = &pr[0]
	case pr[1].tag == 0 || pr[1].at < pr[0].at:
		sl = &pr[1]
	default:
		sl = &pr[0]
	}
	*sl = seedSlot{tag: h, print: print, seed: s}
	mu.Unlock()
}

// take returns key's seed if it was not taken since it was put, and marks
// it taken.
func (t *seedTable) take(key string) (seedSlot, bool) {
	h := keyHash(key)
	pr, mu := t.pair(h, false)
	if pr == nil {
		return seedSlot{}, false
	}
	mu.Lock()
	defer mu.Unlock()
	sl := seedIn(pr, h)
	if sl == nil || sl.applied {
		return seedSlot{}, false
	}
	s := *sl
	sl.applied = true
	return s, true
}

// drop forgets key's seed.
func (t *seedTable) drop(key string) {
	h := keyHash(key)
	pr, mu := t.pair(h, false)
	if pr == nil {
		return
	}
	mu.Lock()
	if sl := seedIn(pr, h); sl != nil {
		*sl = seedSlot{}
	}
	mu.Unlock()
}
