// Package aitoken counts how many LLM tokens a text or an OpenAI-style
// request takes, offline.
//
// For OpenAI models (EncodingForModel) the count is exact: ForModel returns
// a Counter that tokenizes with the model's byte-pair vocabulary
// (cl100k_base or o200k_base, embedded by github.com/tiktoken-go/tokenizer)
// using pre-tokenizers written for the two split patterns, and counts a
// request as OpenAI's cookbook does, per-message, name and tool
// overheads included; the counts match tiktoken's on a golden corpus and
// the API's on the cookbook's examples. The same Counter serves the
// gateway, aiclient and sluice batch.
//
// For other models the Counter is Heuristic (Count, Request.PromptTokens),
// tuned to err high for English and code with BPE tokenizers: a run of
// ASCII letters or digits costs one token per four bytes (rounded up),
// every other ASCII symbol one token, whitespace nothing, and every
// non-ASCII character one token (CJK text is about one token per
// character). Chat messages add OpenAI's documented overhead of 3 tokens
// per message and 3 for the reply.
//
// The gateway reserves the count before forwarding a request and settles
// against the upstream's usage afterwards, by kind of token (package
// pricing's Usage), so an estimate only needs to be cheap and rarely low.
package aitoken

import (
	"encoding/json"
	"unicode/utf8"
)

// Per-message and per-reply overheads of the chat format.
const (
	MessageOverhead = 3
	ReplyOverhead   = 3
	// ImageTokens is charged for an image part: the cost of a low-detail
	// image; high-detail images are settled from usage.
	ImageTokens = 85
)

// Count estimates the tokens of text.
func Count(text string) int64 {
	var n, run int64
	flush := func() {
		if run > 0 {
			n += (run + 3) / 4
			run = 0
		}
	}
	for i := 0; i < len(text); {
		c := text[i]
		if c >= utf8.RuneSelf {
			flush()
			_, size := utf8.DecodeRuneInString(text[i:])
			i += size
			n++
			continue
		}
		i++
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
			run++
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			flush()
		default:
			flush()
			n++
		}
	}
	flush()
	return n
}

// Request is the part of an OpenAI request body that takes prompt tokens:
// chat messages, a completion prompt, embeddings or responses input, and
// tool definitions. Unmarshal a body into it and call PromptTokens.
type Request struct {
	Messages     []json.RawMessage `json:"messages"`
	Prompt       json.RawMessage   `json:"prompt"`
	Input        json.RawMessage   `json:"input"`
	Instructions string            `json:"instructions"`
	Tools        json.RawMessage   `json:"tools"`
	Functions    json.RawMessage   `json:"functions"`
}

// PromptTokens estimates the prompt tokens of the request.
func (r *Request) PromptTokens() int64 {
	var n int64
	for _, m := range r.Messages {
		n += MessageOverhead + countJSON(m)
	}
	if len(r.Messages) > 0 {
		n += ReplyOverhead
	}
	n += countJSON(r.Prompt) + countJSON(r.Input) + Count(r.Instructions)
	n += countRaw(r.Tools) + countRaw(r.Functions)
	return n
}

// countRaw counts a JSON document as text, punctuation included.
func countRaw(raw json.RawMessage) int64 {
	if len(raw) == 0 || string(raw) == "null" {
		return 0
	}
	return Count(string(raw))
}

// countJSON counts the strings of a JSON value: message contents, names,
// text parts. Image parts cost ImageTokens; tokenised prompts (arrays of
// integers) count one token per integer.
func countJSON(raw json.RawMessage) int64 {
	if len(raw) == 0 {
		return 0
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return Count(string(raw))
	}
	return countValue(v)
}

func countValue(v any) int64 {
	switch v := v.(type) {
	case string:
		return Count(v)
	case float64:
		return 1
	case []any:
		var n int64
		for _, e := range v {
			n += countValue(e)
		}
		return n
	case map[string]any:
		var n int64
		for k, e := range v {
			switch k {
			case "type", "role", "id", "tool_call_id", "detail":
				continue
			case "image_url", "input_image", "image":
				n += ImageTokens
				continue
			}
			n += countValue(e)
		}
		return n
	}
	return 0
}
