package gateway

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/sluice-io/sluice/internal/pricing"
)

// Token kinds
//
// A token limit counts the kinds of token (package pricing: input, cached
// input, output, reasoning) that its name selects, each weighted by its
// model's token_weights:
//
//	tpm   every kind (Limits.TPM)
//	itpm  input and cached input (Limits.ITPM, Anthropic's ITPM)
//	otpm  output and reasoning (Limits.OTPM, Anthropic's OTPM)
//
// The reservation charges the prompt count at the larger of the input
// weights (whether the provider's cache will hit is unknown) and the
// completion budget times the choices at the larger of the output weights,
// so that it bounds the settlement; settlement charges each kind the
// upstream reported at its own weight (cached tokens from
// prompt_tokens_details.cached_tokens, reasoning tokens from
// completion_tokens_details.reasoning_tokens), rounded up to a whole token.
// With the default weights (1 each) tpm is prompt plus completion, as it
// always was.

// tokenSel is the kinds of token a token limit counts.
type tokenSel uint8

const (
	selAll    tokenSel = iota // tpm
	selInput                  // itpm
	selOutput                 // otpm
)

var selKinds = [...][]pricing.Kind{
	selAll:    {pricing.Input, pricing.CachedInput, pricing.Output, pricing.Reasoning},
	selInput:  {pricing.Input, pricing.CachedInput},
	selOutput: {pricing.Output, pricing.Reasoning},
}

// WeightScale is the unit of a Weight: a Weight of 1000 counts a token as
// one.
const WeightScale = 1000

// MaxWeight bounds a weight: 1000 tokens per token.
const MaxWeight Weight = 1000 * WeightScale

// Weight is what one token of a kind counts against a token limit, in
// thousandths: 100 counts a cached input token as 0.1 token. A
// configuration writes it as a decimal ("0.1", "1.25"), read exactly.
type Weight int64

// ParseWeight reads a weight: a non-negative decimal with at most three
// decimals, at most 1000, such as 1, 0.1 or 1.25.
func ParseWeight(s string) (Weight, error) {
	whole, frac, _ := strings.Cut(strings.TrimSpace(s), ".")
	if whole == "" || len(whole) > 4 || len(frac) > 3 || strings.Trim(whole+frac, "0123456789") != "" {
		return 0, fmt.Errorf("weight %q: want a decimal from 0 to 1000 with at most three decimals, such as 0.1", truncateName(s))
	}
	w, _ := strconv.ParseInt(whole, 10, 64)
	f, _ := strconv.ParseInt((frac + "000")[:3], 10, 64)
	if v := Weight(w*WeightScale + f); v <= MaxWeight {
		return v, nil
	}
	return 0, fmt.Errorf("weight %q: at most 1000", truncateName(s))
}

// UnmarshalText implements encoding.TextUnmarshaler with ParseWeight, so
// that a configuration's "0.1" is read exactly, never through a float.
func (w *Weight) UnmarshalText(b []byte) error {
	v, err := ParseWeight(string(b))
	if err != nil {
		return err
	}
	*w = v
	return nil
}

// MarshalText writes the weight as a decimal.
func (w Weight) MarshalText() ([]byte, error) {
	s := strconv.FormatInt(int64(w)/WeightScale, 10)
	if f := int64(w) % WeightScale; f != 0 {
		s += strings.TrimRight(fmt.Sprintf(".%03d", f), "0")
	}
	return []byte(s), nil
}

// TokenWeights is one entry of `token_weights:`, what a token of each
// kind counts against the token limits (tpm, itpm, otpm) of requests for
// a model. A kind left out counts 1. For example, for a provider that
// bills cache reads at a tenth: {cached_input: 0.1}.
type TokenWeights struct {
	Input       *Weight `yaml:"input"`
	CachedInput *Weight `yaml:"cached_input"`
	Output      *Weight `yaml:"output"`
	Reasoning   *Weight `yaml:"reasoning"`
}

// weights are the effective weights of a model, by kind.
type weights [pricing.NumKinds]int64

var defaultWeights = weights{WeightScale, WeightScale, WeightScale, WeightScale}

func (t *TokenWeights) weights() weights {
	w := defaultWeights
	for k, p := range [pricing.NumKinds]*Weight{t.Input, t.CachedInput, t.Output, t.Reasoning} {
		if p != nil {
			w[k] = int64(*p)
		}
	}
	return w
}

// anthropicWeights are the default weights of an Anthropic Messages
// request: cache reads count a tenth, as Anthropic bills them and as its
// PromptTokens counts them (anthropic.go).
var anthropicWeights = weights{WeightScale, WeightScale / 10, WeightScale, WeightScale}

// weightsFor returns the weights of model: its entry in token_weights,
// else its model's for a dated snapshot, else the "*" entry, else 1 for
// every kind.
func (c *Config) weightsFor(model string) weights {
	w, _ := c.configuredWeights(model)
	return w
}

