package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"

	"github.com/sluice-io/sluice/internal/aitoken"
)

// usageJSON is the usage object of every endpoint: chat and completions
// report prompt/completion tokens, responses input/output tokens,
// embeddings prompt tokens only.
type usageJSON struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	InputTokens      int64 `json:"input_tokens"`
	OutputTokens     int64 `json:"output_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
	// The cached and reasoning parts: prompt_tokens_details and
	// completion_tokens_details for chat and completions,
	// input_tokens_details and output_tokens_details for responses.
	PromptTokensDetails     *tokenDetails `json:"prompt_tokens_details"`
	CompletionTokensDetails *tokenDetails `json:"completion_tokens_details"`
	InputTokensDetails      *tokenDetails `json:"input_tokens_details"`
	OutputTokensDetails     *tokenDetails `json:"output_tokens_details"`
	// Anthropic's cached input (anthropic.go).
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	// The cache writes by lifetime: 1-hour writes cost more.
	CacheCreation *cacheCreationJSON `json:"cache_creation"`
}

// cacheCreationJSON is Anthropic's breakdown of cache writes.
type cacheCreationJSON struct {
	Ephemeral5m int64 `json:"ephemeral_5m_input_tokens"`
	Ephemeral1h int64 `json:"ephemeral_1h_input_tokens"`
}

// negative reports whether any number of u is below zero.
func (u *usageJSON) negative() bool {
	if min(u.PromptTokens, u.CompletionTokens, u.InputTokens, u.OutputTokens, u.TotalTokens,
		u.CacheCreationInputTokens, u.CacheReadInputTokens) < 0 {
		return true
	}
	if cc := u.CacheCreation; cc != nil && min(cc.Ephemeral5m, cc.Ephemeral1h) < 0 {
		return true
	}
	for _, d := range []*tokenDetails{u.PromptTokensDetails, u.CompletionTokensDetails, u.InputTokensDetails, u.OutputTokensDetails} {
		if d != nil && min(d.CachedTokens, d.ReasoningTokens) < 0 {
			return true
		}
	}
	return false
}

// tokenDetails is the breakdown of a usage count.
type tokenDetails struct {
	CachedTokens    int64 `json:"cached_tokens"`
	ReasoningTokens int64 `json:"reasoning_tokens"`
}

// setUsage records usage; sums saturate. A usage with a negative number
// is not believed (it charged nothing: a free request): it is ignored, and
// the request settles as if the upstream had reported none.
func (c *call) setUsage(u *usageJSON) {
	if u.negative() {
		return
	}
	if c.ep.anthropic() {
		c.setAnthropicUsage(u)
		return
	}
	c.usageSeen = true
	c.bud.setDetails(u)
	c.prompt = addSat(u.PromptTokens, u.InputTokens)
	c.completion = addSat(u.CompletionTokens, u.OutputTokens)
	if c.prompt == 0 && c.completion == 0 && u.TotalTokens > 0 {
		c.prompt = u.TotalTokens
	}
}

// captureReader relays a JSON body unchanged and keeps a bounded copy,
// whose usage settle reads (call.readCapturedUsage) once the response has
// gone to the client: decoding it is off the client's path.
type captureReader struct {
	src   io.ReadCloser
	c     *call
	limit int
	buf   []byte
	over  bool
}

// newCaptureReader captures src for c, up to limit bytes; length is the
// body's Content-Length (-1 when unknown), which sizes the copy.
func newCaptureReader(src io.ReadCloser, c *call, length int64, limit int) *captureReader {
	r := &captureReader{src: src, c: c, limit: limit}
	if length > 0 && length <= int64(limit) {
		r.buf = getCapture(int(length))
	}
	return r
}

// captureBufs recycle the copies of JSON responses (captureReader), by
// size class: captureBufs[i] holds buffers of capacity 1 KiB << i, up to
// 64 KiB; larger copies are allocated each time. A copy goes back once
// settlement has read its usage (call.readCapturedUsage); nothing keeps a
// reference into it (the usage is numbers). Without it every JSON
// response was copied into memory of its own: a completion's whole text.
var captureBufs [7]sync.Pool

// captureBuf is a pooled copy's slice, kept in the pool by pointer.
type captureBuf struct{ b []byte }

// getCapture returns an empty buffer for at least n bytes.
func getCapture(n int) []byte {
	for i := range captureBufs {
		if size := 1024 << i; n <= size {
			if cb, ok := captureBufs[i].Get().(*captureBuf); ok {
				b := cb.b[:0]
				cb.b = nil
				captureFree.Put(cb)
				return b
			}
			return make([]byte, 0, size)
		}
	}
	return make([]byte, 0, n)
}

// putCapture gives b back to its size class, if it has one.
func putCapture(b []byte) {
	for i := range captureBufs {
		if cap(b) == 1024<<i {
			cb, _ := captureFree.Get().(*captureBuf)
			if cb == nil {
				cb = new(captureBuf)
			}
			cb.b = b
			captureBufs[i].Put(cb)
			return
		}
	}
}

// captureFree holds captureBufs' empty holders, so that putting a buffer
// back allocates nothing.
var captureFree sync.Pool

func (r *captureReader) Read(p []byte) (int, error) {
	n, err := r.src.Read(p)
	if !r.over {
		if len(r.buf)+n > r.limit {
			r.over = true
			r.buf = nil
		} else {
			r.buf = append(r.buf, p[:n]...)
		}
	}
	if errors.Is(err, io.EOF) && !r.over {
		r.c.captured = r.buf
		r.buf = nil
		r.over = true
	}
	return n, err
}

func (r *captureReader) Close() error { return r.src.Close() }

// readCapturedUsage records the usage of the JSON body captured whole, if
// any; settle calls it first.
func (c *call) readCapturedUsage() {
	if c.captured == nil {
		return
	}
	if u := findUsage(c.captured); u != nil {
		c.setUsage(u)
	}
	putCapture(c.captured)
	c.captured = nil
}

// findUsage reads the top-level "usage" object of a response body. It
// decodes only from the last "usage" key on, which the APIs put at the end,
// and falls back to decoding the whole body.
func findUsage(body []byte) *usageJSON {
	if i := bytes.LastIndex(body, []byte(`"usage"`)); i >= 0 {
		rest := bytes.TrimLeft(body[i+len(`"usage"`):], " \t\r\n")
		if len(rest) > 0 && rest[0] == ':' {
			rest = bytes.TrimLeft(rest[1:], " \t\r\n")
			var u usageJSON
			// The object alone, when its end is found: a json.Decoder
			// copied the rest of the body into a buffer of its own first
			// (findUsage was 14% of BenchmarkServeHTTP's CPU).
			if n := objectLen(rest); n > 0 {
				if decodeUsage(rest[:n], &u) {
					return &u
				}
				u = usageJSON{}
				if json.Unmarshal(rest[:n], &u) == nil {
					return &u // a "usage" inside a string would be escaped
				}
			} else if json.NewDecoder(bytes.NewReader(rest)).Decode(&u) == nil {
				return &u
			}
		}
	}
	var whole struct {
		Usage *usageJSON `json:"usage"`
	}
	if json.Unmarshal(body, &whole) == nil {
		return whole.Usage
	}
	return nil
}

// objectLen is the length of the JSON object b starts with, up to and
// including its closing brace, or 0 if b does not start with '{' or the
// object does not end in b. It only matches braces outside strings;
// json.Unmarshal checks the rest.
func objectLen(b []byte) int {
	if len(b) == 0 || b[0] != '{' {
		return 0
	}
	depth, inString := 0, false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case inString:
			switch c {
			case '\\':
				i++ // the escaped byte
			case '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	return 0
}

// sseReader relays an SSE stream as it arrives. Each Read returns every
// complete line already received, and never waits for more once it has
// one, so an event goes out in one write the moment its last line is in
// (ReverseProxy flushes every write). A line that may be the usage event
// (it holds the bytes "usage") is parsed before it is relayed, so that it
// can be dropped when the client did not ask for it; the other events are
// parsed after they were relayed, at the next Read or at Close, off the
// path of their first byte, to count the content tokens produced.
type sseReader struct {
	src     io.ReadCloser
	br      *bufio.Reader // from sseBuffers; nil once closed
	c       *call
	out     []byte // the rest of a line that did not fit the last Read
	pending []byte // relayed data payloads not yet parsed, '\n'-separated
	// long is a line longer than the line buffer, relayed piece by piece
	// and kept (up to maxSSELine) to be parsed once whole; inLong says
	// such a line is being read.
	long      []byte
	inLong    bool
	dropBlank bool
	err       error
}

// maxSSELine bounds the line an SSE relay keeps to parse when it is longer
// than its line buffer: the responses API's response.completed event
// carries the whole response (its output, and the request's instructions
// and tools echoed) before its usage.
const maxSSELine = defaultMaxResponseBytes

// sseBuffers recycles the relays' 64 KiB line buffers.
var sseBuffers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 64<<10) }}

var usageKey = []byte(`"usage"`)

func newSSEReader(src io.ReadCloser, c *call) *sseReader {
	br := sseBuffers.Get().(*bufio.Reader)
	br.Reset(src)
	return &sseReader{src: src, br: br, c: c}
}

func (r *sseReader) Read(p []byte) (int, error) {
	r.parsePending()
	if r.br == nil {
		return 0, http.ErrBodyReadAfterClose
	}
	n := 0
	for n < len(p) {
		if len(r.out) > 0 {
			k := copy(p[n:], r.out)
			r.out, n = r.out[k:], n+k
			continue
		}
		if n > 0 && !r.lineBuffered() {
			break // relay what is complete now
		}
		if r.err != nil {
			if n > 0 {
				break
			}
			return 0, r.err
		}
		line, err := r.br.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			// An overlong line is relayed as it comes and parsed once
			// whole, after it was relayed: it may be the usage event.
			r.keepLong(line)
			r.out = line
			continue
		case err != nil:
			r.err = err
		}
		if r.inLong {
			r.keepLong(line)
			r.endLong()
			r.out = line
			continue
		}
		if len(line) > 0 && r.keep(line) {
			r.out = line
		}
	}
	return n, nil
}

// keepLong adds a piece of an overlong line to r.long, up to maxSSELine;
// past it the line is not read, and settlement cannot trust the usage it
// saw (call.unread).
func (r *sseReader) keepLong(piece []byte) {
	r.inLong = true
	if r.c.unread {
		return
	}
	if len(r.long)+len(piece) > maxSSELine {
		r.c.unread, r.long = true, nil
		return
	}
	r.long = append(r.long, piece...)
}

// endLong queues the overlong line read whole for parsing, if it is an
// event's data.
func (r *sseReader) endLong() {
	line := r.long
	r.long, r.inLong = nil, false
	data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:"))
	if data = bytes.TrimSpace(data); ok && len(data) > 0 && data[0] == '{' {
		r.pending = append(append(r.pending, data...), '\n')
	}
}

// lineBuffered reports whether a whole line can be read without waiting.
func (r *sseReader) lineBuffered() bool {
	b, _ := r.br.Peek(r.br.Buffered())
	return bytes.IndexByte(b, '\n') >= 0
}

// parsePending counts the tokens of the events relayed unparsed.
func (r *sseReader) parsePending() {
	for rest := r.pending; len(rest) > 0; {
		var data []byte
		data, rest, _ = bytes.Cut(rest, []byte{'\n'})
		r.inspect(data)
	}
	r.pending = r.pending[:0]
}

// Close parses what is pending, so that settlement counts every token
// relayed, and recycles the line buffer.
func (r *sseReader) Close() error {
	r.parsePending()
	if r.br != nil {
		r.br.Reset(nil)
		sseBuffers.Put(r.br)
		r.br, r.out = nil, nil
	}
	return r.src.Close()
}

// sseEvent is what the gateway reads of a streamed event.
type sseEvent struct {
	Choices []struct {
		Delta struct {
			Content          string          `json:"content"`
			Refusal          string          `json:"refusal"`
			ReasoningContent string          `json:"reasoning_content"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
		Text string `json:"text"`
	} `json:"choices"`
	Usage *usageJSON `json:"usage"`
	// The responses API's events.
	Type     string `json:"type"`
	Delta    string `json:"delta"`
	Response *struct {
		Usage *usageJSON `json:"usage"`
	} `json:"response"`
}

