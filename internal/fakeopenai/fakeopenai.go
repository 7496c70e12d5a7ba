// Package fakeopenai is an OpenAI-compatible upstream for tests: a real HTTP
// server on a loopback port that speaks the wire format of
// /v1/chat/completions (JSON, and SSE with a final usage chunk when
// stream_options.include_usage is set), /v1/completions, /v1/embeddings,
// /v1/responses and /v1/models, and records everything it receives.
//
// Start one with New, point a client at BaseURL, and close it when done:
//
//	up := fakeopenai.New(t, fakeopenai.Options{APIKey: "sk-upstream"})
//	// ... client.BaseURL = up.BaseURL()
//	got := up.Requests() // method, path, auth header, body, time of each
//
// Answers are deterministic. A completion produces CompletionTokens tokens
// (default 8), capped by the request's max_tokens / max_completion_tokens /
// max_output_tokens; each is the text "tok " and, when streamed, its own SSE
// event. The prompt's token count is PromptTokens when set, otherwise
// CountPromptTokens of the request body. usage reports both.
//
// Faults are scripted per request with Enqueue: the next requests, in
// order, get the queued Faults (a status such as 429 or 500 with or without
// Retry-After / retry-after-ms headers, a delay before answering, a stream
// cut after N tokens, or a hold on a channel after N streamed tokens).
// Requests without a queued fault get Options.Default.
package fakeopenai

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
	// APIKey, when set, is the only bearer token accepted; other requests
	// get 401 with an OpenAI-shaped body.
	APIKey string
	// CompletionTokens is how many tokens a completion produces before
	// max_tokens caps it. Zero means 8.
	CompletionTokens int
	// PromptTokens, when positive, is the prompt_tokens reported for every
	// request; otherwise CountPromptTokens decides.
	PromptTokens int
	// CachedTokens is the part of the prompt reported as read from the
	// prompt cache (prompt_tokens_details.cached_tokens, or
	// input_tokens_details for /v1/responses), capped at the prompt.
	CachedTokens int
	// ReasoningTokens is the part of the completion reported as reasoning
	// (completion_tokens_details.reasoning_tokens, or
	// output_tokens_details), capped at the completion.
	ReasoningTokens int
	// Default is the behaviour of requests with no queued fault.
	Default Fault
	// MaxBodyBytes bounds a request body; zero means 4 MiB.
	MaxBodyBytes int64
	// MaxRecorded bounds how many requests are kept for Requests; the
	// oldest are dropped beyond it. Zero means 10000.
	MaxRecorded int
	// RPM and TPM, when positive, are the server's own rate limits, per
	// Period (default a minute), enforced as OpenAI does (limits.go): a
	// bucket of each that holds the limit and refills continuously, unless
	// Window says otherwise; a request takes 1 request and its tokens as
	// OpenAI's rate limiter estimates them when it arrives (RateTokens:
	// characters/4, 4 per message, images by size and detail, plus
	// max_tokens × n or, without max_tokens, the completion), never its
	// tokenizer count; one that does not fit gets 429 with OpenAI's error
	// body (type "requests" or "tokens", code "rate_limit_exceeded", the
	// limit, used and requested counts in the message), Retry-After,
	// retry-after-ms and x-ratelimit-* headers, which every answer
	// carries.
	RPM, TPM int
	// CountBody has the limits count every character of the body, as
	// Azure OpenAI says its estimate is "based in part on the character
	// count of the API request" (ratecount.go).
	CountBody bool
	Period    time.Duration
	// Window is how RPM and TPM are counted; the zero value is Bucket.
	Window Window
	// Now is the limits' clock; nil means time.Now.
	Now func() time.Time
}

