package gateway

import "encoding/json"

// Reading a request body without encoding/json
//
// json.Unmarshal of every request body into a wireBody (reflection, a
// validity scan before the decoding scan) was 2-4 µs of a leased
// request's CPU. decodeWireBody reads the bodies clients send in one pass,
// and gives way to json.Unmarshal for anything it does not read exactly as
// json.Unmarshal does: it never decides differently, it only declines.
// It declines:
//
//   - a member name with an escape, or with an upper-case or non-ASCII
//     letter that is not a wireBody field (encoding/json matches names
//     case-insensitively, with Unicode folding: "MODEL", "ſtream");
//   - a field named twice (json's last-wins merge into pointers and
//     slices);
//   - a field's value of another type than the field's (json's
//     UnmarshalTypeError and its message), a string field's value with an
//     escape, an integer that is not a plain one of at most 18 digits, a
//     null in modalities;
//   - any syntax error, nesting past maxWireDepth, or bytes after the
//     object (json's errors and their messages);
//   - a member name repeated in any object, an escaped name in any
//     object, an object of more than maxWireMembers members, or more
//     than maxWireNames names in the objects open at once: what
//     ambiguousMember refuses, or would have to decode or count to know.
//     A body decodeWireBody reads is one ambiguousMember finds nothing
//     in, so parseBodyInto does not scan it again.
//
// Unknown members are skipped, validated as JSON. json.RawMessage values
// are copied, as json.RawMessage.UnmarshalJSON copies them (a null is the
// four bytes "null"), and an empty array decodes to an empty, not nil,
// slice. FuzzWireBody holds it to json.Unmarshal, with a corpus of hostile
// bodies.

// maxWireDepth bounds the nesting decodeWireBody reads; deeper bodies go to
// json.Unmarshal, which bounds them itself.
const maxWireDepth = 256

// maxWireMembers bounds the members of an object decodeWireBody checks
// for repeated names (each against the ones before it); larger objects go
// to json.Unmarshal and ambiguousMember. The top level's known fields do
// not count (seen).
const maxWireMembers = 32

// decodeWireBody decodes body, valid UTF-8, into w, zero, as
// json.Unmarshal would, and reports true; or reports false, with w in any
// state, when it declines (see above) and json.Unmarshal must decide.
func decodeWireBody(body []byte, w *wireBody) bool {
	d := wireDecoder{jsonScan: jsonScan{b: body}}
	d.ws()
	if !d.byte('{') {
		return false
	}
	var seen uint32 // the fields read, by wireField index
	d.ws()
	if d.byte('}') {
		return d.end()
	}
	for {
		d.ws()
		from, to, ok := d.plainSpan()
		if !ok {
			return false
		}
		name := body[from:to]
		d.ws()
		if !d.byte(':') {
			return false
		}
		d.ws()
		f := wireField(name)
		if f < 0 {
			if !foldsToSelf(name) || !d.newName(0, from, to) || !d.skip(0) {
				return false
			}
		} else {
			if seen&(1<<f) != 0 {
				return false
			}
			seen |= 1 << f
			if !d.field(f, w) {
				return false
			}
		}
		d.ws()
		if d.byte('}') {
			return d.end()
		}
		if !d.byte(',') {
			return false
		}
	}
}

// wireField is the index of the wireBody field whose JSON name is name, or
// -1. The indexes are field's cases.
func wireField(name []byte) int {
	switch string(name) {
	case "model":
		return 0
	case "stream":
		return 1
	case "stream_options":
		return 2
	case "max_tokens":
		return 3
	case "max_completion_tokens":
		return 4
	case "max_output_tokens":
		return 5
	case "n":
		return 6
	case "best_of":
		return 7
	case "messages":
		return 8
	case "prompt":
		return 9
	case "input":
		return 10
	case "instructions":
		return 11
	case "tools":
		return 12
	case "functions":
		return 13
	case "response_format":
		return 14
	case "text":
		return 15
	case "prediction":
		return 16
	case "suffix":
		return 17
	case "service_tier":
		return 18
	case "background":
		return 19
	case "modalities":
		return 20
	case "audio":
		return 21
	case "prompt_cache_key":
		return 22
	}
	return -1
}

