package gateway

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// FuzzSSERelay: a stream whose client asked for usage is relayed byte for
// byte, whatever it holds, and parsing never panics.
func FuzzSSERelay(f *testing.F) {
	f.Add("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n")
	f.Add("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\n")
	f.Add("data: {broken\n\n: comment\r\n")
	f.Fuzz(func(t *testing.T, in string) {
		for _, want := range []bool{true, false} {
			c := &call{wantUsage: want}
			out, _ := io.ReadAll(newSSEReader(io.NopCloser(iotest.OneByteReader(strings.NewReader(in))), c))
			if want && string(out) != in {
				t.Fatalf("relayed %q, want %q", out, in)
			}
			if !want && len(out) > len(in) {
				t.Fatalf("relayed more than it read: %q", out)
			}
		}
	})
}

func TestSSEDropsUnaskedUsage(t *testing.T) {
	in := "data: {\"choices\":[{\"delta\":{\"content\":\"hello world\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\n" +
		"data: [DONE]\n\n"
	c := &call{}
	out, err := io.ReadAll(newSSEReader(io.NopCloser(strings.NewReader(in)), c))
	if err != nil {
		t.Fatal(err)
	}
	want := "data: {\"choices\":[{\"delta\":{\"content\":\"hello world\"}}]}\n\ndata: [DONE]\n\n"
	if string(out) != want || !c.usageSeen || c.prompt != 3 || c.completion != 4 || c.produced != 4 {
		t.Fatalf("out %q, call %+v", out, c)
	}
}

func TestFindUsage(t *testing.T) {
	body := []byte(`{"choices":[{"message":{"content":"the \"usage\": {\"prompt_tokens\": 99}"}}],"usage": {"prompt_tokens":5,"completion_tokens":6,"total_tokens":11}}`)
	u := findUsage(body)
	if u == nil || u.PromptTokens != 5 || u.CompletionTokens != 6 {
		t.Fatalf("%+v", u)
	}
	if findUsage([]byte(`{"data":[]}`)) != nil {
		t.Fatal("usage found where there is none")
	}
}
