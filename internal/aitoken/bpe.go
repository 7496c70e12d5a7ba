package aitoken

import (
	"fmt"
	"math"
	"sync"

	"github.com/tiktoken-go/tokenizer"
)

// Encoding names a byte-pair-encoding vocabulary of OpenAI's tiktoken.
type Encoding string

// The encodings the package embeds (through github.com/tiktoken-go/tokenizer,
// which generates its vocabularies from OpenAI's published files).
const (
	// Cl100kBase is the vocabulary of gpt-4, gpt-3.5-turbo and
	// text-embedding-3/ada-002.
	Cl100kBase Encoding = "cl100k_base"
	// O200kBase is the vocabulary of gpt-4o, gpt-4.1, gpt-5 and the
	// o-series.
	O200kBase Encoding = "o200k_base"
)

// vocab is one encoding's merge ranks (a token's rank is its id) and its
// pre-tokenizer.
type vocab struct {
	ranks map[string]uint32
	split func(string, func(string))
}

// counters loads each encoding once, when it is first used: about 0.1 s
// and 10-20 MiB of heap each. They are read-only afterwards.
var counters = map[Encoding]func() (*Counter, error){
	Cl100kBase: sync.OnceValues(func() (*Counter, error) { return newCounter(Cl100kBase, tokenizer.Cl100kBase, splitCL100K) }),
	O200kBase:  sync.OnceValues(func() (*Counter, error) { return newCounter(O200kBase, tokenizer.O200kBase, splitO200K) }),
}

func newCounter(enc Encoding, lib tokenizer.Encoding, split func(string, func(string))) (*Counter, error) {
	v, err := loadVocab(lib, split)
	if err != nil {
		return nil, err
	}
	return &Counter{enc: enc, v: v}, nil
}

// loadVocab reads the ranks of enc out of the tokenizer library, whose
// vocabulary maps are private: decoding each id gives its token's bytes.
func loadVocab(enc tokenizer.Encoding, split func(string, func(string))) (*vocab, error) {
	codec, err := tokenizer.Get(enc)
	if err != nil {
		return nil, fmt.Errorf("aitoken: load %s: %w", enc, err)
	}
	v := &vocab{ranks: make(map[string]uint32, 200_000), split: split}
	miss := 0
	for id := uint(0); miss < 1024; id++ { // the ids are dense; specials come after a gap
		tok, err := codec.Decode([]uint{id})
		if err != nil || tok == "" {
			miss++
			continue
		}
		miss = 0
		v.ranks[tok] = uint32(id)
	}
	if len(v.ranks) < 50_000 {
		return nil, fmt.Errorf("aitoken: load %s: only %d tokens", enc, len(v.ranks))
	}
	return v, nil
}

// count returns the number of tokens of s. Each piece is merged whole,
// as tiktoken does, however long: a run of one character class (a
// base64 blob, a word of 300 kana, a megabyte of spaces sent to burn CPU)
// is one piece, and mergeHeap keeps its cost O(n log n) in its length n,
// with 20 bytes of scratch per byte (at most about 5 MiB for the
// MaxExactBytes one request tokenizes), reused across calls.
func (v *vocab) count(s string) int64 {
	var n int64
	v.split(s, func(piece string) {
		if _, ok := v.ranks[piece]; ok {
			n++
			return
		}
		n += int64(v.merge(piece))
	})
	return n
}

const noRank = math.MaxUint32

// merge returns the number of tokens that byte-pair encoding makes of
// piece: starting from single bytes, the adjacent pair whose joined bytes
// have the lowest rank is merged, leftmost first, until no pair is a
// token. Short pieces use a quadratic scan, long ones (a run of letters
// can be the whole body) a heap, so that the cost stays O(n log n).
func (v *vocab) merge(piece string) int {
	if len(piece) <= 1 {
		return len(piece)
	}
	if len(piece) < 64 {
		return v.mergeScan(piece)
	}
	return v.mergeHeap(piece)
}

func (v *vocab) rank(s string) uint32 {
	if r, ok := v.ranks[s]; ok {
		return r
	}
	return noRank
}

