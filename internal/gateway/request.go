package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/sluice-io/sluice/internal/aitoken"
)

// Request bodies
//
// The gateway must read a body exactly as the upstream will, or a client
// could show it one reservation and the upstream another request. So:
//
//   - The body must be valid UTF-8 (RFC 8259): encoding/json would read
//     invalid bytes as U+FFFD where the upstream reads them raw or refuses.
//   - Members are looked up by their exact name (after JSON unescaping, as
//     every parser does), never case-insensitively as encoding/json's struct
//     decoding would: {"max_tokens":100000,"MAX_TOKENS":1} would reserve 1
//     here and generate 100000 upstream. A member whose name differs from one
//     the gateway reads only by case (Unicode simple folding, as
//     encoding/json and Go upstreams match) is refused, since a
//     case-insensitive upstream could read it instead.
//   - A member repeated in one object, anywhere in the body, is refused:
//     encoding/json, Python, JavaScript and Jackson read its last
//     occurrence, gjson and simdjson its first, serde refuses it.
//   - The reservation covers every completion budget the request names
//     (the largest of max_tokens, max_completion_tokens, max_output_tokens)
//     times every choice it may generate (the larger of n and best_of), and
//     its arithmetic saturates instead of wrapping (reservation).

// maxChoices bounds n and best_of, OpenAI's own bound for n. A request
// beyond it is refused rather than forwarded with a smaller reservation.
const maxChoices = 128

// readFields are the members the gateway reads; a member that differs from
// one only by case is refused.
var readFields = []string{
	"model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "max_output_tokens", "n", "best_of",
	"messages", "prompt", "input", "instructions", "tools", "functions",
	"response_format", "text", "prediction", "suffix", "service_tier", "background", "modalities", "audio",
	"prompt_cache_key",
}

// budgetFields are the completion budgets; the reservation uses the largest.
var budgetFields = []string{"max_completion_tokens", "max_tokens", "max_output_tokens"}

// requestError is a refusal of a malformed request: 400 with OpenAI's
// error body.
type requestError struct {
	code, param, msg string
}

func (e *requestError) Error() string { return e.msg }

func badRequest(code, param, format string, args ...any) *requestError {
	return &requestError{code: code, param: param, msg: fmt.Sprintf(format, args...)}
}

// wireBody is what the gateway decodes of a body. encoding/json matches
// its members case-insensitively, which is exact once parseBody has refused
// the case variants of these names (readFields).
type wireBody struct {
	Model               string            `json:"model"`
	Stream              bool              `json:"stream"`
	StreamOptions       json.RawMessage   `json:"stream_options"`
	MaxTokens           *int64            `json:"max_tokens"`
	MaxCompletionTokens *int64            `json:"max_completion_tokens"`
	MaxOutputTokens     *int64            `json:"max_output_tokens"`
	N                   *int64            `json:"n"`
	BestOf              *int64            `json:"best_of"`
	Messages            []json.RawMessage `json:"messages"`
	Prompt              json.RawMessage   `json:"prompt"`
	Input               json.RawMessage   `json:"input"`
	Instructions        string            `json:"instructions"`
	Tools               json.RawMessage   `json:"tools"`
	Functions           json.RawMessage   `json:"functions"`
	// Model input that package aitoken does not count (rawInputTokens).
	ResponseFormat json.RawMessage `json:"response_format"`
	Text           json.RawMessage `json:"text"`
	Prediction     json.RawMessage `json:"prediction"`
	Suffix         json.RawMessage `json:"suffix"`
	// ServiceTier may ask for a dearer price than the table's (budget.go).
	ServiceTier *string `json:"service_tier"`
	// Background runs a response on after the request returns.
	Background bool `json:"background"`
	// Audio output, billed at audio prices the table does not know.
	Modalities []string        `json:"modalities"`
	Audio      json.RawMessage `json:"audio"`
	// PromptCacheKey is OpenAI's prompt-cache routing hint: a pool's
	// affinity key when the client sends no X-Sluice-Affinity.
	PromptCacheKey *string `json:"prompt_cache_key"`
}

// wireBodies recycles the wireBody each request is decoded into (json's
// pointer makes it a heap object: 0.4 KB per request). Nothing keeps one
// past parseBodyCached; the slices decoded into it are the request's own.
var wireBodies = sync.Pool{New: func() any { return new(wireBody) }}

