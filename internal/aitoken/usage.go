package aitoken

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// Kind is a kind of LLM token usage, as providers bill them. The kinds
// are disjoint: a token is counted in exactly one of them. (The same
// kinds as package pricing's, in the same order, so that one can become
// an alias of the other.)
type Kind uint8

// The kinds of token usage.
const (
	// Input is prompt tokens read without a cache hit.
	Input Kind = iota
	// CachedInput is prompt tokens read from the provider's prompt cache
	// (OpenAI's prompt_tokens_details.cached_tokens, Anthropic's
	// cache_read_input_tokens).
	CachedInput
	// Output is generated tokens other than reasoning.
	Output
	// Reasoning is hidden reasoning tokens (OpenAI's
	// completion_tokens_details.reasoning_tokens), billed as output.
	Reasoning
)

// NumKinds is the number of kinds; arrays indexed by Kind have NumKinds
// elements.
const NumKinds = 4

var kindNames = [NumKinds]string{"input", "cached_input", "output", "reasoning"}

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
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return 0, fmt.Errorf("aitoken: unknown token kind %q; valid: %s", s, strings.Join(kindNames[:], ", "))
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

// Prompt is the input tokens of every kind, saturated.
func (u Usage) Prompt() int64 { return addSat(u[Input], u[CachedInput]) }

// Completion is the output tokens of every kind, saturated.
func (u Usage) Completion() int64 { return addSat(u[Output], u[Reasoning]) }

// Total is the tokens of every kind, saturated at math.MaxInt64.
func (u Usage) Total() int64 { return addSat(u.Prompt(), u.Completion()) }

func addSat(a, b int64) int64 {
	a, b = max(a, 0), max(b, 0)
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// WeightScale is the unit of a Weight: 1000 is a weight of 1.
const WeightScale = 1000

// MaxWeight bounds a weight: 1000 (WeightScale × 1000).
const MaxWeight = 1000 * WeightScale

// Weights are what one token of each kind counts against a token limit,
// in thousandths (WeightScale): {1000, 100, 1000, 1000} counts a cached
// input token as 0.1 token, as OpenAI and Anthropic bill cache reads. The
// zero Weights is not valid; DefaultWeights counts every token as one.
type Weights [NumKinds]int64

// DefaultWeights counts one for every token, as tpm always has.
var DefaultWeights = Weights{WeightScale, WeightScale, WeightScale, WeightScale}

// ParseWeight reads a weight such as 1, 0.1 or 1.25: a non-negative
// decimal with at most three decimals, at most 1000.
func ParseWeight(s string) (int64, error) {
	whole, frac, _ := strings.Cut(strings.TrimSpace(s), ".")
	if whole == "" || len(whole) > 4 || len(frac) > 3 || strings.Trim(whole+frac, "0123456789") != "" {
		return 0, fmt.Errorf("aitoken: weight %q: want a decimal from 0 to 1000 with at most three decimals, such as 0.1", truncate(s))
	}
	w, _ := strconv.ParseInt(whole, 10, 64)
	f, _ := strconv.ParseInt((frac + "000")[:3], 10, 64)
	v := w*WeightScale + f
	if v > MaxWeight {
		return 0, fmt.Errorf("aitoken: weight %q: at most 1000", truncate(s))
	}
	return v, nil
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// Apply is the weighted sum of the kinds of u that kinds selects (all
// when it is empty), rounded up to a whole token: the cost of u on a limit
// that counts those kinds. Negative counts and weights count as 0; the
// sum saturates at math.MaxInt64. It is monotone in every count.
func (w Weights) Apply(u Usage, kinds ...Kind) int64 {
	if len(kinds) == 0 {
		kinds = []Kind{Input, CachedInput, Output, Reasoning}
	}
	var hi, lo uint64
	for _, k := range kinds {
		if k >= NumKinds {
			continue
		}
		h, l := bits.Mul64(uint64(max(u[k], 0)), uint64(max(w[k], 0)))
		var c uint64
		lo, c = bits.Add64(lo, l, 0)
		hi += h + c
	}
	// ceil((hi:lo) / WeightScale), saturated.
	if hi >= WeightScale {
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, WeightScale)
	if r > 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// Max is the largest weight of the kinds.
func (w Weights) Max(kinds ...Kind) int64 {
	var m int64
	for _, k := range kinds {
		if k < NumKinds {
			m = max(m, w[k])
		}
	}
	return m
}
