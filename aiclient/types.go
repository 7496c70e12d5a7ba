package aiclient

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sort"

	"github.com/sluice-io/sluice/internal/aitoken"
)

// Message is one chat message. Content is its text; Parts, when set, is
// the content in the array form (text and image parts) and is sent instead.
type Message struct {
	// Role is "system", "user", "assistant" or "tool".
	Role string
	// Content is the message text.
	Content string
	// Parts is content in array form, passed through as given.
	Parts json.RawMessage
	// Name optionally names the author.
	Name string
	// ToolCalls is, in a response, the message's tool calls as the server
	// sent them: OpenAI's tool_calls array, or Anthropic's tool_use content
	// blocks as an array. It is not sent in requests.
	ToolCalls json.RawMessage
	// Refusal is, in a response, the model's refusal (OpenAI's structured
	// outputs). It is not sent in requests.
	Refusal string
}

type wireMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Name    string          `json:"name,omitempty"`
}

// MarshalJSON writes the message in the OpenAI wire form.
func (m Message) MarshalJSON() ([]byte, error) {
	w := wireMessage{Role: m.Role, Name: m.Name, Content: m.Parts}
	if len(m.Parts) == 0 {
		c, err := json.Marshal(m.Content)
		if err != nil {
			return nil, err
		}
		w.Content = c
	}
	return json.Marshal(w)
}

// appendJSON writes the message as MarshalJSON does, without the
// re-validation that encoding/json applies to a Marshaler's output.
func (m *Message) appendJSON(b *bytes.Buffer) error {
	b.WriteString(`{"role":`)
	appendString(b, m.Role)
	b.WriteString(`,"content":`)
	if len(m.Parts) > 0 {
		if !json.Valid(m.Parts) {
			return fmt.Errorf("aiclient: message parts are not valid JSON")
		}
		b.Write(m.Parts)
	} else {
		appendString(b, m.Content)
	}
	if m.Name != "" {
		b.WriteString(`,"name":`)
		appendString(b, m.Name)
	}
	b.WriteByte('}')
	return nil
}

func appendString(b *bytes.Buffer, s string) {
	enc, _ := json.Marshal(s) // a string always encodes
	b.Write(enc)
}

// UnmarshalJSON reads a message whose content is a string, null, or an
// array of parts.
func (m *Message) UnmarshalJSON(b []byte) error {
	var w wireMessage
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*m = Message{Role: w.Role, Name: w.Name}
	c := bytes.TrimSpace(w.Content)
	switch {
	case len(c) == 0 || bytes.Equal(c, []byte("null")):
	case c[0] == '"':
		return json.Unmarshal(c, &m.Content)
	case c[0] == '[':
		m.Parts = append(json.RawMessage(nil), c...)
	default:
		return fmt.Errorf("aiclient: message content must be a string or an array, not %.20s", c)
	}
	return nil
}

// ChatRequest is a chat completion request.
type ChatRequest struct {
	// Model names the model, such as "deepseek-v3.2".
	Model string
	// Messages is the conversation.
	Messages []Message
	// MaxTokens bounds the completion; 0 leaves it to the server.
	MaxTokens int64
	// Params holds further body fields, such as "temperature", passed
	// through as given. Params cannot override model, messages, max_tokens
	// or stream.
	Params map[string]json.RawMessage
}