// rawInputTokens estimates the tokens of members that reach the model
// beside the prompt, which package aitoken does not count: a structured
// output's JSON schema (chat's response_format, the responses API's
// text.format, Anthropic's output_format), a predicted output (billed when
// rejected) and a completion's suffix. Each is counted as raw JSON text,
// punctuation included, an upper bound; exactly up to
// aitoken.MaxExactBytes, past it with the heuristic, to bound the work.
// Without it a client could put the bulk of its input where the
// reservation does not look: a 2 MiB schema beside max_tokens 1 reserved
// a few tokens.
func rawInputTokens(counter *aitoken.Counter, members ...json.RawMessage) int64 {
	var n int64
	for _, raw := range members {
		switch {
		case len(raw) == 0 || string(raw) == "null":
		case len(raw) <= aitoken.MaxExactBytes:
			n = addSat(n, counter.Count(string(raw)))
		default:
			n = addSat(n, aitoken.Count(string(raw)))
		}
	}
	return n
}

// parsedBody is what the gateway reads of a request body.
type parsedBody struct {
	model         string
	stream        bool
	streamOptions json.RawMessage
	promptEst     int64
	// budget is the largest completion budget named, explicit whether
	// any was; choices the larger of n and best_of, at least 1.
	budget   int64
	explicit bool
	choices  int64
	// serviceTier is the service_tier asked for, "" when none.
	serviceTier string
	// rateReq and rateRaw are what rateLimitTokens reads: the prompt,
	// and the raw members counted beside it (none for embeddings).
	rateReq aitoken.Request
	rateRaw [4]json.RawMessage
	// background is a responses request run in the background.
	background bool
	// audio is a request with audio input or output.
	audio bool
	// cacheKey is the prompt_cache_key, "" when none.
	cacheKey string
}

// parseBody reads a request body for endpoint ep.
func parseBody(body []byte, ep endpoint) (*parsedBody, *requestError) {
	return parseBodyCached(body, ep, nil)
}

// parseBodyCached is parseBody, counting the prompt with cache (nil:
// none), which remembers the exact counts of large messages.
func parseBodyCached(body []byte, ep endpoint, cache *aitoken.Cache) (*parsedBody, *requestError) {
	p := new(parsedBody)
	if err := parseBodyInto(p, body, ep, cache); err != nil {
		return nil, err
	}
	return p, nil
}