// Fault scripts how one request is answered. The zero Fault answers
// normally.
type Fault struct {
	// Status, when not 0 or 200, is answered with an OpenAI-shaped error
	// body: 429 gets type "requests" and code "rate_limit_exceeded", other
	// statuses type "server_error".
	Status int
	// RetryAfter and RetryAfterMS set the Retry-After and retry-after-ms
	// headers of an error answer when not empty.
	RetryAfter, RetryAfterMS string
	// Header is added to the answer, error or not.
	Header http.Header
	// Delay is waited before the answer's headers (a slow upstream). The
	// wait ends early if the client goes away.
	Delay time.Duration
	// CutAfter, when positive, aborts a streamed answer after that many
	// token events, without finish_reason, usage or [DONE].
	CutAfter int
	// HoldAfter, when positive together with Hold, stops a streamed answer
	// after that many token events until Hold is closed or the client goes
	// away; Held, when not nil, is closed when the hold starts.
	HoldAfter int
	Hold      <-chan struct{}
	Held      chan<- struct{}
}

// Request is one request the Server received.
type Request struct {
	// Method and Path are the request's, such as "POST" and
	// "/v1/chat/completions".
	Method, Path string
	// Authorization is the raw Authorization header.
	Authorization string
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
	// produced counts the token events of every streamed answer written.
	produced int
	lim      limiter
}

// New starts a Server on a loopback port. When t is not nil the server is
// closed at the end of the test.
func New(t testing.TB, opts Options) *Server {
	if opts.CompletionTokens <= 0 {
		opts.CompletionTokens = 8
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 4 << 20
	}
	if opts.MaxRecorded <= 0 {
		opts.MaxRecorded = 10000
	}
	s := &Server{opts: opts}
	s.lim.init(opts)
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	if t != nil {
		t.Cleanup(s.Close)
	}
	return s
}

// URL is the server's root, such as "http://127.0.0.1:43567".
func (s *Server) URL() string { return s.srv.URL }

// BaseURL is the OpenAI base URL clients take, the root plus "/v1/".
func (s *Server) BaseURL() string { return s.srv.URL + "/v1/" }

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

// errorBody writes an OpenAI-shaped error.
func errorBody(w http.ResponseWriter, status int, typ, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	var codeVal any
	if code != "" {
		codeVal = code
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"message": msg, "type": typ, "param": nil, "code": codeVal,
	}})
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err != nil {
		errorBody(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "", "fakeopenai: body too large")
		return
	}
	s.mu.Lock()
	s.count++
	s.received = append(s.received, Request{
		Method: r.Method, Path: r.URL.Path, Authorization: r.Header.Get("Authorization"),
		Header: r.Header.Clone(), Body: body, Time: time.Now(),
	})
	if n := len(s.received) - s.opts.MaxRecorded; n > 0 {
		s.received = append([]Request(nil), s.received[n:]...)
	}
	f := s.opts.Default
	if len(s.faults) > 0 {
		f = s.faults[0]
		s.faults = s.faults[1:]
	}
	s.mu.Unlock()

	if s.opts.APIKey != "" && r.Header.Get("Authorization") != "Bearer "+s.opts.APIKey {
		errorBody(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "fakeopenai: incorrect API key provided")
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
		if f.RetryAfterMS != "" {
			w.Header().Set("retry-after-ms", f.RetryAfterMS)
		}
		if f.Status == http.StatusTooManyRequests {
			errorBody(w, f.Status, "requests", "rate_limit_exceeded", "fakeopenai: rate limit reached")
		} else {
			errorBody(w, f.Status, "server_error", "", "fakeopenai: the server had an error")
		}
		return
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/v1/models":
		s.models(w)
		return
	case r.Method != http.MethodPost:
		errorBody(w, http.StatusNotFound, "invalid_request_error", "unknown_url", "fakeopenai: unknown url "+r.URL.Path)
		return
	}
	var req request
	if err := json.Unmarshal(body, &req); err != nil {
		errorBody(w, http.StatusBadRequest, "invalid_request_error", "", "fakeopenai: bad json: "+err.Error())
		return
	}
	prompt := s.opts.PromptTokens
	if prompt <= 0 {
		prompt = CountPromptTokens(body)
	}
	completion, counted := s.opts.CompletionTokens, s.opts.CompletionTokens
	if m := req.maxTokens(); m > 0 {
		completion, counted = min(m, completion), m
	}
	if !s.lim.take(w, req.Model, RateTokens(body, s.opts.CountBody)+counted*max(req.N, req.BestOf, 1)) {
		return
	}
	switch r.URL.Path {
	case "/v1/chat/completions", "/v1/completions":
		chat := r.URL.Path == "/v1/chat/completions"
		if req.Stream {
			s.streamCompletion(w, r, f, chat, req, prompt, completion)
			return
		}
		writeJSON(w, s.completionBody(chat, req.Model, prompt, completion))
	case "/v1/embeddings":
		writeJSON(w, map[string]any{
			"object": "list", "model": req.Model,
			"data":  []any{map[string]any{"object": "embedding", "index": 0, "embedding": []float64{0.1, 0.2, 0.3}}},
			"usage": map[string]any{"prompt_tokens": prompt, "total_tokens": prompt},
		})
	case "/v1/responses":
		if req.Stream {
			s.streamResponse(w, r, f, req, prompt, completion)
			return
		}
		writeJSON(w, s.responseBody(req.Model, prompt, completion))
	default:
		errorBody(w, http.StatusNotFound, "invalid_request_error", "unknown_url", "fakeopenai: unknown url "+r.URL.Path)
	}
}

