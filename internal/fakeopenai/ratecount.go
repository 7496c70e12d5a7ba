package fakeopenai

// How the fake's own limits count a request's tokens: as OpenAI and Azure
// OpenAI document their rate limiters do, not with a tokenizer, and not as
// sluice does (this file shares no code with package aitoken).
//
//   - OpenAI's rate-limits guide (https://platform.openai.com/docs/guides/rate-limits,
//     "Error mitigation"): "Your rate limit is calculated as the maximum of
//     max_tokens and the estimated number of tokens based on the character
//     count of your request". The fake takes the sum of the two, the worse
//     reading: ⌈characters/4⌉ of the message texts, 4 per message, plus
//     max_tokens × n (or, without max_tokens, the completion).
//   - Azure OpenAI's quota guide (https://learn.microsoft.com/azure/ai-services/openai/how-to/quota,
//     "How requests are evaluated"): "an estimate based in part on the
//     character count of the API request". With Options.CountBody the fake
//     counts every character of the body (member names, punctuation and
//     roles included), less the images' URLs.
//   - OpenAI's vision guide (https://platform.openai.com/docs/guides/images-vision,
//     "Calculating costs"): detail low 85 tokens; high 85 + 170 per 512-px
//     tile after scaling to fit 2048×2048 and the shortest side down to
//     768 (whole pixels, as OpenAI's cookbook computes it). detail auto
//     counts as high, the worst the provider may choose; an image by URL,
//     which the provider would fetch, as the largest one (768×2048 once
//     scaled, 8 tiles).

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"image"
	_ "image/gif"  // DecodeConfig of data URLs
	_ "image/jpeg" // DecodeConfig of data URLs
	_ "image/png"  // DecodeConfig of data URLs
	"strings"
	"unicode/utf8"
)

// RateTokens is what the fake's limits count for a request body's input
// (its completion budget aside): ⌈characters/4⌉ of the texts (with
// countBody, of the whole body less image URLs), 4 per message, and each
// image by its size and detail.
func RateTokens(body []byte, countBody bool) int {
	var req struct {
		Messages     []any `json:"messages"`
		Prompt       any   `json:"prompt"`
		Input        any   `json:"input"`
		Instructions any   `json:"instructions"`
		Tools        any   `json:"tools"`
	}
	if json.Unmarshal(body, &req) != nil {
		return (utf8.RuneCount(body) + 3) / 4
	}
	var c rateCounter
	for _, m := range req.Messages {
		c.messages++
		c.walk(m)
	}
	if in, ok := req.Input.([]any); ok {
		for _, item := range in {
			if m, ok := item.(map[string]any); ok && m["role"] != nil {
				c.messages++
			}
		}
	}
	c.walk(req.Prompt)
	c.walk(req.Input)
	c.walk(req.Instructions)
	if req.Tools != nil {
		b, _ := json.Marshal(req.Tools)
		c.chars += utf8.RuneCount(b)
	}
	if countBody {
		c.chars = utf8.RuneCount(body) - c.urlChars
	}
	return (c.chars+3)/4 + 4*c.messages + c.images
}

type rateCounter struct {
	chars, urlChars, messages, images int
}

// walk counts the text a value holds: strings of content, text, name,
// and prompt or input; images by detail.
func (c *rateCounter) walk(v any) {
	switch v := v.(type) {
	case string:
		c.chars += utf8.RuneCountInString(v)
	case []any:
		for _, e := range v {
			c.walk(e)
		}
	case map[string]any:
		typ, _ := v["type"].(string)
		if iu, ok := v["image_url"]; ok || typ == "input_image" {
			url, _ := iu.(string)
			detail, _ := v["detail"].(string)
			if m, ok := iu.(map[string]any); ok {
				url, _ = m["url"].(string)
				if d, ok := m["detail"].(string); ok {
					detail = d
				}
			}
			c.urlChars += utf8.RuneCountInString(url)
			c.images += imageTokens(url, detail)
			return
		}
		for k, e := range v {
			switch k {
			case "content", "text", "name", "input", "arguments", "output":
				c.walk(e)
			}
		}
	}
}

// imageTokens is an image's cost by OpenAI's vision guide.
func imageTokens(url, detail string) int {
	if detail == "low" {
		return 85
	}
	w, h := 768, 2048 // by URL, or unreadable: the largest
	if rest, ok := strings.CutPrefix(url, "data:"); ok {
		if i := strings.Index(rest, ";base64,"); i >= 0 {
			raw, err := base64.StdEncoding.DecodeString(rest[i+len(";base64,"):])
			if err == nil {
				if cfg, _, err := image.DecodeConfig(bytes.NewReader(raw)); err == nil {
					w, h = cfg.Width, cfg.Height
				}
			}
		}
	}
	if w > 2048 || h > 2048 {
		if w > h {
			w, h = 2048, h*2048/w
		} else {
			w, h = w*2048/h, 2048
		}
	}
	if s := min(w, h); s > 768 {
		w, h = w*768/s, h*768/s
	}
	tiles := ((w + 511) / 512) * ((h + 511) / 512)
	return 85 + 170*tiles
}

// ImageDataURL is a data URL of a w×h PNG image for tests: its signature
// and IHDR chunk only, which is all a size check reads (OpenAI would
// refuse it as an image; the fake counts it by size).
func ImageDataURL(w, h int) string {
	ihdr := make([]byte, 0, 25)
	ihdr = binary.BigEndian.AppendUint32(ihdr, 13)
	ihdr = append(ihdr, "IHDR"...)
	ihdr = binary.BigEndian.AppendUint32(ihdr, uint32(w))
	ihdr = binary.BigEndian.AppendUint32(ihdr, uint32(h))
	ihdr = append(ihdr, 8, 0, 0, 0, 0) // 8-bit grey, no interlace
	ihdr = binary.BigEndian.AppendUint32(ihdr, crc32.ChecksumIEEE(ihdr[4:]))
	png := append([]byte("\x89PNG\r\n\x1a\n"), ihdr...)
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(png)
}
