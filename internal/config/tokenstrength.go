package config

import (
	"fmt"
	"strings"
)

// MakeAdminToken is how the errors about a weak admin token say to make
// one: 32 random bytes, 64 hex digits.
const MakeAdminToken = "openssl rand -hex 32"

// Bounds of an admin token's strength (WeakToken). A token from
// MakeAdminToken (64 hex digits) passes them all but with a chance far
// below one in a billion.
const (
	// minTokenDistinct is the fewest different characters a token has
	// (fewer for a token shorter than 32: a quarter of its length).
	minTokenDistinct = 8
	// minTokenRest is the fewest characters left once common words and
	// runs (abc, 321, aaa) are taken out.
	minTokenRest = 10
	// minTokenRun is the shortest run taken out: characters in a row
	// whose codes step by +1, -1 or 0.
	minTokenRun = 3
)

// tokenWords are the words guessers try first, lower case. None is made
// of hex digits only, so a hex token never loses characters to them but
// by chance.
var tokenWords = []string{
	"password", "passwd", "passw0rd", "p@ssw0rd", "pass", "administrator", "admin",
	"secret", "token", "changeme", "change", "letmein", "qwertyuiop", "qwerty",
	"asdfgh", "asdf", "zxcvbn", "zxcv", "welcome", "default", "example", "sluice",
	"test", "root", "master", "login", "iloveyou", "monkey", "dragon", "football",
	"baseball", "shadow", "superman", "hello", "trustno1", "sunshine", "princess",
	"private", "access", "key", "api", "dev", "prod", "staging",
}

// WeakToken returns why token is too easy to guess to be an admin token,
// or "" when it is not: fewer than MinAdminTokenLen characters, fewer
// than 8 different ones (a quarter of its length when shorter than 32), a
// repetition of a shorter piece, two thirds or more of its steps between
// neighbouring characters (codes that differ by 0 or 1), or, with common words and runs taken out,
// fewer than 10 characters left. It judges the token's form only: a
// token copied from a web page passes.
func WeakToken(token string) string {
	if n := len(token); n < MinAdminTokenLen {
		return fmt.Sprintf("%d characters; an admin token needs at least %d", n, MinAdminTokenLen)
	}
	distinct := map[rune]bool{}
	for _, r := range token {
		distinct[r] = true
	}
	if want := min(minTokenDistinct, len(token)/4); len(distinct) < want {
		return fmt.Sprintf("only %d different characters; an admin token of %d needs at least %d", len(distinct), len(token), want)
	}
	if p := period(token); p <= len(token)/2 {
		return fmt.Sprintf("a repetition of %q", token[:p])
	}
	steps := 0
	for i := 1; i < len(token); i++ {
		if d := int(token[i]) - int(token[i-1]); d >= -1 && d <= 1 {
			steps++
		}
	}
	if 3*steps > 2*(len(token)-1) {
		return "mostly runs of neighbouring characters (such as abcd, 4321 or aaaa)"
	}
	if rest := tokenRest(token); rest < minTokenRest {
		return fmt.Sprintf("mostly common words and runs: %d characters are left without them; an admin token needs %d", rest, minTokenRest)
	}
	return ""
}

// period is the length of the shortest piece token repeats (len(token)
// when it repeats none).
func period(token string) int {
	for p := 1; p < len(token); p++ {
		if token[p:] == token[:len(token)-p] {
			return p
		}
	}
	return len(token)
}

// tokenRest counts the bytes of token outside common words (any case)
// and runs of minTokenRun or more.
func tokenRest(token string) int {
	lower := strings.ToLower(token)
	out := make([]bool, len(token))
	for _, w := range tokenWords {
		for from := 0; ; {
			i := strings.Index(lower[from:], w)
			if i < 0 {
				break
			}
			for j := from + i; j < from+i+len(w); j++ {
				out[j] = true
			}
			from += i + 1
		}
	}
	for i := 0; i+1 < len(lower); {
		d := int(lower[i+1]) - int(lower[i])
		j := i + 1
		for j+1 < len(lower) && int(lower[j+1])-int(lower[j]) == d {
			j++
		}
		if d >= -1 && d <= 1 && j-i+1 >= minTokenRun {
			for k := i; k <= j; k++ {
				out[k] = true
			}
		}
		if j == i+1 {
			i++
		} else {
			i = j
		}
	}
	rest := 0
	for _, o := range out {
		if !o {
			rest++
		}
	}
	return rest
}
