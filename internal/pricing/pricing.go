// Package pricing holds what LLM tokens cost: the kinds of token usage
// (input, cached input, output, reasoning), a price per million tokens of
// each kind for a model, and amounts of money in integer micro-dollars.
//
// Nothing here uses floating point. A price is read from a decimal string
// ("2.50") into micro-dollars exactly, a cost is computed in 128 bits and
// rounded up to the micro-dollar, and every amount is bounded by MaxMicros,
// so that no caller-sent number (a huge max_tokens, a negative usage) can
// overflow or wrap an account.
package pricing

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// ErrInvalidAmount means a dollar amount or a price could not be read.
var ErrInvalidAmount = errors.New("pricing: invalid amount")

// Micros is an amount of US dollars in millionths of a dollar. One
// gpt-4o-mini input token at $0.15 per million costs 0.15 micro-dollars, so
// costs are rounded up to whole micro-dollars per request.
type Micros int64

// Dollar is one US dollar.
const Dollar Micros = 1_000_000

// MaxMicros bounds every amount that can be configured: 2^40 micro-dollars,
// about $1.1 million, the largest limit a sluice store accepts (a budget is
// a limit whose unit is the micro-dollar). Costs saturate at
// math.MaxInt64 instead, so that a cost above any budget stays above it.
const MaxMicros Micros = 1 << 40

// maxDecimals is the precision of an amount: the micro-dollar.
const maxDecimals = 6

// ParseUSD reads a non-negative decimal amount of dollars, such as "1",
// "0.15", "$2.50" or "1_000.000001", exactly: at most six decimals, no
// exponent, at most MaxMicros. Errors wrap ErrInvalidAmount.
func ParseUSD(s string) (Micros, error) {
	t := strings.TrimPrefix(strings.TrimSpace(s), "$")
	t = strings.ReplaceAll(t, "_", "")
	whole, frac, dot := strings.Cut(t, ".")
	bad := func(why string) (Micros, error) {
		return 0, fmt.Errorf("%w: %q %s", ErrInvalidAmount, truncate(s), why)
	}
	if (whole == "" && frac == "") || (dot && frac == "" && whole == "") {
		return bad("is not a decimal amount of dollars, such as 2.50")
	}
	if len(frac) > maxDecimals {
		return bad("has more than six decimals (a micro-dollar)")
	}
	if len(whole) > 7 {
		return bad(fmt.Sprintf("exceeds the largest amount, %s", MaxMicros))
	}
	for _, part := range []string{whole, frac} {
		for i := 0; i < len(part); i++ {
			if part[i] < '0' || part[i] > '9' {
				return bad("is not a decimal amount of dollars, such as 2.50")
			}
		}
	}
	var w, f int64
	if whole != "" {
		w, _ = strconv.ParseInt(whole, 10, 64) // at most 7 digits
	}
	if frac != "" {
		f, _ = strconv.ParseInt(frac+strings.Repeat("0", maxDecimals-len(frac)), 10, 64)
	}
	m := Micros(w)*Dollar + Micros(f)
	if m > MaxMicros {
		return bad(fmt.Sprintf("exceeds the largest amount, %s", MaxMicros))
	}
	return m, nil
}

func truncate(s string) string {
	if len(s) > 32 {
		return s[:32] + "..."
	}
	return s
}

// String formats m as dollars with six decimals, such as "2.500000" or
// "-0.000150"; ParseUSD reads non-negative ones back.
func (m Micros) String() string {
	return string(m.AppendUSD(nil))
}

// AppendUSD appends m as String formats it.
func (m Micros) AppendUSD(b []byte) []byte {
	u := uint64(m)
	if m < 0 {
		b = append(b, '-')
		u = -u
	}
	b = strconv.AppendUint(b, u/uint64(Dollar), 10)
	b = append(b, '.')
	frac := u % uint64(Dollar)
	var digits [maxDecimals]byte
	for i := maxDecimals - 1; i >= 0; i-- {
		digits[i] = byte('0' + frac%10)
		frac /= 10
	}
	return append(b, digits[:]...)
}

