package gateway

// Anthropic Messages ingress
//
// POST /v1/messages and /v1/messages/count_tokens are metered like the
// OpenAI endpoints, through the same authentication, tiers, ApplyAll
// admission, leases and idempotent settlement; only the edges differ:
//
//   - The key is read from x-api-key (Anthropic's header) or, as for
//     OpenAI requests, Authorization: Bearer.
//   - Every answer the gateway writes itself has Anthropic's error shape
//     {"type":"error","error":{"type":"rate_limit_error","message":...}}
//     (anthropicWriter turns writeError's OpenAI body into it), and an
//     admitted or limited request also gets Anthropic's
//     anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
//     {limit,remaining,reset} headers, reset as an RFC 3339 time, besides
//     the OpenAI and IETF ones. An upstream's 429 and 529 overloaded_error
//     pass through as they are, and are refunded.
//   - The reservation is the input estimate plus max_tokens (required,
//     as upstream; 0 warms the prompt cache). Input includes system, messages and tools; an image
//     block costs anthropicImageTokens. When the body asks for prompt
//     caching (cache_control anywhere) the input estimate is weighted 1.25,
//     the price of a cache write, so the reservation stays an upper bound.
//   - Usage is read from the JSON body's usage, or from a stream's
//     message_start (input, cache tokens) and last message_delta (output,
//     cumulative). Cached input is weighted as Anthropic bills it: a cache
//     read 0.1 of an input token, a cache write 1.25, rounded up (so the
//     settled prompt tokens are input + ⌈1.25·writes⌉ + ⌈0.1·reads⌉). A
//     stream cut before message_delta is charged its input and what was
//     relayed (at least message_start's output count).
//   - count_tokens reserves no tokens: it takes a request, rpd and
//     concurrency slot only, as Anthropic's own count_tokens limits are
//     requests per minute.
//   - POST /v1/messages/batches is refused (404): a batch carries up to
//     100,000 requests the gateway could not meter.

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/httplimit"
	"github.com/sluice-io/sluice/internal/aitoken"
)

// The upstream APIs of UpstreamConfig.API.
const (
	// APIOpenAI is an OpenAI-compatible upstream: the gateway's key goes
	// as Authorization: Bearer.
	APIOpenAI = "openai"
	// APIAnthropic is Anthropic's API: the gateway's key goes as
	// x-api-key.
	APIAnthropic = "anthropic"
	// DefaultAnthropicKeyEnv is the key variable of an Anthropic upstream.
	DefaultAnthropicKeyEnv = "ANTHROPIC_API_KEY"
	// DefaultAnthropicVersion is the anthropic-version sent upstream when
	// the client sent none.
	DefaultAnthropicVersion = "2023-06-01"
)

// The Anthropic endpoints, numbered apart from the OpenAI ones.
const (
	epMessages endpoint = 64 + iota
	epCountTokens
)

// anthropic reports whether e speaks Anthropic's Messages API.
func (e endpoint) anthropic() bool { return e == epMessages || e == epCountTokens }

// anthropicImageTokens is reserved for an image block: Anthropic's cost of
// an image of about 1.15 megapixels, the largest that is not scaled down
// ((width×height)/750 tokens).
const anthropicImageTokens = 1600

// anthropicFields are the members the gateway reads of a Messages body; a
// member that differs from one only by case is refused.
var anthropicFields = []string{"model", "max_tokens", "stream", "system", "messages", "tools", "output_format", "output_config"}

// anthropicWriter marks a response as Anthropic's: writeError writes
// Anthropic's error shape to it.
type anthropicWriter struct{ http.ResponseWriter }

// Unwrap returns the underlying writer, for http.ResponseController.
func (w *anthropicWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush implements http.Flusher.
func (w *anthropicWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

// ingress answers the paths the gateway refuses itself (done reports that
// it did): batch endpoints, whose requests could not be metered, in any
// spelling (canonicalPath). For a path of the Messages API it wraps w in
// an anthropicWriter, so that errors are answered in Anthropic's shape.
func ingress(w http.ResponseWriter, r *http.Request) (_ http.ResponseWriter, done bool) {
	canon := canonicalPath(r.URL.Path)
	if (canon == "/v1/batches" || strings.HasPrefix(canon, "/v1/batches/")) && r.Method != http.MethodGet {
		// OpenAI's Batch API: its requests would run upstream on the
		// gateway's key, past every limit and budget.
		writeError(w, http.StatusNotFound, "invalid_request_error", "unknown_url", "",
			"Batches are not available through the sluice gateway: their requests could not be rate limited.")
		return w, true
	}
	if !strings.HasPrefix(canon, "/v1/messages") {
		return w, false
	}
	w = &anthropicWriter{w}
	if strings.HasPrefix(canon, "/v1/messages/batches") && r.Method != http.MethodGet {
		writeError(w, http.StatusNotFound, "invalid_request_error", "unknown_url", "",
			"Message batches are not available through the sluice gateway: their requests could not be rate limited.")
		return w, true
	}
	return w, false
}

// anthropicErrorType is Anthropic's error type for an HTTP status.
func anthropicErrorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case 529:
		return "overloaded_error"
	}
	return "api_error"
}

