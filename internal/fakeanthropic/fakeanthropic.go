// Package fakeanthropic is an Anthropic Messages API upstream for tests: a
// real HTTP server on a loopback port that speaks the wire format of
// POST /v1/messages (JSON, and SSE with message_start, content_block_start,
// ping, content_block_delta, content_block_stop, message_delta and
// message_stop) and POST /v1/messages/count_tokens, and records everything
// it receives. It mirrors package fakeopenai.
//
//	up := fakeanthropic.New(t, fakeanthropic.Options{APIKey: "sk-ant-upstream"})
//	// ... client base URL = up.URL()
//	got := up.Requests() // method, path, headers, body, time of each
//
// Answers are deterministic. A message produces OutputTokens tokens
// (default 8), capped by the request's max_tokens; each is the text "tok "
// and, when streamed, its own content_block_delta event. input_tokens is
// InputTokens when set, otherwise CountInputTokens of the request body;
// cache_creation_input_tokens and cache_read_input_tokens are the options'.
//
// Requests need the x-api-key header (when Options.APIKey is set) and the
// anthropic-version header, as the real API does; errors have Anthropic's
// shape {"type":"error","error":{"type":...,"message":...}}.
//
// Faults are scripted per request with Enqueue, as in fakeopenai: a status
// (429 rate_limit_error, 529 overloaded_error, other api_error) with or
// without retry-after, a delay, a stream cut after N tokens, a hold after N
// tokens, or an error event mid-stream.
package fakeanthropic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Options configure a Server. The zero value is a working upstream that
// accepts any key.
type Options struct {
	// APIKey, when set, is the only x-api-key accepted; other requests get
	// 401 authentication_error.
	APIKey string
	// OutputTokens is how many tokens a message produces before max_tokens
	// caps it. Zero means 8.
	OutputTokens int
	// InputTokens, when positive, is the input_tokens reported for every
	// request; otherwise CountInputTokens decides.
	InputTokens int
	// CacheCreationInputTokens and CacheReadInputTokens are reported in
	// every usage object.
	CacheCreationInputTokens, CacheReadInputTokens int
	// StrictCount makes count_tokens refuse, with 400, a body member it
	// does not count (such as max_tokens or stream), as
	// https://docs.anthropic.com/en/api/messages-count-tokens lists them.
	StrictCount bool
	// Default is the behaviour of requests with no queued fault.
	Default Fault
	// MaxBodyBytes bounds a request body; zero means 4 MiB.
	MaxBodyBytes int64
	// MaxRecorded bounds how many requests are kept for Requests. Zero
	// means 10000.
	MaxRecorded int
}

// Fault scripts how one request is answered. The zero Fault answers
// normally.
type Fault struct {
	// Status, when not 0 or 200, is answered with an Anthropic error body:
	// 429 rate_limit_error, 529 overloaded_error, 400 invalid_request_error,
	// others api_error.
	Status int
	// RetryAfter sets the retry-after header of an error answer.
	RetryAfter string
	// Header is added to the answer, error or not.
	Header http.Header
	// Delay is waited before the answer's headers; it ends early if the
	// client goes away.
	Delay time.Duration
	// CutAfter, when positive, aborts a streamed answer after that many
	// token events, without message_delta or message_stop.
	CutAfter int
	// ErrorAfter, when positive, ends a streamed answer after that many
	// token events with an `event: error` overloaded_error, as the real
	// API does when it is overloaded mid-stream.
	ErrorAfter int
	// HoldAfter, when positive together with Hold, stops a streamed answer
	// after that many token events until Hold is closed or the client goes
	// away; Held, when not nil, is closed when the hold starts.
	HoldAfter int
	Hold      <-chan struct{}
	Held      chan<- struct{}
}

// Request is one request the Server received.
type Request struct {
	// Method and Path are the request's, such as "POST" and "/v1/messages".
	Method, Path string
	// Header is a copy of all request headers.
	Header http.Header
	// Body is the request body as received.
	Body []byte
	// Time is when the request arrived.
	Time time.Time
}

// Server is a running fake upstream. It is safe for concurrent use.
type Server struct {
	opts Options
	srv  *httptest.Server

	mu       sync.Mutex
	faults   []Fault
	received []Request
	count    int
	produced int
}

