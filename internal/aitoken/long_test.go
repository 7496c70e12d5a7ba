package aitoken

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// refMerge is the straightforward byte-pair merge, tiktoken's
// _byte_pair_merge: the parts' starts in a slice with the rank of each
// part joined to the next, every round a scan of them all for the lowest
// (leftmost on ties), joined, its neighbours' ranks recomputed, until no
// pair is a token. Quadratic, with no heap and no size classes: the
// reference the counter's scan and heap paths are checked against.
func refMerge(v *vocab, piece string) int {
	starts := make([]int, len(piece)+1)
	for i := range starts {
		starts[i] = i
	}
	rank := func(k int) uint32 { // of parts k and k+1 joined
		if k+2 >= len(starts) {
			return noRank
		}
		if r, ok := v.ranks[piece[starts[k]:starts[k+2]]]; ok {
			return r
		}
		return noRank
	}
	ranks := make([]uint32, len(piece))
	for k := range ranks {
		ranks[k] = rank(k)
	}
	for {
		best, at := uint32(noRank), -1
		for k, r := range ranks {
			if r < best {
				best, at = r, k
			}
		}
		if at < 0 {
			return len(starts) - 1
		}
		starts = append(starts[:at+1], starts[at+2:]...)
		ranks = append(ranks[:at+1], ranks[at+2:]...)
		ranks[at] = rank(at)
		if at > 0 {
			ranks[at-1] = rank(at - 1)
		}
	}
}

// refCount is count with refMerge.
func refCount(v *vocab, s string) int64 {
	var n int64
	v.split(s, func(piece string) { n += int64(refMerge(v, piece)) })
	return n
}

// longWords are single pieces far past the 1 KiB the counter used to
// merge in chunks, in several scripts.
var longWords = []struct{ name, text string }{
	{"kana", strings.Repeat("こんにちは", 300)},
	{"kanji", strings.Repeat("東京特許許可局長今日急遽休暇許可拒否", 80)},
	{"hangul", strings.Repeat("안녕하세요반갑습니다", 120)},
	{"arabic", strings.Repeat("مرحبابالعالمالعربي", 100)},
	{"devanagari", strings.Repeat("नमस्तेदुनिया", 100)},
	{"cyrillic", strings.Repeat("приветствие", 150)},
	{"latin", strings.Repeat("supercalifragilistic", 100)},
	{"emoji", strings.Repeat("😀🎉👍🏽🚀", 200)},
	{"zwj", strings.Repeat("👩\u200d💻", 300)},
	{"base64", strings.Repeat("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk", 60)},
	{"digits", strings.Repeat("31415926535897932384626433832795", 40)},
	{"spaces", strings.Repeat(" ", 2000) + "x"},
	{"tabs", strings.Repeat("\t", 2000)},
	{"newlines", strings.Repeat("\n", 2000)},
	{"dashes", strings.Repeat("-", 2000)},
	{"a", strings.Repeat("a", 2000)},
}

// TestLongWordsMatchReference: pieces of any length are merged exactly
// as the reference merges them (the chunked merge counted kana × 300 as
// 308, not 300).
func TestLongWordsMatchReference(t *testing.T) {
	for _, enc := range []Encoding{Cl100kBase, O200kBase} {
		c := mustCounter(t, enc)
		for _, w := range longWords {
			if got, want := c.Count(w.text), refCount(c.v, w.text); got != want {
				t.Errorf("%s %s (%d bytes): %d tokens, reference %d", enc, w.name, len(w.text), got, want)
			}
		}
	}
}

// FuzzMergeMatchesReference: the counter (scan below 64 bytes, heap above)
// and the reference merge agree on every piece of any text; the seeds are
// long words, which the fuzzer mutates and repeats.
func FuzzMergeMatchesReference(f *testing.F) {
	for _, w := range longWords {
		f.Add(w.text[:min(len(w.text), 600)], uint16(3))
	}
	f.Add("hello, 世界", uint16(40))
	f.Add("\xff\xfe 'S", uint16(100))
	cl, o2 := mustCounter(f, Cl100kBase), mustCounter(f, O200kBase)
	f.Fuzz(func(t *testing.T, s string, times uint16) {
		if len(s)*int(times%64+1) > 8<<10 {
			t.Skip("the quadratic reference is slow past a few KiB")
		}
		s = strings.Repeat(s, int(times%64)+1)
		for _, c := range []*Counter{cl, o2} {
			if got, want := c.Count(s), refCount(c.v, s); got != want {
				t.Fatalf("%s %q: %d tokens, reference %d", c.Encoding(), s, got, want)
			}
		}
	})
}

// countChunked is the counter before exact long words, kept as the
// benchmarks' baseline only: a piece over 1 KiB merged in chunks of
// 1 KiB cut at character boundaries.
func countChunked(v *vocab, s string) int64 {
	const maxPiece = 1024
	var n int64
	v.split(s, func(piece string) {
		if _, ok := v.ranks[piece]; ok {
			n++
			return
		}
		for len(piece) > maxPiece {
			cut := maxPiece
			for cut > maxPiece-utf8.UTFMax && !utf8.RuneStart(piece[cut]) {
				cut--
			}
			n += int64(v.merge(piece[:cut]))
			piece = piece[cut:]
		}
		n += int64(v.merge(piece))
	})
	return n
}

// BenchmarkLongWords compares, in one run, the chunked baseline and the
// exact merge on long words (each a request's text) and on megabytes made
// to be slow: go test -run XXX -bench LongWords ./internal/aitoken.
func BenchmarkLongWords(b *testing.B) {
	o2 := mustCounter(b, O200kBase)
	texts := append([]struct{ name, text string }{}, longWords...)
	texts = append(texts,
		struct{ name, text string }{"256KiB_letters", strings.Repeat("a", MaxExactBytes)},
		struct{ name, text string }{"256KiB_kana", strings.Repeat("こんにちは", MaxExactBytes/15)},
		struct{ name, text string }{"256KiB_base64", strings.Repeat("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk", MaxExactBytes/60)},
		struct{ name, text string }{"256KiB_spaces", strings.Repeat(" ", MaxExactBytes)},
	)
	for _, tc := range texts {
		b.Run(tc.name+"/chunked", func(b *testing.B) {
			b.SetBytes(int64(len(tc.text)))
			b.ReportAllocs()
			for b.Loop() {
				countChunked(o2.v, tc.text)
			}
			b.ReportMetric(float64(countChunked(o2.v, tc.text)), "tokens/op")
		})
		b.Run(tc.name+"/exact", func(b *testing.B) {
			b.SetBytes(int64(len(tc.text)))
			b.ReportAllocs()
			for b.Loop() {
				o2.Count(tc.text)
			}
			b.ReportMetric(float64(o2.Count(tc.text)), "tokens/op")
		})
	}
}
