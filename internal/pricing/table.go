package pricing

// List prices of the models the examples and docs use, in US dollars per
// million tokens, read on 2026-12-02 from the providers' pricing pages:
//
//   - OpenAI: https://platform.openai.com/docs/pricing (as mirrored at
//     developers.openai.com/api/docs/pricing): gpt-4o $2.50 input, $1.25
//     cached input, $10.00 output; gpt-4o-mini $0.15, $0.075, $0.60;
//     text-embedding-3-small $0.02 and text-embedding-3-large $0.13 input.
//     Reasoning tokens are billed as output.
//   - Anthropic: https://platform.claude.com/docs/en/about-claude/pricing
//     ("Model pricing"; cached input is "Cache Hits & Refreshes"): Claude
//     Opus 4.5/4.6 $5, $0.50, $25; Sonnet 4/4.5/4.6 $3, $0.30, $15; Haiku
//     4.5 $1, $0.10, $5. Cache writes ($3.75 for Sonnet, 1.25 times
//     input) have no kind here: the gateway's /v1/messages path weighs
//     cache writes and reads into its input tokens (1.25 and 0.1 times)
//     and prices them at the input price, which is what Anthropic bills.
//
// Prices change: override them in the gateway's `prices:` section.
var defaultPrices = map[string]Price{
	"gpt-4o":                 usd(2.50e6, 1.25e6, 10e6),
	"gpt-4o-mini":            usd(0.15e6, 0.075e6, 0.60e6),
	"text-embedding-3-small": usd(0.02e6, 0.02e6, 0),
	"text-embedding-3-large": usd(0.13e6, 0.13e6, 0),
	"claude-opus-4-5":        usd(5e6, 0.50e6, 25e6),
	"claude-opus-4-6":        usd(5e6, 0.50e6, 25e6),
	"claude-sonnet-4-0":      usd(3e6, 0.30e6, 15e6),
	"claude-sonnet-4-5":      usd(3e6, 0.30e6, 15e6),
	"claude-sonnet-4-6":      usd(3e6, 0.30e6, 15e6),
	"claude-haiku-4-5":       usd(1e6, 0.10e6, 5e6),
}

// usd is a price from micro-dollars per million input, cached input and
// output tokens; reasoning costs what output does.
func usd(input, cached, output Micros) Price {
	return Price{Input: input, CachedInput: cached, Output: output, Reasoning: output}
}

// Table maps model names to prices. The zero value has no prices; use
// Defaults for the shipped ones. A Table is not safe for concurrent
// writes; the gateway builds one at start and only reads it after.
type Table struct {
	prices map[string]Price
	// fallback, when set, prices models the table does not name.
	fallback *Price
}

// Defaults returns a Table of the shipped list prices (see the top of
// this file for each price and its source).
func Defaults() *Table {
	t := &Table{prices: make(map[string]Price, len(defaultPrices))}
	for m, p := range defaultPrices {
		t.prices[m] = p
	}
	return t
}

// Set prices model at p, replacing any price it had.
func (t *Table) Set(model string, p Price) {
	if t.prices == nil {
		t.prices = map[string]Price{}
	}
	t.prices[model] = p
}

// SetFallback prices every model the table does not name at p. Without a
// fallback, Lookup reports such models as unpriced.
func (t *Table) SetFallback(p Price) { t.fallback = &p }

// Lookup returns model's price: the table's entry for model, else for
// model without a dated snapshot suffix ("gpt-4o-2024-08-06" is priced as
// "gpt-4o", "claude-sonnet-4-5-20250929" as "claude-sonnet-4-5"), else the
// fallback. ok is false when none applies.
func (t *Table) Lookup(model string) (p Price, ok bool) {
	if p, ok := t.prices[model]; ok {
		return p, true
	}
	if base := SnapshotBase(model); base != model {
		if p, ok := t.prices[base]; ok {
			return p, true
		}
	}
	if t.fallback != nil {
		return *t.fallback, true
	}
	return Price{}, false
}

// Len is the number of models the table names.
func (t *Table) Len() int { return len(t.prices) }

// SnapshotBase is model without a trailing dated snapshot suffix,
// "-YYYY-MM-DD" or "-YYYYMMDD" ("gpt-4o-2024-08-06" is "gpt-4o"); model
// itself when it has none. Prices, and the gateway's limits, of a model
// cover its snapshots by this rule.
func SnapshotBase(model string) string {
	isDigits := func(s string) bool {
		for i := 0; i < len(s); i++ {
			if s[i] < '0' || s[i] > '9' {
				return false
			}
		}
		return len(s) > 0
	}
	if n := len(model); n > 11 && model[n-11] == '-' && model[n-6] == '-' && model[n-3] == '-' &&
		isDigits(model[n-10:n-6]+model[n-5:n-3]+model[n-2:]) {
		return model[:n-11]
	}
	if n := len(model); n > 9 && model[n-9] == '-' && isDigits(model[n-8:]) {
		return model[:n-9]
	}
	return model
}
