package aitoken

import (
	"encoding/json"
	"testing"
)

func TestCount(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"", 0},
		{"tok ", 1},
		{"hello world", 4}, // 5 letters = 2, 5 letters = 2
		{"a, b.", 4},       // a , b .
		{"日本語", 3},         // one per character
		{"internationalization", 5},
		{" ", 0},
		{"  \n\t", 2},                        // a run: 1 per 16 after the first, +1 for the blank-ended line
		{"aGVsbG8gV29ybGQhIFRoaXMgaXM=", 22}, // 28 changing letters and digits: ¾ each, and =
		{"3141592653", 4},                    // digits: 1 per 3
		{"😀👍", 6},                            // astral characters: 3 each
	} {
		if got := Count(tc.in); got != tc.want {
			t.Errorf("Count(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestPrompt(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"system","content":"be brief"},
	  {"role":"user","content":[{"type":"text","text":"hi there"},{"type":"image_url","image_url":{"url":"data:x"}}]}]}`
	var r Request
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatal(err)
	}
	// (3 + "be brief" 1+2) + (3 + "hi there" 1+2 + image 85) + reply 3
	if got := r.PromptTokens(); got != 100 {
		t.Fatalf("Prompt = %d, want 100", got)
	}
	r = Request{}
	_ = json.Unmarshal([]byte(`{"input":["one two","three"]}`), &r)
	if got := r.PromptTokens(); got != 4 {
		t.Fatalf("embeddings Prompt = %d, want 4", got)
	}
}

// FuzzCount checks that Count never panics and never counts more tokens
// than bytes.
func FuzzCount(f *testing.F) {
	f.Add("hello, 世界")
	f.Fuzz(func(t *testing.T, s string) {
		if n := Count(s); n < 0 || n > int64(len(s)) {
			t.Fatalf("Count(%q) = %d", s, n)
		}
	})
}
