package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"
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
}

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
	// background is a responses request run in the background.
	background bool
	// audio is a request with audio input or output.
	audio bool
}

// parseBody reads a request body for endpoint ep.
func parseBody(body []byte, ep endpoint) (*parsedBody, *requestError) {
	return parseBodyCached(body, ep, nil)
}

// parseBodyCached is parseBody, counting the prompt with cache (nil:
// none), which remembers the exact counts of large messages.
func parseBodyCached(body []byte, ep endpoint, cache *aitoken.Cache) (*parsedBody, *requestError) {
	if !utf8.Valid(body) {
		return nil, badRequest("invalid_json", "", "The request body is not valid UTF-8 JSON.")
	}
	if t := bytes.TrimLeft(body, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return nil, badRequest("invalid_json", "", "The request body must be a JSON object.")
	}
	var w wireBody
	if err := json.Unmarshal(body, &w); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, badRequest("invalid_type", te.Field, "Invalid type for '%s': %v", te.Field, err)
		}
		return nil, badRequest("invalid_json", "", "We could not parse the JSON body of your request: %v", err)
	}
	if name, f, dup := ambiguousMember(body, readFields); dup {
		return nil, duplicateMember(name)
	} else if f != "" {
		return nil, badRequest("invalid_request_error", name,
			"Unrecognized request argument %q: did you mean %q? Member names are case-sensitive.", name, f)
	}
	if w.Model == "" {
		return nil, badRequest("missing_required_parameter", "model", "You must provide a model parameter.")
	}
	req := aitoken.Request{Messages: w.Messages, Prompt: w.Prompt, Input: w.Input, Instructions: w.Instructions, Tools: w.Tools, Functions: w.Functions}
	// Exact for OpenAI models, the heuristic for others (package aitoken).
	counter := aitoken.ForModel(w.Model)
	p := &parsedBody{model: w.Model, stream: w.Stream, streamOptions: w.StreamOptions, promptEst: counter.PromptTokensCached(&req, cache), choices: 1}
	if w.ServiceTier != nil {
		p.serviceTier = *w.ServiceTier
	}
	p.background = w.Background && ep == epResponses
	// An input_audio part. Unescaped, these bytes are a member name, a
	// part type, or a string that is exactly input_audio: a rare refusal
	// of a text request under a budget, on the safe side.
	p.audio = slices.Contains(w.Modalities, "audio") || (len(w.Audio) > 0 && string(w.Audio) != "null") ||
		bytes.Contains(body, []byte(`"input_audio"`))
	if ep == epEmbeddings {
		return p, nil // no completion: the prompt is the whole cost
	}
	p.promptEst = addSat(p.promptEst, rawInputTokens(counter, w.ResponseFormat, w.Text, w.Prediction, w.Suffix))
	for i, v := range []*int64{w.MaxCompletionTokens, w.MaxTokens, w.MaxOutputTokens} {
		if v == nil {
			continue
		}
		if *v < 1 {
			// Some servers read 0 or -1 as "no limit".
			return nil, badRequest("invalid_value", budgetFields[i], "Invalid '%s': integer below minimum value. Expected a value >= 1, but got %d instead.", budgetFields[i], *v)
		}
		p.budget, p.explicit = max(p.budget, *v), true
	}
	for i, v := range []*int64{w.N, w.BestOf} {
		name := [...]string{"n", "best_of"}[i]
		if v == nil {
			continue
		}
		if *v < 1 || *v > maxChoices {
			return nil, badRequest("invalid_value", name, "Invalid '%s': expected an integer from 1 to %d, but got %d instead.", name, maxChoices, *v)
		}
		p.choices = max(p.choices, *v)
	}
	if ep == epCompletions {
		// Each prompt of a batch gets its own choices.
		p.choices *= promptCount(w.Prompt)
	}
	return p, nil
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