func (c *Config) configuredWeights(model string) (weights, bool) {
	if t, ok := c.TokenWeights[model]; ok {
		return t.weights(), true
	}
	if t, ok := c.TokenWeights[modelBase(model)]; ok { // a snapshot weighs as its model
		return t.weights(), true
	}
	if t, ok := c.TokenWeights["*"]; ok {
		return t.weights(), true
	}
	return defaultWeights, false
}

// callWeights are c's weights, and whether they are the default ones,
// under which tpm counts exactly what it always did (Settlement.Actual).
func (g *Gateway) callWeights(c *call) (weights, bool) {
	w, ok := g.cfg.configuredWeights(c.rawModel)
	switch {
	case ok:
		return w, w == defaultWeights
	case c.ep.anthropic():
		return anthropicWeights, true
	}
	return w, true
}

// upper is w with each input kind at the larger input weight and each
// output kind at the larger output weight: the reservation's weights.
func (w weights) upper() weights {
	in := max(w[pricing.Input], w[pricing.CachedInput])
	out := max(w[pricing.Output], w[pricing.Reasoning])
	return weights{in, in, out, out}
}

// apply is the weighted sum of the kinds of u, rounded up to a whole
// token. Negative counts and weights count as 0; it saturates at
// math.MaxInt64 and is monotone in every count. It is pricing's exact
// cost arithmetic with the weights as prices: a weight w per thousand is a
// price of w×1000 per million.
func (w weights) apply(u pricing.Usage, kinds []pricing.Kind) int64 {
	var p pricing.Price
	for _, k := range kinds {
		p[k] = pricing.Micros(max(w[k], 0) * (1_000_000 / WeightScale))
	}
	return int64(p.Cost(u))
}

// checkTokenWeights records the problems of `token_weights:` in doc.
func (c *Config) checkTokenWeights(doc interface{ Addf(string, string, ...any) }) {
	if len(c.TokenWeights) > maxModels {
		doc.Addf("token_weights", "at most %d models may be named", maxModels)
	}
	for _, model := range sortedKeys(c.TokenWeights) {
		if model != "*" && !nameRE.MatchString(model) {
			doc.Addf("token_weights."+truncateName(model), `model name must be 1-128 letters, digits or _.:/-, or "*" for every other model`)
		}
	}
}

// tokenCost is what c reserves on token limit s: the prompt count and the
// completion budget (times the choices) weighted by the upper weights of
// its model.
func (g *Gateway) tokenCost(c *call, s *spec) int64 {
	w, plain := g.callWeights(c)
	if s.sel == selAll && plain {
		return c.reserved
	}
	u := pricing.Usage{pricing.Input: c.promptEst, pricing.Output: max(c.reserved-c.promptEst, 0)}
	return w.upper().apply(u, selKinds[s.sel])
}

// settledUsage is the usage by kind that s settles: the upstream's, split
// into its kinds, when it reported usage; else the estimate, all of it
// uncached input and output. Anthropic's cache writes count as input at
// the 1.25 Anthropic bills (its PromptTokens), its cache reads as cached
// input, unweighted.
func settledUsage(c *call, s *Settlement) pricing.Usage {
	switch {
	case s.UsageReported && c.ep.anthropic():
		read := max(s.CacheReadTokens, 0)
		return pricing.Usage{pricing.Input: max(s.PromptTokens-cacheReadTokens(read), 0), pricing.CachedInput: read, pricing.Output: max(s.CompletionTokens, 0)}
	case s.UsageReported:
		return pricing.OpenAIUsage(s.PromptTokens, c.bud.cached, s.CompletionTokens, c.bud.reasoning)
	}
	return pricing.Usage{pricing.Input: max(s.PromptTokens, 0), pricing.Output: max(s.CompletionTokens, 0)}
}

// tokenActual is what s finally charges token limit sp: the settled usage
// of the kinds sp counts at the model's weights, or, for an estimate, at
// the upper weights (the reservation's), which bound any split of it.
func (g *Gateway) tokenActual(c *call, sp *spec, s *Settlement) int64 {
	w, plain := g.callWeights(c)
	if sp.sel == selAll && plain {
		return s.Actual
	}
	if !s.UsageReported {
		w = w.upper()
	}
	return w.apply(s.Usage, selKinds[sp.sel])
}

// clampDefaultBudget keeps a default completion budget (no max_tokens)
// from making a request too large for token limit s that would fit it:
// the completion part of the reservation shrinks to what s's burst leaves.
func (g *Gateway) clampDefaultBudget(c *call, s *spec) {
	w, _ := g.callWeights(c)
	w = w.upper()
	out := max(c.reserved-c.promptEst, 0)
	room := s.limit.Capacity()
	switch s.sel {
	case selInput:
		return // the prompt is what it is
	case selAll:
		room -= w.apply(pricing.Usage{pricing.Input: c.promptEst}, selKinds[selInput])
	}
	if wo := w[pricing.Output]; wo > 0 {
		// The largest out with ceil(out*wo/1000) <= room.
		fit, room := int64(math.MaxInt64), max(room, 0)
		if room < math.MaxInt64/WeightScale {
			fit = room * WeightScale / wo
		}
		out = min(out, fit)
	}
	c.reserved = addSat(c.promptEst, out)
}
