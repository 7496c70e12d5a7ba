package gateway

// The JSON primitives the gateway's hand-written decoders share.
//
// Two decoders read JSON without encoding/json: decodeWireBody (a request
// body into a wireBody, wirebody.go) and decodeUsage (a response's usage
// object, usage.go). Each reads only what it reads exactly as
// json.Unmarshal does and declines the rest, and each has its own rules
// for what that is, so each keeps its own field logic, its own value
// skipping (which values it lets through, and how deep) and its own
// member-name rule. What they share is the reading of JSON's tokens, here:
// white space, one byte, a literal, a string without escapes, an integer
// of at most 18 digits, and (for the decoder that reads any value) a
// string with escapes and a number.

// jsonScan reads b from i on. Every method either reads what it names and
// moves i past it, or reports false; where it reports false, i is left
// anywhere (a decoder that sees false declines the whole input).
type jsonScan struct {
	b []byte
	i int
}

// ws skips white space, as JSON defines it.
func (s *jsonScan) ws() {
	b, i := s.b, s.i
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	s.i = i
}

// byte reads c if it is next.
func (s *jsonScan) byte(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// end reports whether only white space is left.
func (s *jsonScan) end() bool {
	s.ws()
	return s.i == len(s.b)
}

// literal reads lit if it is next.
func (s *jsonScan) literal(lit string) bool {
	if len(s.b)-s.i >= len(lit) && string(s.b[s.i:s.i+len(lit)]) == lit {
		s.i += len(lit)
		return true
	}
	return false
}

// null reads a null if it is next.
func (s *jsonScan) null() bool { return s.literal("null") }

// plainSpan reads a string without escapes or control bytes and returns
// its contents' span of b: false for anything else.
func (s *jsonScan) plainSpan() (from, to int, ok bool) {
	b, i := s.b, s.i
	if i >= len(b) || b[i] != '"' {
		return 0, 0, false
	}
	i++
	from = i
	for ; i < len(b); i++ {
		c := b[i]
		if c > '\\' {
			continue // lower-case letters, '_' and UTF-8's bytes: one test
		}
		switch {
		case c == '"':
			s.i = i + 1
			return from, i, true
		case c == '\\' || c < 0x20:
			return 0, 0, false
		}
	}
	return 0, 0, false
}

// plainString is plainSpan, returning the contents (a view of b).
func (s *jsonScan) plainString() ([]byte, bool) {
	from, to, ok := s.plainSpan()
	return s.b[from:to], ok
}

// uint reads an unsigned integer with no fraction or exponent and at most
// 18 digits, which an int64 holds.
func (s *jsonScan) uint() (int64, bool) {
	b, from := s.b, s.i
	i := from
	var n int64
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		n = n*10 + int64(b[i]-'0')
		i++
	}
	s.i = i
	digits := i - from
	if digits == 0 || digits > 18 || (digits > 1 && b[from] == '0') {
		return 0, false
	}
	if i < len(b) {
		switch b[i] {
		case '.', 'e', 'E':
			return 0, false
		}
	}
	return n, true
}

// int reads an integer as uint does, with an optional minus sign ("-0"
// is 0, as json.Unmarshal reads it).
func (s *jsonScan) int() (int64, bool) {
	neg := s.byte('-')
	n, ok := s.uint()
	if neg {
		n = -n
	}
	return n, ok
}

// skipString reads a string, its escapes checked as encoding/json checks
// them.
func (s *jsonScan) skipString() bool {
	if !s.byte('"') {
		return false
	}
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return true
		case c < 0x20:
			return false
		case c == '\\':
			s.i++
			if s.i >= len(s.b) {
				return false
			}
			switch s.b[s.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i++
			case 'u':
				if len(s.b)-s.i < 5 {
					return false
				}
				for _, h := range s.b[s.i+1 : s.i+5] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return false
					}
				}
				s.i += 5
			default:
				return false
			}
		default:
			s.i++
		}
	}
	return false
}

// skipNumber reads a number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *jsonScan) skipNumber() bool {
	s.byte('-')
	if s.i < len(s.b) && s.b[s.i] == '0' {
		s.i++
	} else if s.digits() == 0 {
		return false
	}
	if s.byte('.') && s.digits() == 0 {
		return false
	}
	if s.byte('e') || s.byte('E') {
		if !s.byte('+') {
			s.byte('-')
		}
		if s.digits() == 0 {
			return false
		}
	}
	return true
}

// digits reads decimal digits and returns how many.
func (s *jsonScan) digits() int {
	b, i := s.b, s.i
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	n := i - s.i
	s.i = i
	return n
}
