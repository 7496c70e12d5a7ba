package aitoken

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tiktoken-go/tokenizer"
)

// benchTexts are the golden corpus by kind, and adversarial megabytes.
func benchTexts(b *testing.B) []struct{ name, text string } {
	by := map[string]string{}
	for _, g := range readGolden(b) {
		if g.Kind != "random" && g.Kind != "edge" {
			by[g.Kind] += g.Text + "\n"
		}
	}
	return []struct{ name, text string }{
		{"english", by["english"]}, {"code", by["code"]}, {"cjk", by["cjk"]}, {"emoji", by["emoji"]},
		{"1MB_letters", strings.Repeat("a", 1<<20)}, {"1MB_spaces", strings.Repeat(" ", 1<<20)},
		{"1MB_mixed", strings.Repeat("ab 1!\n", 1<<20/6)}, {"1MB_emoji", strings.Repeat("😀", 1<<18)},
	}
}

// BenchmarkCount compares, per text, the heuristic, this package's exact
// counter, and the tokenizer library's own Count (regexp2 pre-tokenizer)
// on the same vocabulary. ns/op over the text's bytes gives the cost per
// byte; the token counts are reported as tokens/op.
func BenchmarkCount(b *testing.B) {
	o2 := mustCounter(b, O200kBase)
	lib, err := tokenizer.Get(tokenizer.O200kBase)
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range benchTexts(b) {
		b.Run(tc.name+"/heuristic", func(b *testing.B) {
			b.SetBytes(int64(len(tc.text)))
			for b.Loop() {
				Count(tc.text)
			}
			b.ReportMetric(float64(Count(tc.text)), "tokens/op")
		})
		b.Run(tc.name+"/exact", func(b *testing.B) {
			b.SetBytes(int64(len(tc.text)))
			for b.Loop() {
				o2.Count(tc.text)
			}
			b.ReportMetric(float64(o2.Count(tc.text)), "tokens/op")
		})
		if strings.HasPrefix(tc.name, "1MB") {
			continue // seconds per op
		}
		b.Run(tc.name+"/library", func(b *testing.B) {
			b.SetBytes(int64(len(tc.text)))
			for b.Loop() {
				_, _ = lib.Count(tc.text)
			}
		})
	}
}

// BenchmarkPromptTokens is the cost per request of counting a typical chat
// request (the cookbook's six messages and a tool) with the heuristic and
// exactly.
func BenchmarkPromptTokens(b *testing.B) {
	var r Request
	body := `{"messages":` + cookbookMessages + `,"tools":` + cookbookTools[strings.Index(cookbookTools, `[{"type"`):len(cookbookTools)-1] + `}`
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		b.Fatal(err)
	}
	for _, c := range []*Counter{Heuristic, mustCounter(b, O200kBase)} {
		name := "heuristic"
		if c.Exact() {
			name = "exact"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.PromptTokens(&r)
			}
			b.ReportMetric(float64(c.PromptTokens(&r)), "tokens/op")
		})
	}
}