// writeAnthropicError answers with Anthropic's error shape.
func writeAnthropicError(w http.ResponseWriter, status int, code, msg string) {
	if code == "invalid_api_key" {
		msg = "Incorrect or missing API key. Send your sluice gateway key as: x-api-key: <key>."
	}
	b := marshalJSON(map[string]any{"type": "error", "error": map[string]string{"type": anthropicErrorType(status), "message": msg}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// anthropicBody is what the gateway reads of a Messages request body.
type anthropicBody struct {
	model     string
	stream    bool
	maxTokens int64
	promptEst int64
	// weigh is the input estimate's weighting for prompt caching, for an
	// upstream count to be weighted alike.
	weigh func(int64) int64
}

// parseAnthropicBody reads a /v1/messages or count_tokens body, with the
// rules of parseBody: valid UTF-8, a JSON object, no case variants of the
// members read, no member repeated in one object.
func parseAnthropicBody(body []byte, ep endpoint) (*anthropicBody, *requestError) {
	if !utf8.Valid(body) {
		return nil, badRequest("invalid_json", "", "The request body is not valid UTF-8 JSON.")
	}
	if t := bytes.TrimLeft(body, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return nil, badRequest("invalid_json", "", "The request body must be a JSON object.")
	}
	var w struct {
		Model     string `json:"model"`
		MaxTokens *int64 `json:"max_tokens"`
		Stream    bool   `json:"stream"`
		System    any    `json:"system"`
		Messages  []any  `json:"messages"`
		Tools     []any  `json:"tools"`
		// A structured output's JSON schema, which the model reads too:
		// counted as raw JSON text (rawInputTokens).
		OutputFormat json.RawMessage `json:"output_format"`
		OutputConfig json.RawMessage `json:"output_config"`
	}
	if err := json.Unmarshal(body, &w); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, badRequest("invalid_type", te.Field, "%s: invalid type: %v", te.Field, err)
		}
		return nil, badRequest("invalid_json", "", "The request body is not valid JSON: %v", err)
	}
	if name, f, dup := ambiguousMember(body, anthropicFields); dup {
		return nil, duplicateMember(name)
	} else if f != "" {
		return nil, badRequest("invalid_request_error", name, "%s: Extra inputs are not permitted (did you mean %q? member names are case-sensitive)", name, f)
	}
	if w.Model == "" {
		return nil, badRequest("missing_required_parameter", "model", "model: Field required")
	}
	p := &anthropicBody{model: w.Model, stream: w.Stream}
	if ep == epMessages {
		switch {
		case w.MaxTokens == nil:
			return nil, badRequest("missing_required_parameter", "max_tokens", "max_tokens: Field required")
		case *w.MaxTokens < 0:
			// 0 is valid: it warms the prompt cache, generating nothing.
			return nil, badRequest("invalid_value", "max_tokens", "max_tokens: Input should be greater than or equal to 0, got %d", *w.MaxTokens)
		}
		p.maxTokens = *w.MaxTokens
	}
	n := anthropicTokens(w.System) + anthropicTokens(w.Tools)
	n = addSat(n, rawInputTokens(aitoken.ForModel(w.Model), w.OutputFormat, w.OutputConfig))
	for _, m := range w.Messages {
		n = addSat(n, aitoken.MessageOverhead+anthropicTokens(m))
	}
	p.weigh = func(n int64) int64 { return n }
	if bytes.Contains(body, []byte(`"cache_control"`)) {
		// Every input token may be a cache write; with a "ttl" (1h) one
		// billed at twice the input price.
		if bytes.Contains(body, []byte(`"ttl"`)) {
			p.weigh = cacheWrite1hTokens
		} else {
			p.weigh = cacheWriteTokens
		}
	}
	p.promptEst = p.weigh(n)
	return p, nil
}

// anthropicTokens estimates the tokens of a decoded JSON value of a
// Messages body: its strings and numbers, an image block as
// anthropicImageTokens, without the members that are not model input.
func anthropicTokens(v any) int64 {
	switch v := v.(type) {
	case string:
		return aitoken.Count(v)
	case float64, bool:
		return 1
	case []any:
		var n int64
		for _, e := range v {
			n = addSat(n, anthropicTokens(e))
		}
		return n
	case map[string]any:
		if v["type"] == "image" {
			return anthropicImageTokens
		}
		var n int64
		for k, e := range v {
			switch k {
			case "type", "role", "id", "tool_use_id", "cache_control", "media_type", "signature":
				continue
			}
			n = addSat(n, anthropicTokens(e))
		}
		return n
	}
	return 0
}

// cacheWriteTokens is n input tokens written to the cache, as billed:
// ⌈1.25·n⌉.
func cacheWriteTokens(n int64) int64 {
	n = min(max(n, 0), maxUsageTokens)
	return n + (n+3)/4
}

// cacheWrite1hTokens is n input tokens written to the cache for an hour
// ("ttl": "1h"), as billed: 2·n.
func cacheWrite1hTokens(n int64) int64 {
	return 2 * min(max(n, 0), maxUsageTokens)
}

// cacheReadTokens is n input tokens read from the cache, as billed:
// ⌈0.1·n⌉.
func cacheReadTokens(n int64) int64 {
	n = min(max(n, 0), maxUsageTokens)
	return (n + 9) / 10
}

// maxUsageTokens bounds each usage number an upstream reports, so that
// weighting cannot overflow.
const maxUsageTokens = 1 << 50

// prepareAnthropic is prepare for the Anthropic endpoints, body read.
func (g *Gateway) prepareAnthropic(w http.ResponseWriter, r *http.Request, c *call, body []byte) bool {
	p, perr := parseAnthropicBody(body, c.ep)
	if perr != nil {
		w.Header().Set("x-should-retry", "false")
		writeError(w, http.StatusBadRequest, "invalid_request_error", perr.code, perr.param, perr.msg)
		return false
	}
	c.model, c.rawModel = p.model, p.model
	if !g.models[c.model] {
		c.model = "other"
	}
	c.body = body
	if c.ep == epCountTokens {
		return true // no tokens reserved or charged: promptEst and reserved stay 0
	}
	c.stream = p.stream
	c.maxTokens = p.maxTokens
	if g.wantsUpstreamCount(c) {
		// Counted once the client's own limits admitted it (countAdmitted).
		c.countWeigh = p.weigh
	}
	c.promptEst = p.promptEst
	c.reserved = max(reservation(p.promptEst, p.maxTokens, 1), 1)
	return true
}

// anthropicUsage is what a call learnt of Anthropic's usage.
type anthropicUsage struct {
	input, cacheCreation, cacheRead int64
	// cacheCreation1h is the part of cacheCreation written for an hour.
	cacheCreation1h int64
	// startOutput is message_start's output_tokens; output the final
	// count, when final.
	startOutput, output int64
	final               bool
}

// setAnthropicUsage records a usage object of a JSON body or a
// message_delta: it is final.
func (c *call) setAnthropicUsage(u *usageJSON) {
	c.anth.setInput(u)
	c.anth.output, c.anth.final = min(max(u.OutputTokens, 0), maxUsageTokens), true
	c.applyAnthropicUsage()
}

// setInput records the input numbers of u, when it has any (a
// message_delta may repeat them, or not).
func (a *anthropicUsage) setInput(u *usageJSON) {
	if u.InputTokens == 0 && u.CacheCreationInputTokens == 0 && u.CacheReadInputTokens == 0 {
		return
	}
	clamp := func(n int64) int64 { return min(max(n, 0), maxUsageTokens) }
	a.input, a.cacheCreation, a.cacheRead = clamp(u.InputTokens), clamp(u.CacheCreationInputTokens), clamp(u.CacheReadInputTokens)
	a.cacheCreation1h = 0
	if cc := u.CacheCreation; cc != nil {
		a.cacheCreation1h = min(clamp(cc.Ephemeral1h), a.cacheCreation)
	}
}

// weightedInput is the input as Anthropic bills it, in input tokens:
// input + ⌈1.25·5-minute writes⌉ + 2·1-hour writes + ⌈0.1·reads⌉.
func (a *anthropicUsage) weightedInput() int64 {
	writes := addSat(cacheWriteTokens(a.cacheCreation-a.cacheCreation1h), cacheWrite1hTokens(a.cacheCreation1h))
	return addSat(addSat(a.input, writes), cacheReadTokens(a.cacheRead))
}

// applyAnthropicUsage sets the call's usage from what it learnt: the
// weighted input, and the final output or, until it is known, what the
// stream relayed.
func (c *call) applyAnthropicUsage() {
	a := &c.anth
	c.usageSeen = true
	c.prompt = a.weightedInput()
	if a.final {
		c.completion = a.output
	} else {
		c.completion = max(a.startOutput, c.produced)
	}
}

// anthropicEvent is what the gateway reads of a streamed Messages event.
type anthropicEvent struct {
	Type    string `json:"type"`
	Message *struct {
		Model string     `json:"model"`
		Usage *usageJSON `json:"usage"`
	} `json:"message"`
	Delta *struct {
		Text        string `json:"text"`
		PartialJSON string `json:"partial_json"`
		Thinking    string `json:"thinking"`
	} `json:"delta"`
	Usage *usageJSON `json:"usage"`
}

// inspectAnthropic reads one streamed event's data: message_start's usage,
// the tokens of a content_block_delta, message_delta's usage.
func (c *call) inspectAnthropic(data []byte) {
	var ev anthropicEvent
	if json.Unmarshal(data, &ev) != nil {
		return
	}
	switch ev.Type {
	case "message_start":
		if ev.Message != nil && c.respModel == "" {
			c.respModel = ev.Message.Model
		}
		if ev.Message == nil || ev.Message.Usage == nil || ev.Message.Usage.negative() {
			return
		}
		c.anth.setInput(ev.Message.Usage)
		c.anth.startOutput = min(max(ev.Message.Usage.OutputTokens, 0), maxUsageTokens)
	case "content_block_delta":
		if ev.Delta == nil {
			return
		}
		d := ev.Delta
		n := aitoken.Count(d.Text) + aitoken.Count(d.PartialJSON) + aitoken.Count(d.Thinking)
		if n == 0 && (d.Text != "" || d.PartialJSON != "" || d.Thinking != "") {
			n = 1 // whitespace is a token too
		}
		c.produced = addSat(c.produced, n)
		if !c.usageSeen {
			return
		}
	case "message_delta":
		if ev.Usage == nil || ev.Usage.negative() {
			return
		}
		c.setAnthropicUsage(ev.Usage)
		return
	default:
		return
	}
	c.applyAnthropicUsage()
}

// The anthropic-ratelimit-* header fields, in the order of
// anthropicGroups: limit, remaining, reset for each.
var anthropicFields3 = [4][3]string{
	{"Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset"},
	{"Anthropic-Ratelimit-Tokens-Limit", "Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset"},
	{"Anthropic-Ratelimit-Input-Tokens-Limit", "Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset"},
	{"Anthropic-Ratelimit-Output-Tokens-Limit", "Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset"},
}

// anthropicGroup reports which anthropic-ratelimit-* group a spec
// belongs to: 0 requests, 1 tokens, 2 input tokens (itpm), 3 output tokens
// (otpm); -1 none. The input and output groups are also tokens.
func anthropicGroup(s *spec) int {
	switch {
	case s.kind == kindRequests:
		return 0
	case s.kind == kindTokens && s.name == "itpm":
		return 2
	case s.kind == kindTokens && s.name == "otpm":
		return 3
	case s.kind == kindTokens:
		return 1
	}
	return -1
}

// setAnthropicHeaders writes Anthropic's rate-limit headers for the
// decisions ds of c's limits: per group, the limit that binds first (as
// for OpenAI's headers, httplimit.Binding), its rate, what is left, and
// when it is full again as an RFC 3339 time rounded up to the second. The
// tokens group is the most restrictive of every token limit, as
// Anthropic's is of its input and output limits.
func setAnthropicHeaders(h http.Header, c *call, ds []sluice.Decision, now time.Time) {
	var groups [4][]httplimit.Quota
	for i, d := range ds {
		g := anthropicGroup(c.specs[i])
		if g < 0 {
			continue
		}
		q := c.specs[i].quota(d)
		groups[g] = append(groups[g], q)
		if g >= 2 {
			groups[1] = append(groups[1], q)
		}
	}
	for g, qs := range groups {
		if len(qs) == 0 {
			continue
		}
		q := &qs[httplimit.Binding(qs, qs[0].Unit)]
		d := &q.Decision
		reset := now.Add(max(d.ResetAfter, 0) + time.Second - 1).Truncate(time.Second).UTC()
		f := &anthropicFields3[g]
		h[f[0]] = []string{strconv.FormatInt(d.Limit.Rate, 10)}
		h[f[1]] = []string{strconv.FormatInt(max(d.Remaining, 0), 10)}
		h[f[2]] = []string{reset.Format(time.RFC3339)}
	}
}

// rewriteAnthropic finishes the upstream request of an Anthropic upstream
// or path: an Anthropic upstream gets the gateway's key as x-api-key
// instead of a bearer token, and a request under /v1/messages (metered or
// passed through) an anthropic-version when the client sent none.
func (g *Gateway) rewriteAnthropic(out *http.Request, inPath string) {
	if g.cfg.Upstream.API == APIAnthropic {
		out.Header.Del("Authorization")
		if g.upstreamKey != "" {
			out.Header["X-Api-Key"] = []string{g.upstreamKey}
		}
	}
	if strings.HasPrefix(inPath, "/v1/messages") && out.Header.Get("Anthropic-Version") == "" {
		out.Header["Anthropic-Version"] = []string{DefaultAnthropicVersion}
	}
}
