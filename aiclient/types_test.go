package aiclient

import (
	"encoding/json"
	"math"
	"reflect"
	"testing"
)

func TestChatRequestJSON(t *testing.T) {
	req := &ChatRequest{
		Model: "m\"1",
		Messages: []Message{
			{Role: "system", Content: "be <brief>\n"},
			{Role: "user", Parts: json.RawMessage(`[{"type":"text","text":"hi"}]`), Name: "ann"},
		},
		MaxTokens: 7,
		Params:    map[string]json.RawMessage{"temperature": json.RawMessage("0.5"), "model": json.RawMessage(`"override"`), "stream": json.RawMessage("true")},
	}
	b, err := req.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("invalid JSON %s: %v", b, err)
	}
	want := map[string]any{
		"model": "m\"1", "max_tokens": 7.0, "temperature": 0.5,
		"messages": []any{
			map[string]any{"role": "system", "content": "be <brief>\n"},
			map[string]any{"role": "user", "name": "ann", "content": []any{map[string]any{"type": "text", "text": "hi"}}},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	// Messages round-trip through UnmarshalJSON.
	var back []Message
	if err := json.Unmarshal(mustJSON(t, got["messages"]), &back); err != nil || back[0].Content != "be <brief>\n" || string(back[1].Parts) != `[{"text":"hi","type":"text"}]` {
		t.Fatalf("round trip %+v, %v", back, err)
	}
	req.Params["bad"] = json.RawMessage("{")
	if _, err := req.MarshalJSON(); err == nil {
		t.Fatal("invalid parameter accepted")
	}
	if _, err := (&ChatRequest{Model: "m", Messages: []Message{{Role: "user", Parts: json.RawMessage("[")}}}).MarshalJSON(); err == nil {
		t.Fatal("invalid parts accepted")
	}
	if err := json.Unmarshal([]byte(`{"role":"user","content":5}`), new(Message)); err == nil {
		t.Fatal("numeric content accepted")
	}
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeResponse(t *testing.T) {
	r, err := decodeResponse([]byte(`{"id":"x","model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"hé\n"}},{"index":1,"message":{"role":"assistant","content":null}},{"index":2,"message":{"content":[{"type":"text"}]}}],"usage":{"prompt_tokens":3,"completion_tokens":4}}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Text() != "hé\n" || r.Choices[0].FinishReason != "stop" || r.Choices[1].Message.Content != "" || len(r.Choices[2].Message.Parts) == 0 || r.Usage.Total() != 7 {
		t.Fatalf("%+v", r)
	}
	if _, err := decodeResponse([]byte(`{"choices":[{"message":{"content":"x`)); err == nil {
		t.Fatal("truncated body accepted")
	}
	// reply 3 + message 3 + "user" 1 + "12345678" 3 (digits go by 3), plus the default completion
	if got := EstimateTokens(&ChatRequest{Messages: []Message{{Role: "user", Content: "12345678"}}}, 100); got != 3+3+1+3+100 {
		t.Fatalf("estimate %d", got)
	}
	// CJK text: a token per character, not per four bytes
	if got := EstimateTokens(&ChatRequest{Messages: []Message{{Role: "user", Content: "你好世界"}}, MaxTokens: 1}, 0); got != 3+3+1+4+1 {
		t.Fatalf("CJK estimate %d", got)
	}
}

// TestEstimateTokensExact checks that an OpenAI model's estimate is the
// exact count the gateway makes: the OpenAI cookbook's weather example
// ("How to count tokens with tiktoken", section 7) took 101 prompt tokens
// on gpt-4o and 105 on gpt-4 by the API's own usage.
func TestEstimateTokensExact(t *testing.T) {
	tools := json.RawMessage(`[{"type":"function","function":{"name":"get_current_weather","description":"Get the current weather in a given location",
	  "parameters":{"type":"object","properties":{"location":{"type":"string","description":"The city and state, e.g. San Francisco, CA"},
	  "unit":{"type":"string","description":"The unit of temperature to return","enum":["celsius","fahrenheit"]}},"required":["location"]}}}]`)
	msgs := []Message{
		{Role: "system", Content: "You are a helpful assistant that can answer to questions about the weather."},
		{Role: "user", Content: "What's the weather like in San Francisco?"},
	}
	for model, want := range map[string]int64{"gpt-4o": 101, "gpt-4o-mini": 101, "gpt-4": 105} {
		r := &ChatRequest{Model: model, Messages: msgs, MaxTokens: 50, Params: map[string]json.RawMessage{"tools": tools}}
		if got := EstimateTokens(r, 0); got != want+50 {
			t.Errorf("%s: estimate %d, want %d prompt + 50", model, got, want)
		}
	}
}

// TestUsageTotalSaturates: usage numbers are the server's, and a sum of
// them that passes an int64 is MaxInt64, not a negative total that left
// the tokens used unsettled (Chat settles only a positive total).
func TestUsageTotalSaturates(t *testing.T) {
	for _, u := range []Usage{
		{TotalTokens: math.MaxInt64, CacheReadInputTokens: 100},
		{TotalTokens: math.MaxInt64 - 1, CacheCreationInputTokens: 8},
		{PromptTokens: math.MaxInt64, CompletionTokens: math.MaxInt64},
		{CompletionTokens: 1, CacheCreationInputTokens: math.MaxInt64},
		{CacheReadInputTokens: math.MaxInt64, CacheCreationInputTokens: math.MaxInt64},
	} {
		if got := u.Total(); got != math.MaxInt64 {
			t.Errorf("%+v: Total %d, want %d", u, got, int64(math.MaxInt64))
		}
	}
	if got := (Usage{PromptTokens: 3, CompletionTokens: 4, CacheReadInputTokens: 10, CacheCreationInputTokens: 4}).Total(); got != 3+4+1+5 {
		t.Errorf("small usage: Total %d, want %d", got, 3+4+1+5)
	}
}