func (v *vocab) mergeScan(piece string) int {
	// starts[k] is where part k starts; ranks[k] the rank of parts k and
	// k+1 joined.
	var sbuf [65]int32
	var rbuf [64]uint32
	n := len(piece)
	starts := sbuf[:n+1]
	ranks := rbuf[:n]
	for k := range n + 1 {
		starts[k] = int32(k)
	}
	pair := func(k int) uint32 {
		if k+2 >= len(starts) {
			return noRank
		}
		return v.rank(piece[starts[k]:starts[k+2]])
	}
	for k := range n - 1 {
		ranks[k] = pair(k)
	}
	ranks[n-1] = noRank
	for len(starts) > 2 {
		best, at := uint32(noRank), -1
		for k, r := range ranks[:len(starts)-2] {
			if r < best {
				best, at = r, k
			}
		}
		if at < 0 {
			break
		}
		// Join parts at and at+1.
		starts = append(starts[:at+1], starts[at+2:]...)
		ranks = append(ranks[:at+1], ranks[at+2:]...)
		ranks[at] = pair(at)
		if at > 0 {
			ranks[at-1] = pair(at - 1)
		}
	}
	return len(starts) - 1
}

// heapScratch is mergeHeap's working memory, kept in scratchPool.
type heapScratch struct {
	next, prev []int32
	cur        []uint32
	h          pairHeap
}

// scratchPool keeps mergeHeap's scratch between calls.
var scratchPool = sync.Pool{New: func() any { return new(heapScratch) }}

// grow returns b resized to n, reallocated only when too small.
func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

// mergeHeap is mergeScan with the parts in a linked list and the
// candidate pairs in a min-heap of (rank, start), stale entries skipped:
// O(n log n) for a piece of n bytes (each merge pops one entry and pushes
// at most two), as tiktoken's path for large pieces.
func (v *vocab) mergeHeap(piece string) int {
	n := int32(len(piece))
	sc := scratchPool.Get().(*heapScratch)
	defer scratchPool.Put(sc)
	sc.next = grow(sc.next, int(n)+1) // next part's start; n ends the list
	sc.prev = grow(sc.prev, int(n)+1)
	sc.cur = grow(sc.cur, int(n)+1) // the rank of the pair starting here
	next, prev, cur := sc.next, sc.prev, sc.cur
	for i := range n + 1 {
		next[i], prev[i], cur[i] = i+1, i-1, noRank
	}
	h := sc.h[:0]
	defer func() { sc.h = h[:0] }()
	rankAt := func(i int32) uint32 {
		j := next[i]
		if j >= n {
			return noRank
		}
		return v.rank(piece[i:next[j]])
	}
	for i := int32(0); i+1 < n; i++ {
		if r := rankAt(i); r != noRank {
			cur[i] = r
			h = append(h, pairOf(r, i))
		}
	}
	h.init()
	parts := int(n)
	for len(h) > 0 {
		e := h.pop()
		rank, start := e.rank(), e.start()
		if cur[start] != rank || next[start] >= n+1 {
			continue // stale
		}
		i, j := start, next[start]
		// Join i and j.
		next[i] = next[j]
		if next[j] <= n {
			prev[next[j]] = i
		}
		cur[j], next[j] = noRank, n+1 // j is gone
		parts--
		for _, b := range [2]int32{i, prev[i]} {
			if b < 0 {
				continue
			}
			cur[b] = rankAt(b)
			if cur[b] != noRank {
				h.push(pairOf(cur[b], b))
			}
		}
	}
	return parts
}

// pairEntry is a candidate pair: its rank in the high 32 bits, its start
// in the low, so that comparing entries orders them by rank, then
// leftmost first, as the merge rule does, in one comparison.
type pairEntry uint64

func pairOf(rank uint32, start int32) pairEntry {
	return pairEntry(rank)<<32 | pairEntry(uint32(start))
}

func (e pairEntry) rank() uint32 { return uint32(e >> 32) }

func (e pairEntry) start() int32 { return int32(uint32(e)) }

// pairHeap is a min-heap of candidate pairs.
type pairHeap []pairEntry

func (h pairHeap) less(a, b int) bool { return h[a] < h[b] }

func (h pairHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *pairHeap) push(e pairEntry) {
	*h = append(*h, e)
	for i := len(*h) - 1; i > 0; {
		p := (i - 1) / 2
		if !h.less(i, p) {
			break
		}
		(*h)[i], (*h)[p] = (*h)[p], (*h)[i]
		i = p
	}
}

func (h *pairHeap) pop() pairEntry {
	old := *h
	top := old[0]
	old[0] = old[len(old)-1]
	*h = old[:len(old)-1]
	h.down(0)
	return top
}

func (h pairHeap) down(i int) {
	for {
		c := 2*i + 1
		if c >= len(h) {
			return
		}
		if r := c + 1; r < len(h) && h.less(r, c) {
			c = r
		}
		if !h.less(c, i) {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}
