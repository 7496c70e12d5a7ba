package memstore

import (
	"slices"
	"unsafe"

	"github.com/sluice-io/sluice/algo"
)

// Memory accounting.
//
// The store adds up what its keys take on the heap, as the Go allocator
// rounds it, and evicts past Options.MaxBytes (evict.go). A GCRA key costs
// its cell, a 16-byte header and a copy of the key's bytes in one
// allocation (its size class), and its slot in the GCRA table (gslotBytes,
// gtable.go). Another algorithm's key costs
//
//	its key string, copied on insert (the allocator's size class of its length)
//	+ a map entry (the key's header and a pointer: 24 bytes)
//	+ its share of the map's table (tableBytes; xsync.Map keeps 5 entries
//	  to a 64-byte bucket, filled to at most 75%, and doubles: 17 to 34
//	  bytes an entry, and both tables while it grows)
//	+ its cell (128 bytes) and the slices its state holds: a sliding log's
//	  runs (16 bytes each) and a concurrency key's leases (32 bytes each
//	  and their IDs).
//
// TestBytesPerKey measures the heap a key really takes, per algorithm,
// against this account; docs/redis.md gives the figures.

const (
	// DefaultMaxBytes bounds the accounted bytes. Under Go's default GOGC
	// (100) a flood holds RSS at about 2.7 times this over the idle
	// process (make flood: 2.62; docs/redis.md): sluice serve's 27 MiB +
	// 173 MiB, which fits a 256 MiB container with room for the requests
	// in flight.
	DefaultMaxBytes = 64 << 20
	// entryBytes is an xsync.Map entry: a string header and a pointer.
	entryBytes = 24
	// tableBytes is an entry's share of the map's table, at worst: a
	// 64-byte bucket holds 5 entries and the table doubles at 75% full, so
	// just after doubling 64/(5·0.75/2) ≈ 34 bytes; 40 leaves room for
	// the overflow buckets of a skewed hash.
	tableBytes = 40
	// gslotBytes is a GCRA key's share of its table's slots (gtable.go).
	gslotBytes = 24
)

// Bytes returns the heap bytes the store accounts for its keys and their
// state (see MaxBytes).
func (s *Store) Bytes() int64 { return s.bytes.Load() }

// gcraBytes is the accounted size of a GCRA key whose key string has n
// bytes: its cell, which holds the key (gtable.go), and its slot in a
// table kept more than a third full (8 ÷ 1/3 = 24 bytes).
func gcraBytes(n int) int64 {
	return gcellBytes(n) + gslotBytes
}

// cellBytes is the accounted size of a non-GCRA key whose key string has n
// bytes and whose state is st (nil for an empty state).
func cellBytes(n int, st *algo.State) int64 {
	b := allocSize(n) + entryBytes + tableBytes + allocSize(int(unsafe.Sizeof(cell{})))
	if st == nil {
		return b
	}
	if c := cap(st.Log); c > 0 {
		b += allocSize(c * int(unsafe.Sizeof(algo.Run{})))
	}
	if c := cap(st.Leases); c > 0 {
		b += allocSize(c * int(unsafe.Sizeof(algo.Lease{})))
		for _, l := range st.Leases {
			b += allocSize(len(l.ID))
		}
	}
	return b
}

// sizeClasses are the Go allocator's small object sizes (runtime/sizeclasses.go).
var sizeClasses = [...]int{8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256, 288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 896, 1024, 1152, 1280, 1408, 1536, 1792, 2048, 2304, 2688, 3072, 3200, 3456, 4096, 4864, 5376, 6144, 6528, 6784, 6912, 8192, 9472, 9728, 10240, 10880, 12288, 13568, 14336, 16384, 18432, 19072, 20480, 21760, 24576, 27264, 28672, 32768}

// allocSize is what the allocator takes for an object of n bytes: its size
// class, or whole 8 KiB pages past 32 KiB. Objects under 16 bytes without
// pointers share 16-byte blocks; they are counted as 16.
func allocSize(n int) int64 {
	if n <= 0 {
		return 0
	}
	if n < 16 {
		return 16
	}
	if n > sizeClasses[len(sizeClasses)-1] {
		return int64((n + 8191) &^ 8191)
	}
	i, _ := slices.BinarySearch(sizeClasses[:], n)
	return int64(sizeClasses[i])
}
