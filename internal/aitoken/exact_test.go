package aitoken

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

type goldenText struct {
	Kind   string `json:"kind"`
	Text   string `json:"text"`
	CL100K int64  `json:"cl100k_base"`
	O200K  int64  `json:"o200k_base"`
}

// readGolden reads testdata/golden.json: texts and their counts by
// OpenAI's tiktoken (testdata/golden.js says how they were made).
func readGolden(t testing.TB) []goldenText {
	b, err := os.ReadFile("testdata/golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g []goldenText
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

func mustCounter(t testing.TB, enc Encoding) *Counter {
	c, err := ForEncoding(enc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestGoldenCounts checks the exact counter against tiktoken's counts of
// a fixed corpus (English, code, CJK and other scripts, emoji, edge cases
// of the split patterns, 300 random texts), and the published vectors of
// tiktoken's tests and the OpenAI cookbook.
func TestGoldenCounts(t *testing.T) {
	cl, o2 := mustCounter(t, Cl100kBase), mustCounter(t, O200kBase)
	for _, g := range readGolden(t) {
		if got := cl.Count(g.Text); got != g.CL100K {
			t.Errorf("cl100k_base %s %q: %d tokens, tiktoken %d", g.Kind, g.Text, got, g.CL100K)
		}
		if got := o2.Count(g.Text); got != g.O200K {
			t.Errorf("o200k_base %s %q: %d tokens, tiktoken %d", g.Kind, g.Text, got, g.O200K)
		}
	}
	for _, v := range []struct {
		c    *Counter
		text string
		want int64
		src  string
	}{
		// tiktoken tests/test_encoding.py
		{cl, "hello world", 2, "test_simple: [15339, 1917]"},
		{cl, "rer", 1, "test_simple_regex: [38149]"},
		{cl, "'rer", 2, "test_simple_regex: [2351, 81]"},
		{cl, "today\n ", 3, "test_simple_regex: [31213, 198, 220]"},
		{cl, "today\n \n", 2, "test_simple_regex: [31213, 27907]"},
		{cl, "today\n  \n", 2, "test_simple_regex: [31213, 14211]"},
		{cl, " \u00850", 4, "test_basic_encode (Python \"\\x85\" is U+0085): [220, 126, 227, 15]"},
		{cl, "👍", 3, "test_encode_surrogate_pairs: [9468, 239, 235]"},
		// OpenAI cookbook, How_to_count_tokens_with_tiktoken.ipynb
		{cl, "tiktoken is great!", 6, "section 3: [83, 1609, 5963, 374, 2294, 0]"},
		{cl, "antidisestablishmentarianism", 6, "section 5, cl100k_base: 6 tokens"},
		{cl, "2 + 2 = 4", 7, "section 5, cl100k_base: 7 tokens"},
		{cl, "お誕生日おめでとう", 9, "section 5, cl100k_base: 9 tokens"},
	} {
		if got := v.c.Count(v.text); got != v.want {
			t.Errorf("%s %q: %d tokens, want %d (%s)", v.c.Encoding(), v.text, got, v.want, v.src)
		}
	}
}

// cookbookMessages is the example conversation of the OpenAI cookbook's
// "How to count tokens with tiktoken", section 6.
const cookbookMessages = `[
 {"role":"system","content":"You are a helpful, pattern-following assistant that translates corporate jargon into plain English."},
 {"role":"system","name":"example_user","content":"New synergies will help drive top-line growth."},
 {"role":"system","name":"example_assistant","content":"Things working well together will increase revenue."},
 {"role":"system","name":"example_user","content":"Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage."},
 {"role":"system","name":"example_assistant","content":"Let's talk later when we're less busy about how to do better."},
 {"role":"user","content":"This late pivot means we don't have time to boil the ocean for the client deliverable."}]`

// cookbookTools is the example of section 7 of the same notebook.
const cookbookTools = `{"messages":[
 {"role":"system","content":"You are a helpful assistant that can answer to questions about the weather."},
 {"role":"user","content":"What's the weather like in San Francisco?"}],
 "tools":[{"type":"function","function":{"name":"get_current_weather","description":"Get the current weather in a given location",
  "parameters":{"type":"object","properties":{
   "location":{"type":"string","description":"The city and state, e.g. San Francisco, CA"},
   "unit":{"type":"string","description":"The unit of temperature to return","enum":["celsius","fahrenheit"]}},
  "required":["location"]}}}]}`

// TestPromptTokensCookbook checks whole requests against the prompt_tokens
// that the OpenAI API reported for the cookbook's examples: 129 for gpt-4
// and gpt-3.5-turbo, 124 for gpt-4o and gpt-4o-mini (section 6); with a
// tool, 105 and 101 (section 7).
func TestPromptTokensCookbook(t *testing.T) {
	var chat Request
	if err := json.Unmarshal([]byte(`{"messages":`+cookbookMessages+`}`), &chat); err != nil {
		t.Fatal(err)
	}
	var tools Request
	if err := json.Unmarshal([]byte(cookbookTools), &tools); err != nil {
		t.Fatal(err)
	}
	for _, v := range []struct {
		model string
		r     *Request
		want  int64
	}{
		{"gpt-4", &chat, 129}, {"gpt-3.5-turbo", &chat, 129}, {"gpt-4-0613", &chat, 129},
		{"gpt-4o", &chat, 124}, {"gpt-4o-mini", &chat, 124},
		{"gpt-4", &tools, 105}, {"gpt-3.5-turbo", &tools, 105},
		{"gpt-4o", &tools, 101}, {"gpt-4o-mini", &tools, 101},
	} {
		c := ForModel(v.model)
		if !c.Exact() {
			t.Fatalf("%s: no exact counter", v.model)
		}
		if got := c.PromptTokens(v.r); got != v.want {
			t.Errorf("%s: %d prompt tokens, the API reported %d", v.model, got, v.want)
		}
	}
}

func TestEncodingForModel(t *testing.T) {
	for model, want := range map[string]Encoding{
		"gpt-4o": O200kBase, "gpt-4o-mini-2024-07-18": O200kBase, "gpt-4.1-nano": O200kBase, "gpt-5": O200kBase,
		"gpt-5-mini": O200kBase, "o1": O200kBase, "o3-mini": O200kBase, "o4-mini": O200kBase, "chatgpt-4o-latest": O200kBase,
		"openai/gpt-4o": O200kBase, "ft:gpt-4o-mini:org::abc": O200kBase, "GPT-4O": O200kBase,
		"gpt-4": Cl100kBase, "gpt-4-turbo": Cl100kBase, "gpt-3.5-turbo-0125": Cl100kBase, "gpt-35-turbo": Cl100kBase,
		"text-embedding-3-small": Cl100kBase, "text-embedding-ada-002": Cl100kBase,
		"llama3": "", "claude-sonnet-4-5": "", "o1x": "", "omni": "", "": "", "mistral-large": "",
	} {
		if got := EncodingForModel(model); got != want {
			t.Errorf("EncodingForModel(%q) = %q, want %q", model, got, want)
		}
	}
	if c := ForModel("llama3"); c.Exact() || c != Heuristic {
		t.Errorf("unknown model: want the heuristic")
	}
}

// FuzzExactCount checks that the pre-tokenizers cut every text, valid
// UTF-8 or not, into non-empty pieces that put together give the text
// back, and that no text has more tokens than bytes.
func FuzzExactCount(f *testing.F) {
	for _, s := range []string{"hello, 世界", "today\n  \n", "e\u0301A\u0301", "\xff\xfe 'S", " \u0085 0", "a/\n/b"} {
		f.Add(s)
	}
	cl, o2 := mustCounter(f, Cl100kBase), mustCounter(f, O200kBase)
	f.Fuzz(func(t *testing.T, s string) {
		for _, split := range []func(string, func(string)){splitCL100K, splitO200K} {
			var joined []byte
			split(s, func(p string) {
				if p == "" {
					t.Fatalf("empty piece of %q", s)
				}
				joined = append(joined, p...)
			})
			if string(joined) != s {
				t.Fatalf("pieces of %q give %q", s, joined)
			}
		}
		for _, c := range []*Counter{cl, o2} {
			if n := c.Count(s); n < 0 || n > int64(len(s)) || (n == 0) != (s == "") {
				t.Fatalf("%s: Count(%q) = %d", c.Encoding(), s, n)
			}
		}
	})
}

// TestMergeHeapMatchesScan checks the two merge strategies on pieces of
// both sizes.
func TestMergeHeapMatchesScan(t *testing.T) {
	for _, enc := range []Encoding{Cl100kBase, O200kBase} {
		v := mustCounter(t, enc).v
		for _, p := range []string{"supercalifragilisticexpialidocious", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
			"xqzjvkxqzjvkwpfhgt", "日本語のテキスト", "0123456789abcdef0123456789abcdef"} {
			if a, b := v.mergeScan(p), v.mergeHeap(p); a != b {
				t.Errorf("%s %q: scan %d, heap %d", enc, p, a, b)
			}
		}
	}
}

// TestPromptTokensBounded checks that text beyond MaxExactBytes is
// estimated, not tokenized, and that the estimate errs high.
func TestPromptTokensBounded(t *testing.T) {
	c := mustCounter(t, O200kBase)
	big := strings.Repeat("limit ", MaxExactBytes/4) // 1.5 MiB: one token per word
	r := Request{Prompt: json.RawMessage(`["` + big + `", "` + big + `"]`)}
	exact := 2 * c.Count(big)
	got := c.PromptTokens(&r)
	if got <= exact {
		t.Fatalf("PromptTokens = %d, exact %d: the part past MaxExactBytes should be estimated high", got, exact)
	}
}

// TestReservationError measures, per kind of text of the golden corpus,
// the reservation error of a one-message chat request (reserved minus
// actual prompt tokens, over actual), actual being tiktoken's count plus
// the cookbook's overheads (3 per message, 1 for "user", 3 for the reply).
// The exact counter must be within 2 % (it is exact); the heuristic's error
// is logged for docs/BENCHMARKS.md (go test -run TestReservationError -v).
func TestReservationError(t *testing.T) {
	type sum struct{ actual, exact, heur int64 }
	for _, enc := range []Encoding{Cl100kBase, O200kBase} {
		c := mustCounter(t, enc)
		by := map[string]*sum{}
		for _, g := range readGolden(t) {
			want := g.CL100K
			if enc == O200kBase {
				want = g.O200K
			}
			body, _ := json.Marshal(map[string]any{"messages": []map[string]string{{"role": "user", "content": g.Text}}})
			var r Request
			if err := json.Unmarshal(body, &r); err != nil {
				t.Fatal(err)
			}
			s := by[g.Kind]
			if s == nil {
				s = &sum{}
				by[g.Kind] = s
			}
			s.actual += MessageOverhead + 1 + want + ReplyOverhead
			s.exact += c.PromptTokens(&r)
			s.heur += r.PromptTokens()
		}
		for _, kind := range []string{"english", "code", "cjk", "emoji", "edge", "random", "long", "base64", "whitespace"} {
			s := by[kind]
			pct := func(n int64) float64 { return 100 * float64(n-s.actual) / float64(s.actual) }
			t.Logf("%s %-8s actual %5d  exact %5d (%+.1f%%)  heuristic %5d (%+.1f%%)", enc, kind, s.actual, s.exact, pct(s.exact), s.heur, pct(s.heur))
			if e := pct(s.exact); e > 2 || e < -2 {
				t.Errorf("%s %s: exact reservation error %.1f%%, want within 2%%", enc, kind, e)
			}
		}
	}
}
