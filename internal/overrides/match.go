package overrides

import "strings"

// Match reports whether s matches pattern, whose only metacharacter is
// '*' (any run of bytes, also empty). It takes time linear in len(s) for
// each literal part of the pattern: the parts are found leftmost-first,
// which is correct for '*' alone, so nothing backtracks.
func Match(pattern, s string) bool {
	star := strings.IndexByte(pattern, '*')
	if star < 0 {
		return pattern == s
	}
	// The literal prefix and suffix are anchored.
	if !strings.HasPrefix(s, pattern[:star]) {
		return false
	}
	s = s[star:]
	pattern = pattern[star+1:]
	last := strings.LastIndexByte(pattern, '*')
	suffix := pattern
	if last >= 0 {
		suffix = pattern[last+1:]
	}
	if len(s) < len(suffix) || !strings.HasSuffix(s, suffix) {
		return false
	}
	s = s[:len(s)-len(suffix)]
	if last < 0 {
		return true
	}
	// Middle parts, leftmost-first in what lies between prefix and suffix.
	// strings.Cut rather than strings.Split: no allocation per decision.
	for rest := pattern[:last]; rest != ""; {
		var part string
		part, rest, _ = strings.Cut(rest, "*")
		if part == "" {
			continue
		}
		i := strings.Index(s, part)
		if i < 0 {
			return false
		}
		s = s[i+len(part):]
	}
	return true
}

// literals counts the non-'*' bytes of a pattern: the more, the more
// specific.
func literals(p string) int { return len(p) - strings.Count(p, "*") }