// parseBodyInto is parseBodyCached into p, which the caller owns (prepare
// keeps it on its stack: a heap object per request less).
func parseBodyInto(p *parsedBody, body []byte, ep endpoint, cache *aitoken.Cache) *requestError {
	if !utf8.Valid(body) {
		return badRequest("invalid_json", "", "The request body is not valid UTF-8 JSON.")
	}
	if t := bytes.TrimLeft(body, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return badRequest("invalid_json", "", "The request body must be a JSON object.")
	}
	w := wireBodies.Get().(*wireBody)
	*w = wireBody{}
	defer wireBodies.Put(w)
	// json.Unmarshal's reading in one pass (wirebody.go), or, where that
	// declines, json.Unmarshal's own.
	fast := decodeWireBody(body, w)
	if !fast {
		*w = wireBody{} // it may have declined half way
		if err := json.Unmarshal(body, w); err != nil {
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) {
				return badRequest("invalid_type", te.Field, "Invalid type for '%s': %v", te.Field, err)
			}
			return badRequest("invalid_json", "", "We could not parse the JSON body of your request: %v", err)
		}
	}
	if fast {
		// decodeWireBody found no name repeated or case-folded: nothing
		// ambiguousMember would refuse (FuzzWireBody).
	} else if name, f, dup := ambiguousMember(body, readFields); dup {
		return duplicateMember(name)
	} else if f != "" {
		return badRequest("invalid_request_error", name,
			"Unrecognized request argument %q: did you mean %q? Member names are case-sensitive.", name, f)
	}
	if w.Model == "" {
		return badRequest("missing_required_parameter", "model", "You must provide a model parameter.")
	}
	req := aitoken.Request{Messages: w.Messages, Prompt: w.Prompt, Input: w.Input, Instructions: w.Instructions, Tools: w.Tools, Functions: w.Functions}
	// Exact for OpenAI models, the heuristic for others (package aitoken).
	counter := aitoken.ForModel(w.Model)
	*p = parsedBody{model: w.Model, stream: w.Stream, streamOptions: w.StreamOptions, promptEst: counter.PromptTokensCached(&req, cache), choices: 1,
		rateReq: req}
	if w.ServiceTier != nil {
		p.serviceTier = *w.ServiceTier
	}
	p.background = w.Background && ep == epResponses
	if w.PromptCacheKey != nil {
		p.cacheKey = *w.PromptCacheKey
	}
	// An input_audio part. Unescaped, these bytes are a member name, a
	// part type, or a string that is exactly input_audio: a rare refusal
	// of a text request under a budget, on the safe side.
	p.audio = slices.Contains(w.Modalities, "audio") || (len(w.Audio) > 0 && string(w.Audio) != "null") ||
		bytes.Contains(body, []byte(`"input_audio"`))
	if ep == epEmbeddings {
		return nil // no completion: the prompt is the whole cost
	}
	p.promptEst = addSat(p.promptEst, rawInputTokens(counter, w.ResponseFormat, w.Text, w.Prediction, w.Suffix))
	p.rateRaw = [...]json.RawMessage{w.ResponseFormat, w.Text, w.Prediction, w.Suffix}
	for i, v := range []*int64{w.MaxCompletionTokens, w.MaxTokens, w.MaxOutputTokens} {
		if v == nil {
			continue
		}
		if *v < 1 {
			// Some servers read 0 or -1 as "no limit".
			return badRequest("invalid_value", budgetFields[i], "Invalid '%s': integer below minimum value. Expected a value >= 1, but got %d instead.", budgetFields[i], *v)
		}
		p.budget, p.explicit = max(p.budget, *v), true
	}
	for i, v := range []*int64{w.N, w.BestOf} {
		name := [...]string{"n", "best_of"}[i]
		if v == nil {
			continue
		}
		if *v < 1 || *v > maxChoices {
			return badRequest("invalid_value", name, "Invalid '%s': expected an integer from 1 to %d, but got %d instead.", name, maxChoices, *v)
		}
		p.choices = max(p.choices, *v)
	}
	if ep == epCompletions {
		// Each prompt of a batch gets its own choices.
		p.choices *= promptCount(w.Prompt)
	}
	return nil
}

// rateLimitTokens is the prompt as OpenAI's and Azure OpenAI's rate
// limiters estimate it, from its characters and images (aitoken's
// RateLimitTokens): what an upstream of those kinds counts. Only an
// upstream pool reads it (pool.go), so it is counted only then: it
// decoded the messages a second time on every request.
func (p *parsedBody) rateLimitTokens() int64 {
	n := p.rateReq.RateLimitTokens()
	for _, raw := range p.rateRaw {
		n = addSat(n, aitoken.RateLimitChars(raw))
	}
	return n
}

// promptCount is how many prompts a completions request's prompt holds:
// the length of an array of strings or of token arrays (a batch, each
// generating its own completions), else 1 (a string, or one prompt's
// token ids). Without it a batch of 100 prompts reserved one completion
// budget and the upstream generated 100.
func promptCount(raw json.RawMessage) int64 {
	var batch []json.RawMessage
	if len(raw) == 0 || raw[0] != '[' || json.Unmarshal(raw, &batch) != nil {
		return 1
	}
	var n int64
	for _, e := range batch {
		if len(e) > 0 && (e[0] == '"' || e[0] == '[') {
			n++
		}
	}
	return max(n, 1)
}

