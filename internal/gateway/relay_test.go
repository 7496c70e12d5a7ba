package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
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

// findUsageByDecoder is findUsage as it was before objectLen: the rest of
// the body after the last "usage" key through a json.Decoder. FuzzFindUsage
// holds findUsage to it.
func findUsageByDecoder(body []byte) *usageJSON {
	if i := bytes.LastIndex(body, []byte(`"usage"`)); i >= 0 {
		rest := bytes.TrimLeft(body[i+len(`"usage"`):], " \t\r\n")
		if len(rest) > 0 && rest[0] == ':' {
			var u usageJSON
			if json.NewDecoder(bytes.NewReader(rest[1:])).Decode(&u) == nil {
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

// FuzzFindUsage: findUsage reads the usage a json.Decoder read from the
// same bytes, whatever they hold (strings with braces and escapes, usage
// null or not an object, a truncated body, trailing bytes).
func FuzzFindUsage(f *testing.F) {
	for _, s := range []string{
		`{"choices":[{"message":{"content":"the \"usage\": {\"prompt_tokens\": 99}"}}],"usage": {"prompt_tokens":5,"completion_tokens":6,"total_tokens":11}}`,
		`{"usage":{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":1},"x":"}{\\\"","y":[{}]},"z":1}`,
		`{"usage": null}`,
		`{"usage":{"prompt_tokens":1}`,
		`{"usage":{"prompt_tokens":1]}`,
		`{"usage":{"prompt_tokens":1}} trailing`,
		`{"usage":"}"}`,
		`{"usage" : 	{"input_tokens":3,"output_tokens":4,"cache_creation":{"ephemeral_1h_input_tokens":2}}}`,
		`{"data":[]}`,
		// decodeUsage's own reading, and where it must give way.
		`{"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":3,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":4,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}`,
		`{"usage":{"input_tokens":20,"output_tokens":5,"cache_creation_input_tokens":1,"cache_read_input_tokens":2,"cache_creation":{"ephemeral_5m_input_tokens":1,"ephemeral_1h_input_tokens":0},"service_tier":"standard","server_tool_use":{"web_search_requests":0},"x":null,"y":true,"z":false}}`,
		`{"usage":{"prompt_tokens":1,"prompt_tokens":2}}`,
		`{"usage":{"prompt_tokens_details":{"cached_tokens":1},"prompt_tokens_details":{"reasoning_tokens":2}}}`,
		`{"usage":{"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":2}}}`,
		`{"usage":{"Prompt_Tokens":5,"prompt_tokens":6}}`,
		`{"usage":{"prompt_tokens":05}}`,
		`{"usage":{"prompt_tokens":1234567890123456789}}`,
		`{"usage":{"prompt_tokens":9223372036854775808}}`,
		`{"usage":{"prompt_tokens":1.0,"completion_tokens":1e2}}`,
		`{"usage":{"prompt_tokens":-1}}`,
		`{"usage":{"prompt_tokens":null,"prompt_tokens_details":null}}`,
		`{"usage":{"prompt\u005ftokens":7}}`,
		`{"usage":{"a":{"b":{"c":{"d":{"e":1}}}},"prompt_tokens":3}}`,
		`{"usage":{"a":"\"","b":[1],"prompt_tokens":3,}}`,
		`{"usage":{ "prompt_tokens" : 3 , "a" : "x\ty" }}`,
		`{"usage":{}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, want := findUsage(body), findUsageByDecoder(body)
		if (got == nil) != (want == nil) || (got != nil && !reflect.DeepEqual(*got, *want)) {
			t.Fatalf("findUsage(%q) = %+v, the decoder read %+v", body, got, want)
		}
	})
}

func TestInsertIncludeUsage(t *testing.T) {
	in := " \n{\"model\":\"m\",\"stream\":true}"
	body, err := readBody(strings.NewReader(in), int64(len(in)), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	c := cap(body)
	got := insertIncludeUsage(body)
	if want := " \n{\"stream_options\":{\"include_usage\":true},\"model\":\"m\",\"stream\":true}"; string(got) != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if cap(got) != c {
		t.Fatalf("reallocated: cap %d, was %d", cap(got), c)
	}
}

// TestSSERelaysWholeEvents: an event whose lines arrived together goes out
// in one Read, and a later one is not waited for.
func TestSSERelaysWholeEvents(t *testing.T) {
	pr, pw := io.Pipe()
	r := newSSEReader(pr, &call{wantUsage: true})
	defer r.Close()
	ev := "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"
	go func() { _, _ = pw.Write([]byte(ev)) }()
	buf := make([]byte, 1024)
	n, err := r.Read(buf)
	if err != nil || string(buf[:n]) != ev {
		t.Fatalf("read %q, %v; want %q", buf[:n], err, ev)
	}
	_ = pw.Close()
	if n, err := r.Read(buf); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("read %d, %v after the end", n, err)
	}
	if r.c.produced != 1 {
		t.Fatalf("produced %d, want 1", r.c.produced)
	}
}
