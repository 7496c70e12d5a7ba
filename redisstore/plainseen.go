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
// It is a 2-way set-associative table of 64-bit tags, each a hash of a
// base name and a window's start: a base hashes to a bucket of two
// adjacent slots, and asking and recording are atomic loads and a store,
// with no lock, no allocation and no copy of the name. Keys that share a
// full bucket take its slots from each other (a forgotten key: one more
// round trip); a tag that matches another key's (1 in 2^64) would send its
// first command as INCRBY, which the INCRBY-answers-1 case mends.
type plainSeen struct {
	seed  maphash.Seed
	slots [plainSeenSlots]atomic.Uint64
}

// plainSeenSlots bounds the memory: 262 144 keys, 2 MiB, allocated only
// by a store with Options.PlainWindows. Of 100 000 keys in use it keeps
// about 93 % (a bucket holds two of the keys that hash to it).
const plainSeenSlots = 1 << 18

func newPlainSeen() *plainSeen {
	return &plainSeen{seed: maphash.MakeSeed()}
}

// bucket returns base's two slots and the tag of its window starting at
// start: the tag's high 40 bits are the base's (baseMask), its low 24 the
// window's, and it is never 0, which marks an empty slot.
func (p *plainSeen) bucket(base string, start int64) (*[2]atomic.Uint64, uint64) {
	h := maphash.String(p.seed, base)
	// The bucket is h's top 17 bits; the tag's base part is h's low 40
	// bits, so that two bases of one bucket share a tag once in 2^40.
	tag := (h<<24)&baseMask | (uint64(start)*0x9e3779b97f4a7c15)>>40 | 1
	i := (h >> (64 - 17)) * 2 // 2^17 buckets
	return (*[2]atomic.Uint64)(p.slots[i : i+2]), tag
}

// baseMask selects the bits of a tag that name its base.
const baseMask = ^uint64(1<<24 - 1)

// has reports whether base's key of the window starting at start is
// known to exist.
func (p *plainSeen) has(base string, start int64) bool {
	b, tag := p.bucket(base, start)
	return b[0].Load() == tag || b[1].Load() == tag
}

// add records that base's key of the window starting at start exists: in
// the slot of the base's older window, else an empty one, else one chosen
// by the tag's bits.
func (p *plainSeen) add(base string, start int64) {
	b, tag := p.bucket(base, start)
	s0, s1 := b[0].Load(), b[1].Load()
	switch {
	case s0 == tag || s1 == tag:
	case s0&baseMask == tag&baseMask:
		b[0].Store(tag)
	case s1&baseMask == tag&baseMask:
		b[1].Store(tag)
	case s0 == 0:
		b[0].Store(tag)
	case s1 == 0:
		b[1].Store(tag)
	default:
		b[tag>>1&1].Store(tag)
	}
}

// forget drops base's keys, of any window (they were reset), with any
// other base's that share its bucket.
func (p *plainSeen) forget(base string) {
	b, _ := p.bucket(base, 0)
	b[0].Store(0)
	b[1].Store(0)
}