// ambiguousMember returns the first member name of body (a JSON object
// that json.Unmarshal accepted) that another parser may read differently
// from the gateway: a top-level name that differs from one of fields (the
// names the gateway reads) only by case, with that field; or a name
// repeated in one object, anywhere in the body, with dup true: encoding/json
// reads the last occurrence, first-wins parsers (gjson, simdjson) the first,
// so {"max_tokens":100000,"max_tokens":1} or a message whose long
// "content" is followed by a short one would reserve the short reading and
// run the long one. "", "", false when there is none. One pass over the
// bytes without allocating, but for names with escapes (decoded) and
// objects of more than smallObject members (a set).
func ambiguousMember(body []byte, fields []string) (name, field string, dup bool) {
	const smallObject = 16
	type member struct {
		from, to int  // the name: src[from:to]
		decoded  bool // src is dec, not body
	}
	type container struct {
		obj, keyNext bool
		first        int                 // the object's first member in names
		set          map[string]struct{} // its names, past smallObject members
	}
	var stackBuf [32]container
	var namesBuf [64]member
	stack, names := stackBuf[:0], namesBuf[:0]
	var dec []byte // decoded names with escapes
	bytesOf := func(m member) []byte {
		if m.decoded {
			return dec[m.from:m.to]
		}
		return body[m.from:m.to]
	}
	inString, escaped := false, false
	keyStart := -1
	for i := 0; i < len(body); i++ {
		if inString {
			// Skip to the closing quote, escapes one by one.
			j := bytes.IndexByte(body[i:], '"')
			if j < 0 {
				break // not reached: body is valid JSON
			}
			if k := bytes.IndexByte(body[i:i+j], '\\'); k >= 0 {
				i += k + 1 // the loop skips the escaped byte
				escaped = true
				continue
			}
			i += j // the closing quote
			inString = false
			if keyStart < 0 {
				continue
			}
			m := member{from: keyStart, to: i}
			if escaped {
				var n string
				_ = json.Unmarshal(body[keyStart-1:i+1], &n)
				m = member{from: len(dec), to: len(dec) + len(n), decoded: true}
				dec = append(dec, n...)
			}
			keyStart = -1
			key := bytesOf(m)
			top := &stack[len(stack)-1]
			if len(stack) == 1 {
				if f := caseVariant(string(key), fields); f != "" {
					return string(key), f, false
				}
			}
			if top.set != nil {
				if _, ok := top.set[string(key)]; ok {
					return string(key), "", true
				}
				top.set[string(key)] = struct{}{}
				continue
			}
			for _, o := range names[top.first:] {
				if bytes.Equal(bytesOf(o), key) {
					return string(key), "", true
				}
			}
			names = append(names, m)
			if len(names)-top.first > smallObject {
				top.set = make(map[string]struct{}, 2*smallObject)
				for _, o := range names[top.first:] {
					top.set[string(bytesOf(o))] = struct{}{}
				}
				names = names[:top.first]
			}
			continue
		}
		switch body[i] {
		case '"':
			inString, escaped = true, false
			if n := len(stack); n > 0 && stack[n-1].obj && stack[n-1].keyNext {
				keyStart, stack[n-1].keyNext = i+1, false
			}
		case '{':
			stack = append(stack, container{obj: true, keyNext: true, first: len(names)})
		case '[':
			stack = append(stack, container{first: len(names)})
		case '}', ']':
			if n := len(stack); n > 0 {
				names = names[:stack[n-1].first]
				stack = stack[:n-1]
			}
		case ',':
			if n := len(stack); n > 0 && stack[n-1].obj {
				stack[n-1].keyNext = true
			}
		}
	}
	return "", "", false
}

// duplicateMember refuses a body with a member name repeated in one object.
func duplicateMember(name string) *requestError {
	return badRequest("invalid_request_error", name,
		"The member %q appears twice in one object; parsers disagree on which one counts, so the gateway refuses it. Send each member once.", name)
}

// caseVariant returns the member of fields that name differs from only by
// case, or "".
func caseVariant(name string, fields []string) string {
	for _, f := range fields {
		if name != f && strings.EqualFold(name, f) {
			return f
		}
	}
	return ""
}

// reservation is prompt + budget×choices, saturated at math.MaxInt64
// instead of wrapping; negative inputs count as 0 and choices below 1 as 1.
// It is monotone in every input.
func reservation(prompt, budget, choices int64) int64 {
	prompt, budget, choices = max(prompt, 0), max(budget, 0), max(choices, 1)
	if budget > (math.MaxInt64-prompt)/choices {
		return math.MaxInt64
	}
	return prompt + budget*choices
}

// addSat is a+b for non-negative a and b, saturated at math.MaxInt64.
func addSat(a, b int64) int64 {
	a, b = max(a, 0), max(b, 0)
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
