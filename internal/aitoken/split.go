package aitoken

import (
	"unicode"
	"unicode/utf8"
)

// The pre-tokenizers split text into the pieces that byte-pair encoding
// then merges, exactly as OpenAI's split patterns do, without a regular
// expression engine: a backtracking engine (regexp2, which the tokenizer
// library uses) costs about 20 times as much per byte, and the standard
// library's RE2 cannot express the patterns' look-ahead.
//
// cl100k_base's pattern (tiktoken, openai_public.py):
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// o200k_base's pattern:
//
//	[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//	[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//	\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// Each alternative is matched by a function that returns the end of its
// match at i, or -1, following the engine's leftmost-first, greedy
// semantics (the comments say where backtracking matters). Every function
// runs in time linear in its match, so splitting is linear in the text.
// Invalid UTF-8 bytes read as U+FFFD, one byte each.

// class is what the patterns distinguish of a character.
type class uint8

const (
	clOther  class = iota // none below: punctuation, symbols
	clSpace               // \s other than \r and \n
	clNL                  // \r or \n
	clNumber              // \p{N}
	clUpper               // Lu, Lt: upper-class only (o200k)
	clLower               // Ll: lower-class only (o200k)
	clBoth                // Lm, Lo, M: both o200k classes; M is no \p{L}
)

// classOf classifies r; mark reports whether it is a mark (\p{M}), which
// o200k's letter classes hold but \p{L} does not.
func classOf(r rune) class {
	if r < utf8.RuneSelf {
		return asciiClass[r]
	}
	switch {
	case unicode.IsLetter(r):
		switch {
		case unicode.IsUpper(r), unicode.IsTitle(r):
			return clUpper
		case unicode.IsLower(r):
			return clLower
		}
		return clBoth
	case unicode.IsMark(r):
		return clBoth
	case unicode.IsNumber(r):
		return clNumber
	case unicode.IsSpace(r):
		return clSpace
	}
	return clOther
}

var asciiClass = func() (t [utf8.RuneSelf]class) {
	for c := range t {
		switch {
		case c == '\r' || c == '\n':
			t[c] = clNL
		case c == ' ' || c == '\t' || c == '\v' || c == '\f':
			t[c] = clSpace
		case c >= '0' && c <= '9':
			t[c] = clNumber
		case c >= 'A' && c <= 'Z':
			t[c] = clUpper
		case c >= 'a' && c <= 'z':
			t[c] = clLower
		}
	}
	return t
}()

// isMark reports whether r is a mark, which \p{L} excludes.
func isMark(r rune) bool { return r >= utf8.RuneSelf && unicode.IsMark(r) }

// at decodes the character at i: its class, whether it is a mark, and its
// width. i must be below len(s).
func at(s string, i int) (class, bool, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClass[c], false, 1
	}
	r, w := utf8.DecodeRuneInString(s[i:])
	return classOf(r), isMark(r), w
}

func isLetter(c class, mark bool) bool { return c >= clUpper && !mark }

// isSpace is \s.
func isSpace(c class) bool { return c == clSpace || c == clNL }

// isPunct is [^\s\p{L}\p{N}].
func isPunct(c class, mark bool) bool { return c == clOther || mark }

// isPrefix is [^\r\n\p{L}\p{N}].
func isPrefix(c class, mark bool) bool { return c == clOther || c == clSpace || mark }

// contraction matches (?i:'s|'t|'re|'ve|'m|'ll|'d) at i.
func contraction(s string, i int) int {
	if i+1 >= len(s) || s[i] != '\'' {
		return -1
	}
	lower := func(c byte) byte { return c | 0x20 }
	switch lower(s[i+1]) {
	case 's', 't', 'm', 'd':
		return i + 2
	}
	if i+2 < len(s) {
		switch string([]byte{lower(s[i+1]), lower(s[i+2])}) {
		case "re", "ve", "ll":
			return i + 3
		}
	}
	return -1
}

// numbers matches \p{N}{1,3} at i.
func numbers(s string, i int) int {
	j := i
	for k := 0; k < 3 && j < len(s); k++ {
		c, _, w := at(s, j)
		if c != clNumber {
			break
		}
		j += w
	}
	if j == i {
		return -1
	}
	return j
}

// punct matches ` ?[^\s\p{L}\p{N}]+` then trailing characters that nl
// accepts ([\r\n]* or [\r\n/]*) at i.
func punct(s string, i int, slash bool) int {
	j := i
	if s[j] == ' ' {
		j++
	}
	k := j
	for k < len(s) {
		c, mark, w := at(s, k)
		if !isPunct(c, mark) {
			break
		}
		k += w
	}
	if k == j {
		return -1
	}
	for k < len(s) && (s[k] == '\r' || s[k] == '\n' || slash && s[k] == '/') {
		k++
	}
	return k
}

