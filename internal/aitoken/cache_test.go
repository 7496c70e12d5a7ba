package aitoken

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestPromptTokensCached: a conversation resent with one more message each
// turn counts the same with the cache as without it, and its earlier
// messages come from the cache; a message remembered when the budget of
// exact bytes covered it is counted afresh (the heuristic, as without the
// cache) when a request's earlier messages have used up that budget; a
// cache past its bound stays at it; messages under minCachedBytes are not
// remembered; the same message on another encoding is another entry.
func TestPromptTokensCached(t *testing.T) {
	msg := func(role, text string) json.RawMessage {
		b, _ := json.Marshal(map[string]string{"role": role, "content": text})
		return b
	}
	o2, cl := mustCounter(t, O200kBase), mustCounter(t, Cl100kBase)
	cache := NewCache(0)
	var conv []json.RawMessage
	for turn := range 6 {
		conv = append(conv, msg("user", strings.Repeat("Tell me about rate limiting, turn "+string(rune('a'+turn))+". ", 20)))
		for _, c := range []*Counter{o2, cl} {
			r := &Request{Messages: conv}
			if got, want := c.PromptTokensCached(r, cache), c.PromptTokens(r); got != want {
				t.Fatalf("turn %d %s: %d cached, %d uncached", turn, c.Encoding(), got, want)
			}
		}
	}
	// Each turn's earlier messages (1+2+...+5 per encoding) came from the
	// cache.
	if h := cache.Hits(); h != 2*15 {
		t.Fatalf("%d hits, want 30", h)
	}
	if n := cache.Len(); n != 12 {
		t.Fatalf("%d entries, want 12 (6 messages, 2 encodings)", n)
	}

	// The budget: B alone is counted exactly and remembered; after A, what
	// is left of MaxExactBytes does not cover B, which is then estimated,
	// as without the cache.
	a := msg("user", strings.Repeat("lorem ipsum dolor ", MaxExactBytes*3/4/18))
	b := msg("user", strings.Repeat("sit amet, consectetur ", MaxExactBytes/2/22))
	for _, r := range []*Request{{Messages: []json.RawMessage{b}}, {Messages: []json.RawMessage{a, b}}, {Messages: []json.RawMessage{b}}} {
		if got, want := o2.PromptTokensCached(r, cache), o2.PromptTokens(r); got != want {
			t.Fatalf("%d messages: %d cached, %d uncached", len(r.Messages), got, want)
		}
	}

	// Small messages are not remembered; the bound holds.
	small := NewCache(4)
	for i := range 10 {
		r := &Request{Messages: []json.RawMessage{msg("user", "hi "+string(rune('a'+i)))}}
		o2.PromptTokensCached(r, small)
	}
	if n := small.Len(); n != 0 {
		t.Fatalf("%d small messages remembered", n)
	}
	for i := range 10 {
		r := &Request{Messages: []json.RawMessage{msg("user", strings.Repeat("x", 600)+string(rune('a'+i)))}}
		o2.PromptTokensCached(r, small)
	}
	if n := small.Len(); n != 4 {
		t.Fatalf("%d entries in a cache of 4", n)
	}
}

// BenchmarkPromptTokensCached is a chat of 20 turns of about 1 KiB each,
// counted exactly at its last turn: without a cache, and with one that
// has seen the earlier turns (the conversation resent).
func BenchmarkPromptTokensCached(b *testing.B) {
	var conv []json.RawMessage
	for turn := range 20 {
		m, _ := json.Marshal(map[string]string{"role": "user", "content": strings.Repeat("How do token buckets and GCRA differ, turn "+string(rune('a'+turn))+"? ", 20)})
		conv = append(conv, m)
	}
	r := &Request{Messages: conv}
	o2 := mustCounter(b, O200kBase)
	b.Run("baseline=uncached", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			o2.PromptTokens(r)
		}
	})
	b.Run("cached", func(b *testing.B) {
		cache := NewCache(0)
		o2.PromptTokensCached(r, cache)
		b.ReportAllocs()
		for b.Loop() {
			o2.PromptTokensCached(r, cache)
		}
	})
}