// MarshalText implements encoding.TextMarshaler with String.
func (m Micros) MarshalText() ([]byte, error) { return m.AppendUSD(nil), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseUSD, so that
// a configuration reads "2.50" exactly, never through a float.
func (m *Micros) UnmarshalText(b []byte) error {
	v, err := ParseUSD(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// Kind is a kind of LLM token usage. The kinds are disjoint: a token is
// counted in exactly one of them.
type Kind uint8

// The kinds of token usage.
const (
	// Input is prompt tokens read without a cache hit.
	Input Kind = iota
	// CachedInput is prompt tokens read from the provider's prompt cache
	// (OpenAI's cached_tokens, Anthropic's cache_read_input_tokens).
	CachedInput
	// Output is generated tokens other than reasoning.
	Output
	// Reasoning is hidden reasoning tokens (OpenAI's reasoning_tokens),
	// billed as output by the providers.
	Reasoning
)

// NumKinds is the number of kinds; Kind values are 0 to NumKinds-1, so
// arrays indexed by Kind (Usage, Price) have NumKinds elements.
const NumKinds = 4

var kindNames = [NumKinds]string{"input", "cached_input", "output", "reasoning"}

// Kinds lists the kinds, in order.
func Kinds() [NumKinds]Kind { return [NumKinds]Kind{Input, CachedInput, Output, Reasoning} }

// String returns the kind's configuration name, such as "cached_input".
func (k Kind) String() string {
	if k < NumKinds {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// ParseKind reads a kind as String writes it.
func ParseKind(s string) (Kind, error) {
	for i, n := range kindNames {
		if n == s {
			return Kind(i), nil
		}
	}
	return 0, fmt.Errorf("pricing: unknown token kind %q; valid: %s", truncate(s), strings.Join(kindNames[:], ", "))
}

// Usage counts tokens by kind.
type Usage [NumKinds]int64

// OpenAIUsage splits OpenAI's inclusive counts into disjoint kinds:
// prompt_tokens includes cached_tokens and completion_tokens includes
// reasoning_tokens. Negative counts are read as 0, and a part larger than
// its whole is capped at the whole.
func OpenAIUsage(prompt, cached, completion, reasoning int64) Usage {
	prompt, completion = max(prompt, 0), max(completion, 0)
	cached = min(max(cached, 0), prompt)
	reasoning = min(max(reasoning, 0), completion)
	return Usage{Input: prompt - cached, CachedInput: cached, Output: completion - reasoning, Reasoning: reasoning}
}

// Total is the number of tokens of every kind, saturated at math.MaxInt64.
func (u Usage) Total() int64 {
	var t int64
	for _, n := range u {
		n = max(n, 0)
		if t > math.MaxInt64-n {
			return math.MaxInt64
		}
		t += n
	}
	return t
}

// MaxPrice bounds a price: $100,000 per million tokens.
const MaxPrice Micros = 100_000 * Dollar

// Price is what a million tokens of each kind cost, in micro-dollars: a
// price of $2.50 per million input tokens is Price{Input: 2_500_000}.
type Price [NumKinds]Micros

// Validate reports a price outside 0 to MaxPrice.
func (p Price) Validate() error {
	for k, v := range p {
		if v < 0 || v > MaxPrice {
			return fmt.Errorf("%w: %s price %s per million tokens is outside 0 to %s", ErrInvalidAmount, Kind(k), v, MaxPrice)
		}
	}
	return nil
}

// Cost is what u costs at p: the sum over kinds of tokens times price per
// million, rounded up to the micro-dollar. It is exact (128-bit
// arithmetic), reads negative counts and prices as 0, and saturates at
// math.MaxInt64. It is monotone in every count.
func (p Price) Cost(u Usage) Micros {
	var hi, lo uint64
	for k := range NumKinds {
		n, pr := max(u[k], 0), max(p[k], 0)
		h, l := bits.Mul64(uint64(n), uint64(pr))
		var carry uint64
		lo, carry = bits.Add64(lo, l, 0)
		hi, _ = bits.Add64(hi, h, carry) // < 2^126: no overflow
	}
	const perMillion = 1_000_000
	if hi >= perMillion {
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, perMillion)
	if r != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return Micros(q)
}