// eventModel reads the model a streamed event names: a chat or
// completions chunk's "model", a responses event's "response.model".
func eventModel(data []byte) string {
	var ev struct {
		Model    string `json:"model"`
		Response *struct {
			Model string `json:"model"`
		} `json:"response"`
	}
	if json.Unmarshal(data, &ev) != nil {
		return ""
	}
	if ev.Model == "" && ev.Response != nil {
		return ev.Response.Model
	}
	return ev.Model
}

// keep inspects one line and reports whether to relay it.
func (r *sseReader) keep(line []byte) bool {
	trimmed := bytes.TrimRight(line, "\r\n")
	if len(trimmed) == 0 {
		if r.dropBlank {
			r.dropBlank = false
			return false
		}
		return true
	}
	data, ok := bytes.CutPrefix(trimmed, []byte("data:"))
	if !ok {
		return true
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return true
	}
	if !bytes.Contains(data, usageKey) {
		// Not droppable: parsed after it is relayed.
		r.pending = append(append(r.pending, data...), '\n')
		return true
	}
	if r.inspect(data) {
		r.dropBlank = true
		return false
	}
	return true
}

// inspect parses one event's data, counts its content tokens and reads its
// usage. It reports whether the event is a usage event the client did not
// ask for.
func (r *sseReader) inspect(data []byte) bool {
	if r.c.ep.anthropic() {
		r.c.inspectAnthropic(data)
		return false // Anthropic's usage events are the client's too
	}
	var ev sseEvent
	if json.Unmarshal(data, &ev) != nil {
		return false
	}
	c := r.c
	if c.traced && c.respModel == "" {
		c.respModel = eventModel(data) // for the span; read until found
	}
	for _, ch := range ev.Choices {
		d := ch.Delta
		n := aitoken.Count(d.Content) + aitoken.Count(d.Refusal) + aitoken.Count(d.ReasoningContent) + aitoken.Count(ch.Text)
		if len(d.ToolCalls) > 0 && string(d.ToolCalls) != "null" {
			n += aitoken.Count(string(d.ToolCalls))
		}
		if n == 0 && (d.Content != "" || d.Refusal != "" || d.ReasoningContent != "" || ch.Text != "") {
			n = 1 // whitespace is a token too
		}
		c.produced = addSat(c.produced, n)
	}
	if ev.Type != "" && ev.Delta != "" && len(ev.Type) > 6 && ev.Type[len(ev.Type)-6:] == ".delta" {
		c.produced = addSat(c.produced, max(aitoken.Count(ev.Delta), 1))
	}
	if ev.Response != nil && ev.Response.Usage != nil {
		c.setUsage(ev.Response.Usage)
	}
	if ev.Usage != nil {
		c.setUsage(ev.Usage)
		return !c.wantUsage && len(ev.Choices) == 0 && ev.Type == ""
	}
	return false
}