// New starts a Server on a loopback port. When t is not nil the server is
// closed at the end of the test.
func New(t testing.TB, opts Options) *Server {
	if opts.OutputTokens <= 0 {
		opts.OutputTokens = 8
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 4 << 20
	}
	if opts.MaxRecorded <= 0 {
		opts.MaxRecorded = 10000
	}
	s := &Server{opts: opts}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	if t != nil {
		t.Cleanup(s.Close)
	}
	return s
}

// URL is the server's root, such as "http://127.0.0.1:43567": the base URL
// the Anthropic SDKs take (they add /v1/messages).
func (s *Server) URL() string { return s.srv.URL }

// Close shuts the server down, also ending streams in progress.
func (s *Server) Close() {
	s.srv.CloseClientConnections()
	s.srv.Close()
}

// Enqueue queues faults for the next requests, one each, in order.
func (s *Server) Enqueue(faults ...Fault) {
	s.mu.Lock()
	s.faults = append(s.faults, faults...)
	s.mu.Unlock()
}

// Requests returns a copy of the requests received so far, oldest first.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.received...)
}

// Count is how many requests the server has received.
func (s *Server) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count
}

// StreamedTokens is how many token events all streamed answers have
// written so far.
func (s *Server) StreamedTokens() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.produced
}

// ErrorType is the Anthropic error type of an HTTP status.
func ErrorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
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

// errorBody writes an Anthropic-shaped error.
func errorBody(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "error", "error": map[string]any{
		"type": ErrorType(status), "message": msg,
	}})
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err != nil {
		errorBody(w, http.StatusRequestEntityTooLarge, "fakeanthropic: body too large")
		return
	}
	s.mu.Lock()
	s.count++
	s.received = append(s.received, Request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body, Time: time.Now()})
	if n := len(s.received) - s.opts.MaxRecorded; n > 0 {
		s.received = append([]Request(nil), s.received[n:]...)
	}
	f := s.opts.Default
	if len(s.faults) > 0 {
		f = s.faults[0]
		s.faults = s.faults[1:]
	}
	s.mu.Unlock()

	w.Header().Set("request-id", "req_fake")
	if s.opts.APIKey != "" && r.Header.Get("X-Api-Key") != s.opts.APIKey {
		errorBody(w, http.StatusUnauthorized, "fakeanthropic: invalid x-api-key")
		return
	}
	if r.Header.Get("Anthropic-Version") == "" {
		errorBody(w, http.StatusBadRequest, "fakeanthropic: anthropic-version: header is required")
		return
	}
	if f.Delay > 0 {
		t := time.NewTimer(f.Delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	for k, vs := range f.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	if f.Status != 0 && f.Status != http.StatusOK {
		if f.RetryAfter != "" {
			w.Header().Set("Retry-After", f.RetryAfter)
		}
		errorBody(w, f.Status, "fakeanthropic: scripted "+strconv.Itoa(f.Status))
		return
	}
	if r.Method != http.MethodPost {
		errorBody(w, http.StatusNotFound, "fakeanthropic: unknown url "+r.URL.Path)
		return
	}
	var req request
	if err := json.Unmarshal(body, &req); err != nil {
		errorBody(w, http.StatusBadRequest, "fakeanthropic: bad json: "+err.Error())
		return
	}
	if req.Model == "" {
		errorBody(w, http.StatusBadRequest, "fakeanthropic: model: Field required")
		return
	}
	input := s.opts.InputTokens
	if input <= 0 {
		input = CountInputTokens(body)
	}
	switch r.URL.Path {
	case "/v1/messages/count_tokens":
		if s.opts.StrictCount {
			var members map[string]json.RawMessage
			_ = json.Unmarshal(body, &members)
			for k := range members {
				if !countMembers[k] {
					errorBody(w, http.StatusBadRequest, "fakeanthropic: "+k+": Extra inputs are not permitted")
					return
				}
			}
		}
		writeJSON(w, map[string]any{"input_tokens": input})
	case "/v1/messages":
		if req.MaxTokens < 1 {
			errorBody(w, http.StatusBadRequest, "fakeanthropic: max_tokens: Field required")
			return
		}
		output := min(s.opts.OutputTokens, req.MaxTokens)
		if req.Stream {
			s.stream(w, r, f, req, input, output)
			return
		}
		writeJSON(w, s.message(req.Model, text(output), "end_turn", s.usage(input, output)))
	default:
		errorBody(w, http.StatusNotFound, "fakeanthropic: unknown url "+r.URL.Path)
	}
}

// countMembers are the members count_tokens takes.
var countMembers = map[string]bool{"model": true, "messages": true, "system": true, "tools": true, "tool_choice": true, "thinking": true, "mcp_servers": true}

type request struct {
	Model     string `json:"model"`
	Stream    bool   `json:"stream"`
	MaxTokens int    `json:"max_tokens"`
}

// CountInputTokens is the fake's input token count for a request body: the
// number of whitespace-separated words of every text in "system" and
// "messages", plus 3 per message.
func CountInputTokens(body []byte) int {
	var req struct {
		System   any              `json:"system"`
		Messages []map[string]any `json:"messages"`
	}
	if json.Unmarshal(body, &req) != nil {
		return 0
	}
	n := words(req.System)
	for _, m := range req.Messages {
		n += 3 + words(m["content"])
	}
	return n
}

func words(v any) int {
	switch v := v.(type) {
	case string:
		return len(strings.Fields(v))
	case []any:
		n := 0
		for _, e := range v {
			n += words(e)
		}
		return n
	case map[string]any:
		return words(v["text"]) + words(v["content"])
	}
	return 0
}

func writeJSON(w http.ResponseWriter, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}

func text(n int) string { return strings.Repeat("tok ", n) }

func (s *Server) usage(input, output int) map[string]any {
	return map[string]any{
		"input_tokens": input, "output_tokens": output,
		"cache_creation_input_tokens": s.opts.CacheCreationInputTokens,
		"cache_read_input_tokens":     s.opts.CacheReadInputTokens,
	}
}

func (s *Server) message(model, content string, stop any, usage map[string]any) map[string]any {
	blocks := []any{}
	if content != "" {
		blocks = append(blocks, map[string]any{"type": "text", "text": content})
	}
	return map[string]any{
		"id": "msg_fake", "type": "message", "role": "assistant", "model": model,
		"content": blocks, "stop_reason": stop, "stop_sequence": nil, "usage": usage,
	}
}

// sse writes SSE events and flushes each one.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (e *sse) event(name string, v any) error {
	j, _ := json.Marshal(v)
	var b bytes.Buffer
	fmt.Fprintf(&b, "event: %s\ndata: %s\n\n", name, j)
	if _, err := e.w.Write(b.Bytes()); err != nil {
		return err
	}
	return e.rc.Flush()
}

