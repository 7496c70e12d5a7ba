package redisstore

import (
	"hash/maphash"
	"sync/atomic"
)

// plainSeen is a store's bounded memory of the window keys it knows
// exist. A key seen in the current window goes straight to INCRBY; one
// not seen takes SET NX first. It only saves round trips: a forgotten key
// costs one more, and a remembered one that vanished (a reset by another
// store, a refund to 0, eviction) is recreated by INCRBY, which the plain
// path then gives a TTL.
//
// It is a direct-mapped table of 64-bit tags, one per slot, each a hash
// of a base name and a window's start: asking and recording are one
// atomic load or store, with no lock, no allocation and no copy of the
// name. Two keys that share a slot take it from each other (a forgotten
// key: one more round trip); a tag that matches another key's (1 in 2^64)
// would send its first command as INCRBY, which the INCRBY-answers-1 case
// mends.
type plainSeen struct {
	seed  maphash.Seed
	slots [plainSeenSlots]atomic.Uint64
}

// plainSeenSlots bounds the memory: 65 536 keys, 512 KiB.
const plainSeenSlots = 1 << 16

func newPlainSeen() *plainSeen {
	return &plainSeen{seed: maphash.MakeSeed()}
}

// slot returns base's slot and the tag of its window starting at start
// (never 0, which marks an empty slot).
func (p *plainSeen) slot(base string, start int64) (*atomic.Uint64, uint64) {
	h := maphash.String(p.seed, base)
	// The window mixes into the tag only, so that a base keeps its slot
	// from one window to the next and its old tag is overwritten.
	tag := (h ^ uint64(start)*0x9e3779b97f4a7c15) | 1
	return &p.slots[h>>48], tag
}

// has reports whether base's key of the window starting at start is
// known to exist.
func (p *plainSeen) has(base string, start int64) bool {
	s, tag := p.slot(base, start)
	return s.Load() == tag
}

// add records that base's key of the window starting at start exists.
func (p *plainSeen) add(base string, start int64) {
	s, tag := p.slot(base, start)
	if s.Load() != tag {
		s.Store(tag)
	}
}

// forget drops base's keys, of any window (they were reset); another
// base that shares the slot is forgotten with it.
func (p *plainSeen) forget(base string) {
	s, _ := p.slot(base, 0)
	s.Store(0)
}
