package aiclient

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
)

// The APIs of Options.API.
const (
	// APIOpenAI is OpenAI's chat completions: POST BaseURL+"/chat/completions",
	// the key as Authorization: Bearer.
	APIOpenAI = "openai"
	// APIAnthropic is Anthropic's Messages API: POST BaseURL+"/messages"
	// (BaseURL such as "https://api.anthropic.com/v1"), the key as
	// x-api-key, anthropic-version AnthropicVersion unless Options.Header
	// sets one.
	APIAnthropic = "anthropic"
	// AnthropicVersion is the anthropic-version header sent by default.
	AnthropicVersion = "2023-06-01"
)

// marshalAnthropic writes req as a Messages request body: the system
// messages joined into "system", the others as "messages", max_tokens as
// req.MaxTokens or, since Anthropic requires it, defaultMax. Params pass
// through as for OpenAI.
func marshalAnthropic(req *ChatRequest, defaultMax int64) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"model":`)
	appendString(&b, req.Model)
	maxTokens := req.MaxTokens
	if maxTokens <= 0 {
		maxTokens = max(defaultMax, 1)
	}
	fmt.Fprintf(&b, `,"max_tokens":%d`, maxTokens)
	var system []string
	b.WriteString(`,"messages":[`)
	n := 0
	for i := range req.Messages {
		m := &req.Messages[i]
		if m.Role == "system" && len(m.Parts) == 0 {
			system = append(system, m.Content)
			continue
		}
		if n > 0 {
			b.WriteByte(',')
		}
		n++
		b.WriteString(`{"role":`)
		appendString(&b, m.Role)
		b.WriteString(`,"content":`)
		if len(m.Parts) > 0 {
			if !json.Valid(m.Parts) {
				return nil, fmt.Errorf("aiclient: message parts are not valid JSON")
			}
			b.Write(m.Parts)
		} else {
			appendString(&b, m.Content)
		}
		b.WriteByte('}')
	}
	b.WriteByte(']')
	if len(system) > 0 {
		b.WriteString(`,"system":`)
		appendString(&b, strings.Join(system, "\n\n"))
	}
	keys := make([]string, 0, len(req.Params))
	for k := range req.Params {
		switch k {
		case "model", "messages", "max_tokens", "stream", "system":
			continue
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := bytes.TrimSpace(req.Params[k])
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

// decodeAnthropic reads a Messages response as a ChatResponse: one choice
// whose content is the text blocks joined, tool calls the tool_use blocks,
// finish reason the stop_reason, usage input_tokens and output_tokens,
// with the cache tokens apart.
func decodeAnthropic(data []byte) (*ChatResponse, error) {
	type block struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	var w struct {
		ID         string            `json:"id"`
		Type       string            `json:"type"`
		Model      string            `json:"model"`
		Role       string            `json:"role"`
		Content    []json.RawMessage `json:"content"` // nil when absent, empty for []
		StopReason string            `json:"stop_reason"`
		Usage      struct {
			InputTokens              int64 `json:"input_tokens"`
			OutputTokens             int64 `json:"output_tokens"`
			CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
			CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(data, &w); err != nil {
		return nil, err
	}
	if w.Type == "error" {
		// An error with status 200, as some proxies answer.
		return nil, apiErrorFrom(http.StatusOK, data, 0)
	}
	if w.Content == nil && w.Type != "message" {
		// Not a message, not even an empty one (content []).
		return nil, errors.New("no content in the response")
	}
	var text strings.Builder
	var toolUse [][]byte
	for _, raw := range w.Content {
		var c block
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, err
		}
		switch c.Type {
		case "text":
			text.WriteString(c.Text)
		case "tool_use":
			toolUse = append(toolUse, raw)
		}
	}
	role := w.Role
	if role == "" {
		role = "assistant"
	}
	u := w.Usage
	return &ChatResponse{
		ID: w.ID, Model: w.Model,
		Choices: []Choice{{Message: Message{Role: role, Content: text.String(), ToolCalls: joinArray(toolUse)}, FinishReason: w.StopReason}},
		Usage: Usage{
			PromptTokens: u.InputTokens, CompletionTokens: u.OutputTokens,
			CacheCreationInputTokens: u.CacheCreationInputTokens, CacheReadInputTokens: u.CacheReadInputTokens,
		},
	}, nil
}

// joinArray returns the JSON array of items, or nil when there are none.
func joinArray(items [][]byte) json.RawMessage {
	if len(items) == 0 {
		return nil
	}
	return json.RawMessage("[" + string(bytes.Join(items, []byte(","))) + "]")
}

// setAnthropicHeaders sets the key and version of a Messages request.
func (c *Client) setAnthropicHeaders(h http.Header) {
	if c.opts.APIKey != "" {
		h.Set("X-Api-Key", c.opts.APIKey)
	}
	if h.Get("Anthropic-Version") == "" {
		h.Set("Anthropic-Version", AnthropicVersion)
	}
}
