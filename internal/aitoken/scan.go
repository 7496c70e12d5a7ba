package aitoken

import (
	"encoding/json"
	"unicode/utf8"
	"unsafe"
)

// scanCount is countJSON's reading of raw, the heuristic's count of its
// strings, numbers and image parts, made in one pass over the bytes
// instead of through encoding/json's map[string]any (a map, a string
// and a boxed value per member: most of a small request's allocations in
// the gateway, BenchmarkServeHTTPLeased). It reports false whenever it
// might read raw otherwise than json.Unmarshal and countValue do, and
// countJSON then takes that path: invalid UTF-8 (which encoding/json
// reads as U+FFFD), a member name with escapes or repeated in its object
// (a map keeps the last), an object of more than scanMaxMembers members,
// a number with an exponent or of more than 300 bytes (which may not
// parse as a float64), nesting past scanMaxDepth, or anything that is not
// JSON. FuzzCountJSON holds the two readings equal.
func scanCount(raw []byte) (int64, bool) {
	if !utf8.Valid(raw) {
		return 0, false
	}
	s := scanner{b: raw}
	s.space()
	n, ok := s.value(0, true)
	s.space()
	return n, ok && s.i == len(s.b)
}

// Bounds of what scanCount reads itself.
const (
	scanMaxDepth   = 64
	scanMaxMembers = 32
)

// scanner reads b from i on.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// value reads one value and returns its count, or validates it only when
// count is false (a member countValue skips).
func (s *scanner) value(depth int, count bool) (int64, bool) {
	if s.i >= len(s.b) || depth > scanMaxDepth {
		return 0, false
	}
	switch c := s.b[s.i]; {
	case c == '"':
		str, esc, ok := s.str()
		if !ok || !count {
			return 0, ok
		}
		if esc {
			var v string
			if json.Unmarshal(str, &v) != nil {
				return 0, false
			}
			return Count(v), true
		}
		// A view of the bytes between the quotes: Count keeps nothing.
		return Count(unsafe.String(unsafe.SliceData(str[1:]), len(str)-2)), true
	case c == '-' || (c >= '0' && c <= '9'):
		if !s.number() {
			return 0, false
		}
		if count {
			return 1, true
		}
		return 0, true
	case c == '[':
		return s.array(depth, count)
	case c == '{':
		return s.object(depth, count)
	}
	for _, lit := range [...]string{"true", "false", "null"} {
		if len(s.b)-s.i >= len(lit) && string(s.b[s.i:s.i+len(lit)]) == lit {
			s.i += len(lit)
			return 0, true
		}
	}
	return 0, false
}

// str reads a string and returns it with its quotes, and whether it has
// escapes.
func (s *scanner) str() (str []byte, esc, ok bool) {
	start := s.i
	for i := s.i + 1; i < len(s.b); i++ {
		switch c := s.b[i]; {
		case c == '"':
			s.i = i + 1
			return s.b[start:s.i], esc, true
		case c == '\\':
			esc = true
			if i+1 >= len(s.b) {
				return nil, false, false
			}
			i++
			switch s.b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(s.b) || !isHex(s.b[i+1]) || !isHex(s.b[i+2]) || !isHex(s.b[i+3]) || !isHex(s.b[i+4]) {
					return nil, false, false
				}
				i += 4
			default:
				return nil, false, false
			}
		case c < 0x20:
			return nil, false, false
		}
	}
	return nil, false, false
}

// number reads a JSON number without an exponent, of at most 300 bytes.
func (s *scanner) number() bool {
	start := s.i
	if s.b[s.i] == '-' {
		s.i++
	}
	digits := func() int {
		from := s.i
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
		}
		return s.i - from
	}
	intStart := s.i
	n := digits()
	if n == 0 || (n > 1 && s.b[intStart] == '0') {
		return false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		return false
	}
	return s.i-start <= 300
}

func (s *scanner) array(depth int, count bool) (int64, bool) {
	s.i++ // '['
	s.space()
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		return 0, true
	}
	var n int64
	for {
		s.space()
		v, ok := s.value(depth+1, count)
		if !ok {
			return 0, false
		}
		n += v
		s.space()
		if s.i >= len(s.b) {
			return 0, false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case ']':
			s.i++
			return n, true
		default:
			return 0, false
		}
	}
}

func (s *scanner) object(depth int, count bool) (int64, bool) {
	s.i++ // '{'
	s.space()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return 0, true
	}
	var namesBuf [scanMaxMembers][]byte
	names := namesBuf[:0]
	var n int64
	for {
		s.space()
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return 0, false
		}
		str, esc, ok := s.str()
		if !ok || esc || len(names) == scanMaxMembers {
			return 0, false
		}
		name := str[1 : len(str)-1]
		for _, o := range names {
			if string(o) == string(name) {
				return 0, false // a map keeps the last: leave it to encoding/json
			}
		}
		names = append(names, name)
		s.space()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return 0, false
		}
		s.i++
		s.space()
		// As countValue: markers and ids are not counted, an image part
		// costs ImageTokens whatever it holds.
		countIt := count
		switch string(name) {
		case "type", "role", "id", "tool_call_id", "detail":
			countIt = false
		case "image_url", "input_image", "image":
			countIt = false
			if count {
				n += ImageTokens
			}
		}
		v, ok := s.value(depth+1, countIt)
		if !ok {
			return 0, false
		}
		n += v
		s.space()
		if s.i >= len(s.b) {
			return 0, false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case '}':
			s.i++
			return n, true
		default:
			return 0, false
		}
	}
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}
