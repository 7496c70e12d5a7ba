package aitoken

// OpenAI's and Azure OpenAI's rate-limit estimate
//
// Neither provider tokenizes a request to enforce its tokens-per-minute
// limit. OpenAI's rate-limits guide
// (https://platform.openai.com/docs/guides/rate-limits, "Error
// mitigation"): "Your rate limit is calculated as the maximum of max_tokens
// and the estimated number of tokens based on the character count of your
// request." Azure OpenAI's quota guide
// (https://learn.microsoft.com/azure/ai-services/openai/how-to/quota, "How
// requests are evaluated"): a max processed-token count per request from
// the prompt text and count, max_tokens and best_of, "an estimate based in
// part on the character count of the API request", which "is not the same
// as the token calculation that is used for billing". Images count by size
// and detail as they are billed (OpenAI's vision guide,
// https://platform.openai.com/docs/guides/images-vision, "Calculating
// costs"): detail low 85 tokens; high 85 plus 170 per 512-px tile, once the
// image is scaled to fit in 2048×2048 and then its shortest side down to
// 768 px. A whitespace-heavy prompt is thus several times its tokenizer
// count (40,000 spaces: 10,000 here, a few hundred tokens), and a
// high-detail image nine times a low one.
//
// RateLimitTokens is that estimate of a request's input, as an upper
// bound of the documented rule: a character is a Unicode code point of
// any string the messages, prompt, input, instructions or tools hold
// (roles and names included), a chat message or responses input item adds
// RateMessageOverhead, and an image whose size cannot be read (a URL the
// provider fetches, a format this package does not decode) counts as the
// largest a high-detail image can be (MaxImageRateTokens). The caller adds
// the completion budget (max_tokens × n) as the providers do.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"image"
	_ "image/gif"  // image.DecodeConfig of GIF data URLs
	_ "image/jpeg" // and JPEG
	_ "image/png"  // and PNG
	"math"
	"strings"
	"unicode/utf8"
)

// Image costs of OpenAI's vision guide.
const (
	// ImageBaseTokens is a low-detail image's cost, and a high-detail
	// image's base.
	ImageBaseTokens = 85
	// ImageTileTokens is the cost of one 512-px tile of a high-detail
	// image.
	ImageTileTokens = 170
	// MaxImageRateTokens is the largest cost of a high-detail image: at
	// most 768×2048 px once scaled, 2×4 tiles.
	MaxImageRateTokens = ImageBaseTokens + 8*ImageTileTokens
	// RateMessageOverhead is counted per chat message or input item.
	RateMessageOverhead = 4
	// rateCharsPerToken is the providers' characters per token.
	rateCharsPerToken = 4
	// maxImageHeader bounds the base64 of a data URL decoded to read an
	// image's size.
	maxImageHeader = 64 << 10
)

// RateLimitTokens estimates r's input as OpenAI's and Azure OpenAI's rate
// limiters count it: ⌈characters/4⌉, RateMessageOverhead per message, and
// each image by its size and detail (see the package's notes above).
func (r *Request) RateLimitTokens() int64 {
	var e rateEst
	for _, m := range r.Messages {
		e.messages++
		e.raw(m, 2) // deeper than an input item: counted once
	}
	e.raw(r.Prompt, 0)
	e.raw(r.Input, 0)
	e.chars += int64(utf8.RuneCountInString(r.Instructions))
	for _, t := range []json.RawMessage{r.Tools, r.Functions} {
		if len(t) > 0 && string(t) != "null" {
			e.chars += int64(utf8.RuneCount(t))
		}
	}
	return (e.chars+rateCharsPerToken-1)/rateCharsPerToken + e.messages*RateMessageOverhead + e.images
}

// RateLimitChars estimates raw JSON text (a schema, a prediction) as the
// rate limiters count it: ⌈characters/4⌉.
func RateLimitChars(raw json.RawMessage) int64 {
	if len(raw) == 0 || string(raw) == "null" {
		return 0
	}
	return (int64(utf8.RuneCount(raw)) + rateCharsPerToken - 1) / rateCharsPerToken
}

// rateEst accumulates a request's characters, messages and image tokens.
type rateEst struct {
	chars, messages, images int64
}

