package gateway

import (
	"encoding/json"
	"reflect"
	"testing"
)

// TestDecodeUsageShapes: the usage objects the providers document are
// read by decodeUsage itself, not left to encoding/json, and as
// encoding/json reads them. The shapes: OpenAI's chat completion object
// (platform.openai.com/docs/api-reference/chat/object, usage with
// prompt_tokens_details and completion_tokens_details), its Responses
// object (docs/api-reference/responses/object, input_tokens_details,
// output_tokens_details) and Anthropic's Messages response
// (docs.anthropic.com/en/api/messages, cache fields, cache_creation,
// server_tool_use, service_tier).
func TestDecodeUsageShapes(t *testing.T) {
	for _, s := range []string{
		`{"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29, "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}`,
		`{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":123}`,
		`{"input_tokens":2095,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"output_tokens":503,"server_tool_use":{"web_search_requests":0},"service_tier":"standard"}`,
		`{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14}`,
	} {
		var got, want usageJSON
		if !decodeUsage([]byte(s), &got) {
			t.Errorf("decodeUsage left %s to encoding/json", s)
			continue
		}
		if err := json.Unmarshal([]byte(s), &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("decodeUsage(%s) = %+v, encoding/json read %+v", s, got, want)
		}
	}
}

// TestCaptureBuffers: a response copy has room for its body whatever its
// size, from a pooled size class up to 64 KiB and allocated past it, and
// a buffer of no class is not pooled.
func TestCaptureBuffers(t *testing.T) {
	for _, n := range []int{1, 1023, 1024, 1025, 64 << 10, 64<<10 + 1, 1 << 20} {
		b := getCapture(n)
		if len(b) != 0 || cap(b) < n {
			t.Fatalf("getCapture(%d): len %d cap %d", n, len(b), cap(b))
		}
		if n <= 64<<10 && cap(b)&(cap(b)-1) != 0 {
			t.Fatalf("getCapture(%d): cap %d is no size class", n, cap(b))
		}
		putCapture(append(b, 'x'))
	}
	putCapture(make([]byte, 0, 1000)) // no class: dropped
	if b := getCapture(1000); cap(b) != 1024 {
		t.Fatalf("getCapture(1000) has cap %d, want the 1 KiB class", cap(b))
	}
}

// BenchmarkDecodeUsage: decodeUsage on the usage objects of
// TestDecodeUsageShapes (OpenAI's chat completion and Responses objects,
// Anthropic's Messages response).
func BenchmarkDecodeUsage(b *testing.B) {
	for _, s := range []struct{ name, body string }{
		{"chat", `{"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29, "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}`},
		{"responses", `{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":123}`},
		{"anthropic", `{"input_tokens":2095,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"output_tokens":503,"server_tool_use":{"web_search_requests":0},"service_tier":"standard"}`},
	} {
		body := []byte(s.body)
		b.Run(s.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				var u usageJSON
				if !decodeUsage(body, &u) {
					b.Fatal("declined")
				}
			}
		})
	}
}
