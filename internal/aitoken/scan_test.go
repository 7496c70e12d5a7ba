package aitoken

import (
	"strings"
	"testing"
)

// scanSeeds are request members as clients send them (OpenAI's chat
// messages with text, image and audio parts, tool calls, a completion's
// prompt as a string, a batch and token ids, responses input items) and
// the shapes scanCount must leave to encoding/json.
var scanSeeds = []string{
	`{"role":"user","content":"hello, how are you today?"}`,
	`{"role":"system","content":"You are a helpful assistant.\nAnswer in \"English\" \u00e9\ud83d\ude00."}`,
	`{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"https://x/y.png","detail":"high"}}]}`,
	`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]}`,
	`{"role":"tool","tool_call_id":"call_1","content":"22 C"}`,
	`{"role":"user","name":"bob","content":[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}`,
	`"a completion prompt"`, `["one","two"]`, `[1, 2, 3, -4.5, 0]`, `[[1,2],[3]]`,
	`{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"},{"type":"input_image","image_url":"data:..."}]}`,
	`true`, `null`, ` {"a" : [ true , false , null ] } `, `{}`, `[]`, `""`,
	// Left to encoding/json, or not JSON at all.
	`{"content":"a","content":"bbbb bbbb"}`, `{"con\u0074ent":"x"}`, `1e5`, `[1E400]`, `"\x"`, `"\u00zz"`,
	`{"a":1,}`, `[1,]`, `01`, `-`, `1.`, "\"\xff\xfe\"", "\"tab\there\"", `{"a":"b"} x`, `{"a" "b"}`,
	strings.Repeat("[", 70) + strings.Repeat("]", 70),
	`{"type":{"image_url":1,"text":"skipped"},"text":"counted"}`,
	`[` + strings.Repeat("9", 310) + `]`,
}

// FuzzCountJSON: scanCount reads what encoding/json and countValue read,
// whenever it reads at all, and countJSON is the same with or without it.
func FuzzCountJSON(f *testing.F) {
	for _, s := range scanSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if len(raw) == 0 {
			return
		}
		want := countJSONValue(raw)
		if got, ok := scanCount(raw); ok && got != want {
			t.Fatalf("scanCount(%q) = %d, encoding/json's reading %d", raw, got, want)
		}
		if got := countJSON(raw); got != want {
			t.Fatalf("countJSON(%q) = %d, want %d", raw, got, want)
		}
	})
}

// TestScanCountReads: the members clients send are counted by scanCount
// itself, escapes included, not left to encoding/json.
func TestScanCountReads(t *testing.T) {
	for _, s := range scanSeeds[:17] {
		if _, ok := scanCount([]byte(s)); !ok {
			t.Errorf("scanCount left %s to encoding/json", s)
		}
	}
}