func (s *Server) stream(w http.ResponseWriter, r *http.Request, f Fault, req request, input, output int) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	e := &sse{w: w, rc: http.NewResponseController(w)}
	start := s.usage(input, 1)
	if e.event("message_start", map[string]any{"type": "message_start", "message": s.message(req.Model, "", nil, start)}) != nil {
		return
	}
	if e.event("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
		"content_block": map[string]any{"type": "text", "text": ""}}) != nil {
		return
	}
	if e.event("ping", map[string]any{"type": "ping"}) != nil {
		return
	}
	for i := range output {
		if f.CutAfter > 0 && i == f.CutAfter {
			panic(http.ErrAbortHandler)
		}
		if f.ErrorAfter > 0 && i == f.ErrorAfter {
			_ = e.event("error", map[string]any{"type": "error", "error": map[string]any{"type": "overloaded_error", "message": "Overloaded"}})
			return
		}
		if f.HoldAfter > 0 && f.Hold != nil && i == f.HoldAfter {
			if f.Held != nil {
				close(f.Held)
			}
			select {
			case <-f.Hold:
			case <-r.Context().Done():
				return
			}
		}
		if e.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]any{"type": "text_delta", "text": "tok "}}) != nil {
			return
		}
		s.mu.Lock()
		s.produced++
		s.mu.Unlock()
	}
	if f.CutAfter > 0 && f.CutAfter >= output {
		panic(http.ErrAbortHandler)
	}
	if e.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0}) != nil {
		return
	}
	if e.event("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": "end_turn", "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": output}}) != nil {
		return
	}
	_ = e.event("message_stop", map[string]any{"type": "message_stop"})
}