// spaces matches \s*[\r\n]+|\s+(?!\S)|\s+ at i, where s[i] is \s.
func spaces(s string, i int) int {
	j, lastNL, prev := i, -1, i
	for j < len(s) {
		c, _, w := at(s, j)
		if !isSpace(c) {
			break
		}
		if c == clNL {
			lastNL = j
		}
		prev = j
		j += w
	}
	switch {
	case lastNL >= 0:
		// \s* gives back characters until [\r\n]+ matches at the last
		// newline of the run; nothing after it is a newline.
		return lastNL + 1
	case j == len(s):
		return j // \s+ to the end: (?!\S) holds
	case prev > i:
		// \s+(?!\S): \s+ gives back the run's last character, so that
		// what follows the match is that space, not \S.
		return prev
	}
	return j // \s+: a single space before \S
}

// splitCL100K calls piece with each piece of s under cl100k_base's pattern.
func splitCL100K(s string, piece func(string)) {
	for i := 0; i < len(s); {
		j := matchCL100K(s, i)
		piece(s[i:j])
		i = j
	}
}

func matchCL100K(s string, i int) int {
	if j := contraction(s, i); j >= 0 {
		return j
	}
	c, mark, w := at(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+: the optional character is tried first.
	start := i
	if isPrefix(c, mark) && i+w < len(s) {
		if c2, m2, _ := at(s, i+w); isLetter(c2, m2) {
			start = i + w
		}
	}
	if c2, m2, _ := at(s, start); isLetter(c2, m2) {
		j := start
		for j < len(s) {
			c3, m3, w3 := at(s, j)
			if !isLetter(c3, m3) {
				break
			}
			j += w3
		}
		return j
	}
	if c == clNumber {
		return numbers(s, i)
	}
	if j := punct(s, i, false); j >= 0 {
		return j
	}
	if isSpace(c) {
		return spaces(s, i)
	}
	return i + w // unreachable: every character matches an alternative
}

// splitO200K calls piece with each piece of s under o200k_base's pattern.
func splitO200K(s string, piece func(string)) {
	for i := 0; i < len(s); {
		j := matchO200K(s, i)
		piece(s[i:j])
		i = j
	}
}

func matchO200K(s string, i int) int {
	c, mark, w := at(s, i)
	// The regexp tries each letter alternative with the optional prefix
	// character first, then without (where s[i] itself is of a letter
	// class: a letter or a mark, which is also a prefix character).
	prefix, letter := isPrefix(c, mark), c >= clUpper
	if prefix {
		if j := wordO200K(s, i+w, false); j >= 0 {
			return j
		}
	}
	if letter {
		if j := wordO200K(s, i, false); j >= 0 {
			return j
		}
	}
	if prefix {
		if j := wordO200K(s, i+w, true); j >= 0 {
			return j
		}
	}
	if letter {
		if j := wordO200K(s, i, true); j >= 0 {
			return j
		}
	}
	if c == clNumber {
		return numbers(s, i)
	}
	if j := punct(s, i, true); j >= 0 {
		return j
	}
	if isSpace(c) {
		return spaces(s, i)
	}
	return i + w // unreachable: every character matches an alternative
}

// isUpperClass is [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], isLowerClass
// [\p{Ll}\p{Lm}\p{Lo}\p{M}].
func isUpperClass(c class) bool { return c == clUpper || c == clBoth }
func isLowerClass(c class) bool { return c == clLower || c == clBoth }

// wordO200K matches o200k's first letter alternative at p (after the
// optional prefix), U*L+ with an optional contraction, where U is the
// upper class and L the lower class; or, when second, the second, U+L*
// with an optional contraction. It returns -1 when it does not match.
func wordO200K(s string, p int, second bool) int {
	// U*: the maximal run of upper-class characters [p, q).
	q, lastBoth := p, -1
	for q < len(s) {
		c, _, w := at(s, q)
		if !isUpperClass(c) {
			break
		}
		if c == clBoth {
			lastBoth = q
		}
		q += w
	}
	end := -1
	switch {
	case second:
		if q > p {
			end = lowerRun(s, q)
		}
	case q < len(s) && isLowerOnly(s, q):
		end = lowerRun(s, q)
	case lastBoth >= 0:
		// U* gives back characters until L+ can start: at the run's
		// last character of both classes; L+ then runs to the first
		// upper-only character or q.
		end = lowerRun(s, lastBoth)
	}
	if end < 0 {
		return -1
	}
	if j := contraction(s, end); j >= 0 {
		return j
	}
	return end
}

func isLowerOnly(s string, i int) bool {
	c, _, _ := at(s, i)
	return c == clLower
}

// lowerRun returns the end of the run of lower-class characters at i.
func lowerRun(s string, i int) int {
	for i < len(s) {
		c, _, w := at(s, i)
		if !isLowerClass(c) {
			break
		}
		i += w
	}
	return i
}