type request struct {
	Model               string `json:"model"`
	Stream              bool   `json:"stream"`
	MaxTokens           int    `json:"max_tokens"`
	MaxCompletionTokens int    `json:"max_completion_tokens"`
	MaxOutputTokens     int    `json:"max_output_tokens"`
	N                   int    `json:"n"`
	BestOf              int    `json:"best_of"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

func (r *request) maxTokens() int {
	for _, v := range []int{r.MaxCompletionTokens, r.MaxTokens, r.MaxOutputTokens} {
		if v > 0 {
			return v
		}
	}
	return 0
}

// CountPromptTokens is the fake's prompt token count for a request body:
// the number of whitespace-separated words in every string value of the
// request's "messages", "prompt" or "input" field, plus 3 per chat message.
func CountPromptTokens(body []byte) int {
	var req struct {
		Messages []map[string]any `json:"messages"`
		Prompt   any              `json:"prompt"`
		Input    any              `json:"input"`
	}
	if json.Unmarshal(body, &req) != nil {
		return 0
	}
	n := 0
	for _, m := range req.Messages {
		n += 3 + words(m["content"])
	}
	return n + words(req.Prompt) + words(req.Input)
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
		n := 0
		for k, e := range v {
			if k == "text" || k == "content" {
				n += words(e)
			}
		}
		return n
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

func (s *Server) usage(prompt, completion int) map[string]any {
	u := map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
	if s.opts.CachedTokens > 0 || s.opts.ReasoningTokens > 0 {
		u["prompt_tokens_details"] = map[string]any{"cached_tokens": min(s.opts.CachedTokens, prompt)}
		u["completion_tokens_details"] = map[string]any{"reasoning_tokens": min(s.opts.ReasoningTokens, completion)}
	}
	return u
}

func (s *Server) completionBody(chat bool, model string, prompt, completion int) map[string]any {
	choice := map[string]any{"index": 0, "finish_reason": "stop", "logprobs": nil}
	object := "text_completion"
	if chat {
		choice["message"] = map[string]any{"role": "assistant", "content": text(completion), "refusal": nil}
		object = "chat.completion"
	} else {
		choice["text"] = text(completion)
	}
	return map[string]any{
		"id": "cmpl-fake", "object": object, "created": 1700000000, "model": model,
		"choices": []any{choice}, "usage": s.usage(prompt, completion),
	}
}

func (s *Server) responseBody(model string, prompt, completion int) map[string]any {
	return map[string]any{
		"id": "resp_fake", "object": "response", "created_at": 1700000000, "model": model, "status": "completed",
		"output": []any{map[string]any{
			"type": "message", "id": "msg_fake", "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": text(completion), "annotations": []any{}}},
		}},
		"usage": map[string]any{"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion,
			"input_tokens_details":  map[string]any{"cached_tokens": min(s.opts.CachedTokens, prompt)},
			"output_tokens_details": map[string]any{"reasoning_tokens": min(s.opts.ReasoningTokens, completion)}},
	}
}

func (s *Server) models(w http.ResponseWriter) {
	writeJSON(w, map[string]any{"object": "list", "data": []any{
		map[string]any{"id": "gpt-4o-mini", "object": "model", "created": 1700000000, "owned_by": "fakeopenai"},
		map[string]any{"id": "gpt-4o", "object": "model", "created": 1700000000, "owned_by": "fakeopenai"},
	}})
}

// sse writes SSE events and flushes each one.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (e *sse) event(name string, v any) error {
	var b bytes.Buffer
	if name != "" {
		fmt.Fprintf(&b, "event: %s\n", name)
	}
	if s, ok := v.(string); ok {
		fmt.Fprintf(&b, "data: %s\n\n", s)
	} else {
		j, _ := json.Marshal(v)
		fmt.Fprintf(&b, "data: %s\n\n", j)
	}
	if _, err := e.w.Write(b.Bytes()); err != nil {
		return err
	}
	return e.rc.Flush()
}

func startSSE(w http.ResponseWriter) *sse {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	e := &sse{w: w, rc: http.NewResponseController(w)}
	_ = e.rc.Flush()
	return e
}

// tokenEvents writes n token events with emit, honouring CutAfter and
// HoldAfter. It reports false when the stream must end at once.
func (s *Server) tokenEvents(r *http.Request, f Fault, n int, emit func() error) bool {
	for i := range n {
		if f.CutAfter > 0 && i == f.CutAfter {
			panic(http.ErrAbortHandler) // cut the connection mid-stream
		}
		if f.HoldAfter > 0 && f.Hold != nil && i == f.HoldAfter {
			if f.Held != nil {
				close(f.Held)
			}
			select {
			case <-f.Hold:
			case <-r.Context().Done():
				return false
			}
		}
		if emit() != nil {
			return false
		}
		s.mu.Lock()
		s.produced++
		s.mu.Unlock()
	}
	if f.CutAfter > 0 && f.CutAfter >= n {
		panic(http.ErrAbortHandler)
	}
	return true
}

func (s *Server) streamCompletion(w http.ResponseWriter, r *http.Request, f Fault, chat bool, req request, prompt, completion int) {
	e := startSSE(w)
	object := "text_completion"
	if chat {
		object = "chat.completion.chunk"
	}
	chunk := func(choice map[string]any) map[string]any {
		m := map[string]any{"id": "cmpl-fake", "object": object, "created": 1700000000, "model": req.Model, "choices": []any{}}
		if choice != nil {
			m["choices"] = []any{choice}
		}
		return m
	}
	delta := func(content string, finish any) map[string]any {
		c := map[string]any{"index": 0, "finish_reason": finish}
		if chat {
			c["delta"] = map[string]any{"role": "assistant", "content": content}
		} else {
			c["text"] = content
		}
		return c
	}
	if chat && e.event("", chunk(delta("", nil))) != nil {
		return
	}
	if !s.tokenEvents(r, f, completion, func() error { return e.event("", chunk(delta("tok ", nil))) }) {
		return
	}
	if e.event("", chunk(delta("", "stop"))) != nil {
		return
	}
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		c := chunk(nil)
		c["usage"] = s.usage(prompt, completion)
		if e.event("", c) != nil {
			return
		}
	}
	_ = e.event("", "[DONE]")
}

func (s *Server) streamResponse(w http.ResponseWriter, r *http.Request, f Fault, req request, prompt, completion int) {
	e := startSSE(w)
	seq := 0
	ev := func(typ string, extra map[string]any) error {
		m := map[string]any{"type": typ, "sequence_number": seq}
		seq++
		for k, v := range extra {
			m[k] = v
		}
		return e.event(typ, m)
	}
	created := s.responseBody(req.Model, prompt, 0)
	created["status"], created["output"], created["usage"] = "in_progress", []any{}, nil
	if ev("response.created", map[string]any{"response": created}) != nil {
		return
	}
	if !s.tokenEvents(r, f, completion, func() error {
		return ev("response.output_text.delta", map[string]any{"item_id": "msg_fake", "output_index": 0, "content_index": 0, "delta": "tok "})
	}) {
		return
	}
	_ = ev("response.completed", map[string]any{"response": s.responseBody(req.Model, prompt, completion)})
}