// prepare reads and parses the body, estimates the tokens, computes the
// reservation and rewrites stream_options. It answers the client itself and
// reports false on error.
func (g *Gateway) prepare(w http.ResponseWriter, r *http.Request, c *call) bool {
	if enc := encodedBody(r.Header); enc != "" {
		// The gateway reads the bytes as JSON; an upstream would decode
		// them first, and could read another request (raw deflate and
		// brotli streams can be made that are also valid JSON).
		w.Header().Set("x-should-retry", "false")
		writeError(w, http.StatusUnsupportedMediaType, "invalid_request_error", "unsupported_content_encoding", "",
			fmt.Sprintf("Content-Encoding %q is not supported by the gateway; send the body uncompressed.", truncateName(enc)))
		return false
	}
	// The listener has no read timeout (a stream lasts as long as the
	// upstream's, and net/http cancels a request whose read deadline
	// passes), so the body gets its own deadline, lifted once it is read.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(g.bodyTimeout))
	body, err := readBody(http.MaxBytesReader(w, r.Body, g.cfg.MaxBodyBytes), r.ContentLength, g.cfg.MaxBodyBytes)
	_ = rc.SetReadDeadline(time.Time{})
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.Is(err, os.ErrDeadlineExceeded) {
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusRequestTimeout, "invalid_request_error", "request_timeout", "",
				fmt.Sprintf("The request body did not arrive within %s.", g.bodyTimeout))
		} else if errors.As(err, &tooBig) {
			w.Header().Set("x-should-retry", "false")
			writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_body_too_large", "",
				fmt.Sprintf("Request body exceeds the gateway's limit of %d bytes.", g.cfg.MaxBodyBytes))
		} else {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "", "", "Could not read the request body.")
		}
		return false
	}
	if c.ep.anthropic() {
		return g.prepareAnthropic(w, r, c, body)
	}
	p, perr := parseBodyCached(body, c.ep, g.tokenCache)
	if perr != nil {
		w.Header().Set("x-should-retry", "false")
		writeError(w, http.StatusBadRequest, "invalid_request_error", perr.code, perr.param, perr.msg)
		return false
	}
	c.model, c.rawModel = p.model, p.model
	if !g.models[c.model] {
		c.model = "other"
	}
	c.stream = p.stream
	if p.explicit {
		c.maxTokens = p.budget
	}
	c.promptEst = p.promptEst
	c.bud.serviceTier = p.serviceTier
	c.background = p.background
	c.bud.audio = p.audio
	budget := p.budget
	if c.ep != epEmbeddings && !p.explicit {
		budget = g.cfg.DefaultMaxTokens
	}
	c.reserved = reservation(c.promptEst, budget, p.choices)
	c.body = body
	if c.stream && (c.ep == epChat || c.ep == epCompletions) {
		rawSO, present := p.streamOptions, p.streamOptions != nil
		var so map[string]json.RawMessage
		if present && string(rawSO) != "null" {
			if json.Unmarshal(rawSO, &so) != nil || so == nil {
				writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_type", "stream_options", "stream_options must be an object.")
				return false
			}
		}
		c.wantUsage = string(so["include_usage"]) == "true"
		if !c.wantUsage && !present {
			// No stream_options: add it in place, without re-encoding
			// the body.
			c.body = insertIncludeUsage(body)
		} else if !c.wantUsage {
			if so == nil {
				so = map[string]json.RawMessage{}
			}
			so["include_usage"] = json.RawMessage("true")
			var members map[string]json.RawMessage
			if json.Unmarshal(body, &members) != nil {
				writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", "", "The request body must be a JSON object.")
				return false
			}
			members["stream_options"], _ = json.Marshal(so)
			c.body, _ = json.Marshal(members)
		}
	}
	if !p.explicit {
		// A default budget must not make a request too large that would fit.
		for i := range c.client.tier.specs {
			s := &c.client.tier.specs[i]
			if s.kind == kindTokens && s.applies(p.model) {
				g.clampDefaultBudget(c, s)
			}
		}
		if lv := c.client.levels; lv != nil { // and the team's and org's (levels.go)
			for i := range lv.specs {
				if s := &lv.specs[i]; s.kind == kindTokens && s.applies(p.model) {
					g.clampDefaultBudget(c, s)
				}
			}
		}
		if c.ep != epEmbeddings {
			// Whole tokens per choice, so that forwardCap's cap bounds the
			// completion to exactly what is reserved.
			c.defaultCap = max((c.reserved-c.promptEst)/p.choices, 1)
			c.reserved = reservation(c.promptEst, c.defaultCap, p.choices)
		}
		if c.background && !forwardCap(w, c) {
			// Its usage may never pass the gateway (settle keeps the
			// reservation): the upstream must not generate past it.
			return false
		}
	}
	c.reserved = max(c.reserved, 1)
	return true
}

// encodedBody returns the request's Content-Encoding when it names any
// coding but identity, or "".
func encodedBody(h http.Header) string {
	for _, v := range h.Values("Content-Encoding") {
		for _, enc := range strings.Split(v, ",") {
			if enc = strings.TrimSpace(enc); enc != "" && !strings.EqualFold(enc, "identity") {
				return v
			}
		}
	}
	return ""
}

// includeUsageMember is what insertIncludeUsage adds to a request body.
const includeUsageMember = `"stream_options":{"include_usage":true},`

// bodyTimeout is how long a request body may take to arrive: 8 MiB at
// about 1 Mbit/s.
const bodyTimeout = time.Minute

// readBody reads a request body whose length is known, or not (-1), in
// one allocation when it is known, with room for includeUsageMember.
func readBody(r io.Reader, length, limit int64) ([]byte, error) {
	size := int64(512)
	if length >= 0 && length <= limit {
		size = length + int64(len(includeUsageMember)) + 1 // +1: the read of EOF
	}
	b := make([]byte, 0, size)
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if errors.Is(err, io.EOF) {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
	}
}

// insertIncludeUsage adds includeUsageMember as the first member of body, a
// JSON object with at least one member and no stream_options, reusing
// body's spare capacity.
func insertIncludeUsage(body []byte) []byte {
	at := bytes.IndexByte(body, '{') + 1 // only white space comes before it
	n := len(body)
	body = append(body, includeUsageMember...)
	copy(body[at+len(includeUsageMember):], body[at:n])
	copy(body[at:], includeUsageMember)
	return body
}
