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
	// run is the current run of ASCII letters and digits: digits of it,
	// and changes of character class (a lower-case letter, an upper-case
	// one, a digit; a capital before lower case is no change). A long run
	// dense with changes is random text (base64, hex, keys), which
	// tokenizers cut into about 3 of 4 characters a token.
	var n, run, digits, changes int64
	var class byte
	flush := func() {
		if run > 0 {
			if run >= 16 && changes*4 >= run {
				n += (run*3 + 3) / 4
			} else {
				n += (run-digits+3)/4 + (digits+2)/3
			}
			run, digits, changes, class = 0, 0, 0, 0
		}
	}
	// ws is the current run of ASCII whitespace, and how many of its
	// newlines follow a space, tab or CR: a long run is a token per 16 or
	// so characters, and each line that ends in blanks one more.
	var ws, wsLines int64
	var wsPrev byte
	flushWS := func() {
		if ws > 1 {
			n += (ws-1+15)/16 + wsLines
		}
		ws, wsLines, wsPrev = 0, 0, 0
	}
	for i := 0; i < len(text); {
		c := text[i]
		if c >= utf8.RuneSelf {
			flush()
			flushWS()
			_, size := utf8.DecodeRuneInString(text[i:])
			i += size
			n++
			if size == 4 {
				n += 2 // emoji and other astral characters: 2-4 tokens each
			}
			continue
		}
		i++
		var cl byte
		switch {
		case c >= 'a' && c <= 'z':
			cl = 'a'
		case c >= 'A' && c <= 'Z':
			cl = 'A'
		case c >= '0' && c <= '9':
			cl = '0'
			digits++
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			flush()
			if c == '\n' && (wsPrev == ' ' || wsPrev == '\t' || wsPrev == '\r') {
				wsLines++
			}
			ws++
			wsPrev = c
			continue
		default:
			flush()
			flushWS()
			n++
			continue
		}
		flushWS()
		if class != 0 && cl != class && !(class == 'A' && cl == 'a') {
			changes++
		}
		class = cl
		run++
	}
	flush()
	flushWS()
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
	if n, ok := scanCount(raw); ok {
		return n
	}
	return countJSONValue(raw)
}

// countJSONValue is countJSON through encoding/json: the reading
// scanCount gives way to.
func countJSONValue(raw json.RawMessage) int64 {
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
