package fakeopenai

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
)

// TestRateTokensAsDocumented: the fake counts what OpenAI's guides say its
// rate limiter counts, never the tokenizer: characters/4 and 4 per
// message; images 85 at detail low, and by 512-px tiles at high or auto
// (the vision guide's own examples: 1024×1024 is 765, 2048×4096 is 1105),
// an image by URL as the largest; with CountBody, every character of the
// body but the images' URLs.
func TestRateTokensAsDocumented(t *testing.T) {
	msg := func(content string) string {
		return `{"model":"m","messages":[{"role":"user","content":` + content + `}]}`
	}
	img := func(url, detail string) string {
		return `{"type":"image_url","image_url":{"url":"` + url + `","detail":"` + detail + `"}}`
	}
	for _, c := range []struct {
		name, body string
		want       int
	}{
		{"text", msg(`"hello world"`), 3 + 4},                                    // 11 characters
		{"whitespace", msg(`"hi` + strings.Repeat(" ", 40000) + `"`), 10001 + 4}, // the tokenizer: a few hundred
		{"two messages", `{"model":"m","messages":[{"role":"system","content":"abcd"},{"role":"user","content":"efgh"}]}`, 2 + 8},
		{"low", msg(`[` + img(ImageDataURL(4096, 4096), "low") + `]`), 85 + 4},
		{"high 1024", msg(`[` + img(ImageDataURL(1024, 1024), "high") + `]`), 765 + 4},
		{"high 2048x4096", msg(`[` + img(ImageDataURL(2048, 4096), "high") + `]`), 1105 + 4},
		{"auto 512", msg(`[` + img(ImageDataURL(512, 512), "auto") + `]`), 255 + 4},
		{"by URL", msg(`[` + img("https://example.com/a.png", "high") + `]`), 1445 + 4},
		{"text part", msg(`[{"type":"text","text":"abcdefgh"}]`), 2 + 4},
	} {
		if got := RateTokens([]byte(c.body), false); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
	body := msg(`[` + img(ImageDataURL(1024, 1024), "high") + `]`)
	url := ImageDataURL(1024, 1024)
	if got, want := RateTokens([]byte(body), true), (len(body)-len(url)+3)/4+4+765; got != want {
		t.Errorf("CountBody: %d, want %d", got, want)
	}
}

// TestRefusalsAsOpenAI: a request over the tokens left is refused with
// OpenAI's wording, its count as "Requested N"; one larger than the whole
// limit as "Request too large"; the request limit with type "requests".
func TestRefusalsAsOpenAI(t *testing.T) {
	s := New(t, Options{RPM: 2, TPM: 100, Period: 1 << 40, CompletionTokens: 5})
	refusal := func(body string) (int, string, string) {
		res := post(t, s.URL()+"/v1/chat/completions", "k", body)
		b, _ := io.ReadAll(res.Body)
		var e struct {
			Error struct{ Message, Type, Code string }
		}
		_ = json.Unmarshal(b, &e)
		return res.StatusCode, e.Error.Type, e.Error.Message
	}
	long := fmt.Sprintf(`{"model":"gpt-x","max_tokens":10,"messages":[{"role":"user","content":"%s"}]}`, strings.Repeat("a", 400))
	if st, typ, m := refusal(long); st != 429 || typ != "tokens" || !strings.Contains(m, "Request too large for gpt-x") || !strings.Contains(m, "Limit 100, Requested 114") {
		t.Fatalf("too large: %d %s %q", st, typ, m)
	}
	mid := fmt.Sprintf(`{"model":"gpt-x","max_tokens":10,"messages":[{"role":"user","content":"%s"}]}`, strings.Repeat("a", 200))
	if st, _, _ := refusal(mid); st != 200 { // 64 of 100 (the bucket refills a little meanwhile)
		t.Fatalf("first: %d", st)
	}
	if st, typ, m := refusal(mid); st != 429 || typ != "tokens" || !strings.Contains(m, "on tokens per min (TPM): Limit 100, Used 64") || !strings.Contains(m, "Requested 64.") {
		t.Fatalf("over TPM: %d %s %q", st, typ, m)
	}
	small := `{"model":"gpt-x","max_tokens":1,"messages":[{"role":"user","content":"a"}]}`
	if st, _, _ := refusal(small); st != 200 {
		t.Fatalf("small: %d", st)
	}
	if st, typ, m := refusal(small); st != 429 || typ != "requests" || !strings.Contains(m, "requests per min (RPM): Limit 2, Used 2") {
		t.Fatalf("over RPM: %d %s %q", st, typ, m)
	}
}