// MarshalJSON writes the request body. It never asks for streaming.
func (r *ChatRequest) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"model":`)
	appendString(&b, r.Model)
	b.WriteString(`,"messages":[`)
	for i, m := range r.Messages {
		if i > 0 {
			b.WriteByte(',')
		}
		if err := m.appendJSON(&b); err != nil {
			return nil, err
		}
	}
	b.WriteByte(']')
	if r.MaxTokens > 0 {
		fmt.Fprintf(&b, `,"max_tokens":%d`, r.MaxTokens)
	}
	keys := make([]string, 0, len(r.Params))
	for k := range r.Params {
		switch k {
		case "model", "messages", "max_tokens", "stream":
			continue
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := bytes.TrimSpace(r.Params[k])
		if len(v) == 0 || !json.Valid(v) {
			return nil, fmt.Errorf("aiclient: parameter %q is not valid JSON", k)
		}
		b.WriteByte(',')
		appendString(&b, k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// ChatResponse is a chat completion response.
type ChatResponse struct {
	// ID is the server's completion id.
	ID string `json:"id"`
	// Model is the model that answered.
	Model string `json:"model"`
	// Choices are the completions; usually one.
	Choices []Choice `json:"choices"`
	// Usage is the tokens the request consumed.
	Usage Usage `json:"usage"`
}

// Text returns the first choice's message text, or "" when there is none.
func (r *ChatResponse) Text() string {
	if r == nil || len(r.Choices) == 0 {
		return ""
	}
	return r.Choices[0].Message.Content
}

// decodeResponse reads a response body in one pass: through wire structs,
// not Message.UnmarshalJSON, which would scan each message twice.
func decodeResponse(data []byte) (*ChatResponse, error) {
	var w struct {
		ID      string `json:"id"`
		Model   string `json:"model"`
		Choices []struct {
			Index        int    `json:"index"`
			FinishReason string `json:"finish_reason"`
			Message      struct {
				Role      string          `json:"role"`
				Content   json.RawMessage `json:"content"`
				Name      string          `json:"name"`
				ToolCalls json.RawMessage `json:"tool_calls"`
				Refusal   string          `json:"refusal"`
			} `json:"message"`
		} `json:"choices"`
		Usage Usage           `json:"usage"`
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(data, &w); err != nil {
		return nil, err
	}
	if len(w.Choices) == 0 && len(w.Error) > 0 && string(w.Error) != "null" {
		// Some OpenAI-compatible proxies answer errors with status 200.
		return nil, apiErrorFrom(http.StatusOK, data, 0)
	}
	if len(w.Choices) == 0 {
		// Not an answer, not even an empty one: taken as such, the prompt
		// would count as done with nothing to show for it.
		return nil, errors.New("no choices in the response")
	}
	out := &ChatResponse{ID: w.ID, Model: w.Model, Usage: w.Usage, Choices: make([]Choice, len(w.Choices))}
	for i, c := range w.Choices {
		m := Message{Role: c.Message.Role, Name: c.Message.Name, Refusal: c.Message.Refusal}
		if tc := bytes.TrimSpace(c.Message.ToolCalls); len(tc) > 0 && tc[0] == '[' {
			m.ToolCalls = tc
		}
		switch content := bytes.TrimSpace(c.Message.Content); {
		case len(content) == 0 || content[0] == 'n':
		case content[0] == '"':
			if err := json.Unmarshal(content, &m.Content); err != nil {
				return nil, err
			}
		default:
			m.Parts = content
		}
		out.Choices[i] = Choice{Index: c.Index, Message: m, FinishReason: c.FinishReason}
	}
	return out, nil
}

// Choice is one completion.
type Choice struct {
	// Index is the choice's position.
	Index int `json:"index"`
	// Message is the completion.
	Message Message `json:"message"`
	// FinishReason says why generation stopped, such as "stop" or "length".
	FinishReason string `json:"finish_reason"`
}

// Usage counts the tokens of a request.
type Usage struct {
	// PromptTokens were read.
	PromptTokens int64 `json:"prompt_tokens"`
	// CompletionTokens were generated.
	CompletionTokens int64 `json:"completion_tokens"`
	// TotalTokens is their sum.
	TotalTokens int64 `json:"total_tokens"`
	// CacheCreationInputTokens and CacheReadInputTokens are an Anthropic
	// response's cached input, not included in PromptTokens (Anthropic's
	// input_tokens).
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens,omitempty"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens,omitempty"`
}

// Total is TotalTokens, or the sum of the parts when a server leaves it
// out, with Anthropic's cached input weighted as it is billed (and as the
// sluice gateway charges it): a cache write 1.25 input tokens, a cache read
// 0.1, rounded up. The sums saturate at MaxInt64: the numbers are the
// server's.
func (u Usage) Total() int64 {
	cw, cr := max(u.CacheCreationInputTokens, 0), max(u.CacheReadInputTokens, 0)
	cached := addSat(addSat(cw, cw/4+min(cw%4, 1)), cr/10+min(cr%10, 1))
	if u.TotalTokens > 0 {
		return addSat(u.TotalTokens, cached)
	}
	return addSat(addSat(max(u.PromptTokens, 0), max(u.CompletionTokens, 0)), cached)
}

// addSat is a + b for non-negative a and b, at most MaxInt64.
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// EstimateTokens is a request's token cost before it is sent: its prompt
// tokens counted as the gateway counts them (internal/aitoken: exactly with
// the model's vocabulary for OpenAI models, messages, names and
// Params["tools"] or Params["functions"] included; with the heuristic for
// other models), plus MaxTokens (what servers such as OpenAI's reserve
// against a tokens-per-minute limit), or defaultCompletion when MaxTokens
// is unset.
func EstimateTokens(r *ChatRequest, defaultCompletion int64) int64 {
	var n int64
	if c := aitoken.ForModel(r.Model); c.Exact() {
		n = c.PromptTokens(r.tokenRequest())
	} else {
		n = aitoken.ReplyOverhead
		for _, m := range r.Messages {
			n += aitoken.MessageOverhead + aitoken.Count(m.Role) + aitoken.Count(m.Content) + aitoken.Count(m.Name) + aitoken.Count(string(m.Parts))
		}
	}
	c := max(defaultCompletion, 0)
	if r.MaxTokens > 0 {
		c = r.MaxTokens
	}
	if n > math.MaxInt64-c { // saturate: negative, it would skip the token limiter
		return math.MaxInt64
	}
	return n + c
}

// tokenRequest is the part of r that takes prompt tokens, in wire form.
func (r *ChatRequest) tokenRequest() *aitoken.Request {
	req := &aitoken.Request{Tools: r.Params["tools"], Functions: r.Params["functions"], Messages: make([]json.RawMessage, 0, len(r.Messages))}
	for i := range r.Messages {
		var b bytes.Buffer
		if r.Messages[i].appendJSON(&b) == nil {
			req.Messages = append(req.Messages, b.Bytes())
		}
	}
	return req
}
