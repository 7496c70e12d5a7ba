package server

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// errText means a body holds text that encoding/json would change silently.
var errText = errors.New("keys are compared byte for byte, so send valid UTF-8 (encode binary keys, in hex or base64, say)")

// checkText refuses a JSON body that encoding/json would change without
// an error: invalid UTF-8, and \u escapes of lone UTF-16 surrogates, both
// of which it turns into U+FFFD. Two keys that differ only there would
// otherwise share one limit. decodeCheckFast accepts no such body, so
// only bodies it declines need the check.
func checkText(b []byte) error {
	if !utf8.Valid(b) {
		i := 0
		for i < len(b) {
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			i += n
		}
		return fmt.Errorf("body is not valid UTF-8 (byte %d): %w", i, errText)
	}
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		if i+5 >= len(b) || b[i+1] != 'u' {
			i++ // a two-byte escape, or a syntax error encoding/json reports
			continue
		}
		r, ok := hex4(b[i+2 : i+6])
		switch {
		case !ok || r < 0xd800 || r > 0xdfff:
		case r < 0xdc00 && i+11 < len(b) && b[i+6] == '\\' && b[i+7] == 'u':
			if lo, ok := hex4(b[i+8 : i+12]); ok && lo >= 0xdc00 && lo <= 0xdfff {
				i += 6 // a surrogate pair: one valid character
				break
			}
			fallthrough
		default:
			return fmt.Errorf("body escapes a lone UTF-16 surrogate (%q at byte %d): %w", b[i:i+6], i, errText)
		}
		i += 5
	}
	return nil
}

// hex4 reads four hex digits.
func hex4(b []byte) (rune, bool) {
	var r rune
	for _, c := range b {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// decodeCheckFast parses the common body of /v1/check and /v1/reset
// without reflection: one flat object whose members are "policy", "tier",
// "key" and "api_key", strings without escapes, and "cost", an integer.
// Anything else (escapes, "checks", null, other names or spellings, invalid
// UTF-8, trailing data, ...) makes it return false, and the caller decodes
// with encoding/json, which gives those documents their meaning or their
// error message. For every document it accepts, the result is what
// encoding/json would decode into checkBody; a differential fuzz test
// (FuzzDecodeFast) holds it to that.
func decodeCheckFast(b []byte, body *checkBody) bool {
	var c checkItem
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		if skipSpace(b, i+1) != len(b) {
			return false
		}
		*body = checkBody{}
		return true
	}
	for {
		name, j, ok := scanString(b, i)
		if !ok {
			return false
		}
		i = skipSpace(b, j)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = skipSpace(b, i+1)
		var dst *string
		switch string(name) {
		case "policy":
			dst = &c.Policy
		case "tier":
			dst = &c.Tier
		case "key":
			dst = &c.Key
		case "api_key":
			dst = &c.APIKey
		case "cost":
			n, j, ok := scanInt(b, i)
			if !ok {
				return false
			}
			body.cost = n
			c.Cost = &body.cost
			i = j
		default:
			return false
		}
		if dst != nil {
			v, j, ok := scanString(b, i)
			if !ok {
				return false
			}
			*dst = string(v)
			i = j
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			if skipSpace(b, i+1) != len(b) {
				return false
			}
			body.checkItem, body.Checks = c, nil
			return true
		default:
			return false
		}
	}
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// scanString reads a JSON string at b[i] that needs no unescaping: no
// backslash, no control character, valid UTF-8. It returns its contents
// and the index after the closing quote.
func scanString(b []byte, i int) ([]byte, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	start := i + 1
	ascii := true
	for j := start; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			s := b[start:j]
			if !ascii && !utf8.Valid(s) {
				return nil, 0, false
			}
			return s, j + 1, true
		case c == '\\' || c < 0x20:
			return nil, 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, 0, false
}

// scanInt reads a JSON integer at b[i] of at most 18 digits, so that it
// cannot overflow. A fraction or exponent is left unread, and the caller
// then finds no ',' or '}' after it and gives up.
func scanInt(b []byte, i int) (int64, int, bool) {
	neg := i < len(b) && b[i] == '-'
	if neg {
		i++
	}
	start := i
	var n int64
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		n = n*10 + int64(b[i]-'0')
		i++
	}
	switch digits := i - start; {
	case digits == 0 || digits > 18:
		return 0, 0, false
	case digits > 1 && b[start] == '0':
		return 0, 0, false // a leading zero is not JSON
	}
	if neg {
		n = -n
	}
	return n, i, true
}
