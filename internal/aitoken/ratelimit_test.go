package aitoken

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"strings"
	"testing"
)

// pngURL is a data URL of a w×h PNG's header, all a size check reads.
func pngURL(w, h int) string {
	ihdr := binary.BigEndian.AppendUint32(nil, 13)
	ihdr = append(ihdr, "IHDR"...)
	ihdr = binary.BigEndian.AppendUint32(ihdr, uint32(w))
	ihdr = binary.BigEndian.AppendUint32(ihdr, uint32(h))
	ihdr = append(ihdr, 8, 0, 0, 0, 0)
	ihdr = binary.BigEndian.AppendUint32(ihdr, crc32.ChecksumIEEE(ihdr[4:]))
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(append([]byte("\x89PNG\r\n\x1a\n"), ihdr...))
}

// TestHighDetailTokens: OpenAI's vision guide's own examples (1024×1024
// is 765 tokens at detail high, 2048×4096 is 1105), a small image one
// tile, and the largest any image can cost.
func TestHighDetailTokens(t *testing.T) {
	for _, c := range []struct{ w, h, want int }{
		{1024, 1024, 765}, {2048, 4096, 1105}, {512, 512, 255}, {100, 100, 255},
		{768, 2048, MaxImageRateTokens}, {20000, 7500, MaxImageRateTokens}, {0, 10, MaxImageRateTokens},
	} {
		if got := HighDetailTokens(c.w, c.h); got != int64(c.want) {
			t.Errorf("%dx%d: %d, want %d", c.w, c.h, got, c.want)
		}
	}
}

// TestRateLimitTokens: characters/4 rounded up over the request's
// strings, 4 per message, images by detail and size (by URL: the
// largest); a whitespace prompt counts its spaces, as the rate limiters
// do and the tokenizer does not.
func TestRateLimitTokens(t *testing.T) {
	req := func(body string) *Request {
		var r Request
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			t.Fatal(err)
		}
		return &r
	}
	img := func(url, detail string) string {
		return `{"type":"image_url","image_url":{"url":"` + url + `","detail":"` + detail + `"}}`
	}
	for _, c := range []struct {
		name, body string
		want       int64
	}{
		{"text", `{"messages":[{"role":"user","content":"hello world"}]}`, (4+11+3)/4 + 4},
		{"spaces", `{"messages":[{"role":"user","content":"hi` + strings.Repeat(" ", 40000) + `"}]}`, (4+40002+3)/4 + 4},
		{"images", `{"messages":[{"role":"user","content":[` + img(pngURL(1024, 1024), "high") + `,` + img(pngURL(4096, 4096), "low") + `,` + img("https://x.example/a.png", "auto") + `]}]}`,
			1 + 4 + 765 + 85 + MaxImageRateTokens},
		{"responses input", `{"input":[{"role":"user","content":[{"type":"input_text","text":"abcd"},{"type":"input_image","image_url":"` + pngURL(512, 512) + `","detail":"high"}]}]}`,
			(4+4+3)/4 + 4 + 255},
		{"prompt", `{"prompt":"abcdefgh"}`, 2},
	} {
		if got := req(c.body).RateLimitTokens(); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}
