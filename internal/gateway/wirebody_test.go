package gateway

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// wireSeeds are bodies FuzzWireBody starts from: the SDKs' usual shapes,
// which decodeWireBody must read itself (TestDecodeWireBodyReads), and
// hostile ones, where it must read as json.Unmarshal or decline.
var wireSeeds = []string{
	benchBody,
	chatBody,
	`{"model":"gpt-4o","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi \"there\" \u00e9\n"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA","detail":"low"}}]}],"max_completion_tokens":256,"n":2,"stream":true,"stream_options":{"include_usage":true},"temperature":0.7,"top_p":1e-3,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}],"response_format":{"type":"json_schema"},"service_tier":"flex","prompt_cache_key":"user-1","modalities":["text","audio"],"audio":{"voice":"alloy","format":"wav"},"user":null,"metadata":{}}`,
	`{"model":"gpt-4o","input":[{"role":"user","content":"x"}],"instructions":"be brief","max_output_tokens":100,"background":true,"text":{"format":{"type":"text"}}}`,
	`{"model":"gpt-3.5-turbo-instruct","prompt":["a","b"],"suffix":"z","best_of":3,"max_tokens":5}`,
	`{"model":"text-embedding-3-small","input":"hello"}`,
	` {"model":"m"} `,
	`{}`,
	`{"messages":[]}`,
	`{"messages":null,"modalities":null,"max_tokens":null,"service_tier":null,"stream":null,"model":null,"prompt":null}`,
	`{"messages":[null,1,"s",true,{},[]]}`,
	// Names encoding/json matches by case or Unicode folding, escaped,
	// or repeated.
	`{"Model":"a","model":"b"}`,
	`{"model":"a","MODEL":"b"}`,
	"{\"\u017ftream\":true,\"model\":\"m\"}",
	"{\"max_to\u212aens\":5,\"model\":\"m\"}",
	`{"mod\u0065l":"x"}`,
	`{"model":"a","model":"b"}`,
	`{"max_tokens":1,"max_tokens":100000,"model":"m"}`,
	`{"messages":[{"content":"long"}],"messages":[{"content":"short"}],"model":"m"}`,
	`{"model":"m","x":1,"x":2}`,
	`{"messages":[1],"messages":null,"model":"m"}`,
	`{"max_tokens":5,"max_tokens":null,"model":"m"}`,
	`{"stream":true,"stream":false,"model":"m"}`,
	`{"model":"m","messages":[{"role":"user","content":"a","content":"bb"}]}`,
	`{"model":"m","messages":[{"role":"user","c\u006fntent":"a","content":"bb"}]}`,
	`{"model":"m","tools":[{"a":{"b":1,"b":2}}]}`,
	`{"model":"m","x":{"a":1},"y":{"a":1},"z":[{"a":1},{"a":1}]}`,
	`{"model":"m","Messages":[]}`,
	`{"model":"m","x":{` + strings.Repeat(`"k":1,`, 0) + `"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"k":11,"l":12,"m":13,"n":14,"o":15,"p":16,"q":17,"r":18,"s":19,"t":20,"u":21,"v":22,"w":23,"x":24,"y":25,"z":26,"aa":27,"ab":28,"ac":29,"ad":30,"ae":31,"af":32,"ag":33}}`,
	// Values of other types, escapes, numbers json refuses or reads
	// its own way.
	`{"model":5}`,
	`{"model":"a\"b"}`,
	`{"model":"\ud800"}`,
	`{"stream":"true","model":"m"}`,
	`{"max_tokens":1.0,"model":"m"}`,
	`{"max_tokens":1e2,"model":"m"}`,
	`{"max_tokens":-0,"model":"m"}`,
	`{"max_tokens":-5,"model":"m"}`,
	`{"max_tokens":05,"model":"m"}`,
	`{"max_tokens":9223372036854775807,"model":"m"}`,
	`{"max_tokens":9223372036854775808,"model":"m"}`,
	`{"max_tokens":123456789012345678,"model":"m"}`,
	`{"n":"2","model":"m"}`,
	`{"modalities":["text",null],"model":"m"}`,
	`{"modalities":["te\u0078t"],"model":"m"}`,
	`{"messages":{"role":"user"},"model":"m"}`,
	`{"service_tier":["flex"],"model":"m"}`,
	// Syntax: truncated, trailing bytes, bad escapes, control bytes,
	// deep nesting, numbers.
	`{"model":"m"`,
	`{"model":"m"} x`,
	`{"model":"m"}{}`,
	`{"model":"m",}`,
	`{"model" "m"}`,
	`{"x":"\q","model":"m"}`,
	`{"x":"\u12","model":"m"}`,
	"{\"x\":\"a\tb\",\"model\":\"m\"}",
	`{"x":01,"model":"m"}`,
	`{"x":1.,"model":"m"}`,
	`{"x":-,"model":"m"}`,
	`{"x":1e+,"model":"m"}`,
	`{"x":[1,],"model":"m"}`,
	`{"x":tru,"model":"m"}`,
	`{"x":{"a" 1},"model":"m"}`,
	`{"x":` + strings.Repeat("[", 300) + strings.Repeat("]", 300) + `,"model":"m"}`,
	`[]`,
	`"model"`,
}

// FuzzWireBody: decodeWireBody reads every body it reads as json.Unmarshal
// reads it into a wireBody, and json.Unmarshal accepts it; anything else
// it declines. Run: go test -fuzz FuzzWireBody ./internal/gateway/
func FuzzWireBody(f *testing.F) {
	for _, s := range wireSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !utf8.Valid(body) {
			return // parseBodyInto refuses it before
		}
		var fast, slow wireBody
		if !decodeWireBody(body, &fast) {
			return
		}
		if err := json.Unmarshal(body, &slow); err != nil {
			t.Fatalf("decodeWireBody read %q, json.Unmarshal refused it: %v", body, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("%q:\ndecodeWireBody %+v\njson.Unmarshal %+v", body, fast, slow)
		}
		if name, f, dup := ambiguousMember(body, readFields); dup || f != "" {
			t.Fatalf("decodeWireBody read %q, in which ambiguousMember finds %q (%q, repeated %v)", body, name, f, dup)
		}
	})
}

// TestDecodeWireBodyReads: the SDKs' usual bodies are read by
// decodeWireBody itself, not handed to json.Unmarshal; the hostile ones of
// its seeds that json.Unmarshal refuses or reads its own way are declined.
func TestDecodeWireBodyReads(t *testing.T) {
	for _, s := range wireSeeds[:11] {
		var w wireBody
		if !decodeWireBody([]byte(s), &w) {
			t.Errorf("declined %s", s)
		}
	}
	// Siblings may repeat each other's names.
	if !decodeWireBody([]byte(`{"model":"m","x":{"a":1},"y":{"a":1},"z":[{"a":1},{"a":1}]}`), new(wireBody)) {
		t.Error("declined objects whose siblings have the same names")
	}
	for _, s := range wireSeeds[11:] {
		var w wireBody
		if decodeWireBody([]byte(s), &w) && json.Unmarshal([]byte(s), new(wireBody)) != nil {
			t.Errorf("read %s, which json.Unmarshal refuses", s)
		}
	}
}