// foldsToSelf reports whether name can match no wireBody field by
// encoding/json's case-insensitive matching unless it is that field's
// exact name: it has no upper-case ASCII letter and no non-ASCII byte (the
// fields' names are lower-case ASCII, and Unicode folding maps "K", "ſ"
// and the Kelvin sign to them).
func foldsToSelf(name []byte) bool {
	for _, c := range name {
		if c >= 0x80 || ('A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

// wireDecoder reads a body with jsonScan's primitives.
type wireDecoder struct {
	jsonScan
	// names are the member names of the objects open, outermost first,
	// each as its span of b; an array, not a slice, so that it stays on
	// the stack with the decoder.
	names [maxWireNames][2]int
	n     int // names in use
}

// maxWireNames bounds the names of the objects open at once
// decodeWireBody checks; past it, it declines.
const maxWireNames = 64

// newName notes b[from:to] as a member name of the object whose names
// start at names[first], and reports false if the object had it already,
// has maxWireMembers names, or names is full.
func (d *wireDecoder) newName(first, from, to int) bool {
	if d.n-first >= maxWireMembers || d.n == len(d.names) {
		return false
	}
	for _, o := range d.names[first:d.n] {
		if string(d.b[o[0]:o[1]]) == string(d.b[from:to]) {
			return false
		}
	}
	d.names[d.n] = [2]int{from, to}
	d.n++
	return true
}

// field decodes the value of wireBody field f into w.
func (d *wireDecoder) field(f int, w *wireBody) bool {
	switch f {
	case 0, 11: // model, instructions: string
		dst := &w.Model
		if f == 11 {
			dst = &w.Instructions
		}
		if d.null() {
			return true
		}
		s, ok := d.plainString()
		*dst = string(s)
		return ok
	case 18, 22: // service_tier, prompt_cache_key: *string
		if d.null() {
			return true
		}
		s, ok := d.plainString()
		v := string(s)
		if f == 18 {
			w.ServiceTier = &v
		} else {
			w.PromptCacheKey = &v
		}
		return ok
	case 1, 19: // stream, background: bool
		dst := &w.Stream
		if f == 19 {
			dst = &w.Background
		}
		switch {
		case d.literal("true"):
			*dst = true
		case d.literal("false"), d.null():
		default:
			return false
		}
		return true
	case 3, 4, 5, 6, 7: // the budgets, n, best_of: *int64
		if d.null() {
			return true
		}
		v, ok := d.int()
		if !ok {
			return false
		}
		switch f {
		case 3:
			w.MaxTokens = &v
		case 4:
			w.MaxCompletionTokens = &v
		case 5:
			w.MaxOutputTokens = &v
		case 6:
			w.N = &v
		case 7:
			w.BestOf = &v
		}
		return true
	case 8: // messages: []json.RawMessage
		if d.null() {
			return true
		}
		if !d.byte('[') {
			return false
		}
		w.Messages = []json.RawMessage{}
		d.ws()
		if d.byte(']') {
			return true
		}
		for {
			d.ws()
			from := d.i
			if !d.skip(1) {
				return false
			}
			w.Messages = append(w.Messages, append(json.RawMessage(nil), d.b[from:d.i]...))
			d.ws()
			if d.byte(']') {
				return true
			}
			if !d.byte(',') {
				return false
			}
		}
	case 20: // modalities: []string
		if d.null() {
			return true
		}
		if !d.byte('[') {
			return false
		}
		w.Modalities = []string{}
		d.ws()
		if d.byte(']') {
			return true
		}
		for {
			d.ws()
			s, ok := d.plainString()
			if !ok {
				return false
			}
			w.Modalities = append(w.Modalities, string(s))
			d.ws()
			if d.byte(']') {
				return true
			}
			if !d.byte(',') {
				return false
			}
		}
	}
	// The json.RawMessage fields: the value's bytes, copied.
	from := d.i
	if !d.skip(0) {
		return false
	}
	raw := append(json.RawMessage(nil), d.b[from:d.i]...)
	switch f {
	case 2:
		w.StreamOptions = raw
	case 9:
		w.Prompt = raw
	case 10:
		w.Input = raw
	case 12:
		w.Tools = raw
	case 13:
		w.Functions = raw
	case 14:
		w.ResponseFormat = raw
	case 15:
		w.Text = raw
	case 16:
		w.Prediction = raw
	case 17:
		w.Suffix = raw
	case 21:
		w.Audio = raw
	}
	return true
}

// skip reads one JSON value at nesting depth depth, checking its syntax as
// encoding/json does.
func (d *wireDecoder) skip(depth int) bool {
	if d.i >= len(d.b) {
		return false
	}
	switch c := d.b[d.i]; {
	case c == '"':
		return d.skipString()
	case c == '{' || c == '[':
		if depth >= maxWireDepth {
			return false
		}
		closing := byte('}')
		if c == '[' {
			closing = ']'
		}
		d.i++
		d.ws()
		if d.byte(closing) {
			return true
		}
		first := d.n // this object's names, dropped when it closes
		for {
			d.ws()
			if c == '{' {
				if from, to, ok := d.plainSpan(); !ok || !d.newName(first, from, to) {
					return false
				}
				d.ws()
				if !d.byte(':') {
					return false
				}
				d.ws()
			}
			if !d.skip(depth + 1) {
				return false
			}
			d.ws()
			if d.byte(closing) {
				d.n = first
				return true
			}
			if !d.byte(',') {
				return false
			}
		}
	case c == 't':
		return d.literal("true")
	case c == 'f':
		return d.literal("false")
	case c == 'n':
		return d.literal("null")
	case c == '-' || ('0' <= c && c <= '9'):
		return d.skipNumber()
	}
	return false
}