func (e *rateEst) raw(raw json.RawMessage, depth int) {
	if len(raw) == 0 {
		return
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		e.chars += int64(utf8.RuneCount(raw))
		return
	}
	e.value(v, depth)
}

func (e *rateEst) value(v any, depth int) {
	switch v := v.(type) {
	case string:
		e.chars += int64(utf8.RuneCountInString(v))
	case float64:
		e.chars++ // a token id
	case []any:
		for _, x := range v {
			e.value(x, depth+1)
		}
	case map[string]any:
		if depth > maxDepth {
			b, _ := json.Marshal(v)
			e.chars += int64(utf8.RuneCount(b))
			return
		}
		if url, detail, ok := imagePart(v); ok {
			e.images += ImageRateTokens(url, detail)
			return
		}
		if _, ok := v["role"]; ok && depth == 1 {
			e.messages++ // a responses input item is a message
		}
		for k, x := range v {
			switch k {
			case "type", "id", "tool_call_id", "status", "detail":
				continue
			}
			e.value(x, depth+1)
		}
	}
}

// imagePart reports whether m is an image content part, and its URL and
// detail: chat's {"type":"image_url","image_url":{"url","detail"}}, the
// responses API's {"type":"input_image","image_url":"...","detail"}.
func imagePart(m map[string]any) (url, detail string, ok bool) {
	iu, has := m["image_url"]
	typ, _ := m["type"].(string)
	if !has && typ != "image_url" && typ != "input_image" {
		return "", "", false
	}
	detail, _ = m["detail"].(string)
	switch x := iu.(type) {
	case string:
		url = x
	case map[string]any:
		url, _ = x["url"].(string)
		if d, ok := x["detail"].(string); ok {
			detail = d
		}
	}
	return url, detail, true
}

// ImageRateTokens is an image's cost by OpenAI's vision guide: 85 at
// detail low; otherwise (high, and auto, which may choose high) its tiles
// when url is a data URL whose size can be read, else
// MaxImageRateTokens.
func ImageRateTokens(url, detail string) int64 {
	if detail == "low" {
		return ImageBaseTokens
	}
	w, h, ok := dataURLSize(url)
	if !ok {
		return MaxImageRateTokens
	}
	return HighDetailTokens(w, h)
}

// HighDetailTokens is the cost of a w×h image at detail high: scaled to
// fit in 2048×2048, then its shortest side down to 768, 85 plus 170 per
// 512-px tile. Scaling is not truncated to whole pixels, so that the
// count is never below the provider's.
func HighDetailTokens(w, h int) int64 {
	if w <= 0 || h <= 0 {
		return MaxImageRateTokens
	}
	fw, fh := float64(w), float64(h)
	if m := math.Max(fw, fh); m > 2048 {
		fw, fh = fw*2048/m, fh*2048/m
	}
	if m := math.Min(fw, fh); m > 768 {
		fw, fh = fw*768/m, fh*768/m
	}
	tiles := int64(math.Ceil(fw/512-1e-9)) * int64(math.Ceil(fh/512-1e-9))
	return ImageBaseTokens + ImageTileTokens*max(tiles, 1)
}

// dataURLSize reads the size of a base64 data URL's image from its
// header, decoding at most maxImageHeader of it.
func dataURLSize(url string) (w, h int, ok bool) {
	rest, found := strings.CutPrefix(url, "data:")
	if !found {
		return 0, 0, false
	}
	i := strings.Index(rest, ";base64,")
	if i < 0 {
		return 0, 0, false
	}
	b64 := rest[i+len(";base64,"):]
	if len(b64) > maxImageHeader {
		b64 = b64[:maxImageHeader]
	}
	b64 = b64[:len(b64)/4*4]
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		// A truncated prefix may end in padding-free garbage: decode
		// what decodes.
		raw, _ = base64.StdEncoding.DecodeString(strings.TrimRight(b64, "="))
	}
	cfg, _, err := image.DecodeConfig(bytes.NewReader(raw))
	if err != nil || cfg.Width <= 0 || cfg.Height <= 0 {
		return 0, 0, false
	}
	return cfg.Width, cfg.Height, true
}
