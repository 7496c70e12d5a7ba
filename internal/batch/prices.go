package batch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
)

// Price is what a model costs, in US dollars per million tokens.
type Price struct {
	// Input is the price of a million prompt tokens.
	Input float64 `json:"input"`
	// Output is the price of a million completion tokens.
	Output float64 `json:"output"`
}

// Prices maps model names to prices.
type Prices map[string]Price

// DefaultPrices are list prices in US dollars per million tokens for the
// models the examples and docs use (OpenAI's list prices for the GPT
// models and embeddings; the seed tutorial's single figure for the
// others). They are estimates for the summary only; override them with
// --price or --prices.
func DefaultPrices() Prices {
	return Prices{
		"gpt-4.1":                {Input: 2.00, Output: 8.00},
		"gpt-4.1-mini":           {Input: 0.40, Output: 1.60},
		"gpt-4.1-nano":           {Input: 0.10, Output: 0.40},
		"gpt-4o":                 {Input: 2.50, Output: 10.00},
		"gpt-4o-mini":            {Input: 0.15, Output: 0.60},
		"text-embedding-3-small": {Input: 0.02, Output: 0},
		"text-embedding-3-large": {Input: 0.13, Output: 0},
		"claude-sonnet-4.5":      {Input: 15.00, Output: 15.00},
		"gemini-2.5-flash":       {Input: 2.50, Output: 2.50},
		"deepseek-v3.2":          {Input: 0.42, Output: 0.42},
	}
}

// Cost returns the cost of the tokens for model, and false when the model
// has no price.
func (p Prices) Cost(model string, prompt, completion int64) (float64, bool) {
	pr, ok := p[model]
	if !ok {
		return 0, false
	}
	return float64(prompt)*pr.Input/1e6 + float64(completion)*pr.Output/1e6, true
}

// Set reads one override, "model=price" or "model=input/output", in
// dollars per million tokens.
func (p Prices) Set(spec string) error {
	model, val, ok := strings.Cut(spec, "=")
	model = strings.TrimSpace(model)
	if !ok || model == "" {
		return fmt.Errorf("batch: price %q: want model=usd_per_mtok or model=input/output", spec)
	}
	in, out, both := strings.Cut(val, "/")
	pin, err := parsePrice(in)
	if err != nil {
		return fmt.Errorf("batch: price %q: %w", spec, err)
	}
	pout := pin
	if both {
		if pout, err = parsePrice(out); err != nil {
			return fmt.Errorf("batch: price %q: %w", spec, err)
		}
	}
	p[model] = Price{Input: pin, Output: pout}
	return nil
}

func parsePrice(s string) (float64, error) {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f > 1e6 {
		return 0, fmt.Errorf("%q is not a price in dollars per million tokens", s)
	}
	return f, nil
}

// LoadPrices reads a JSON price file, {"model": {"input": 0.42, "output":
// 0.84}}, into p, replacing the models it names. Unknown fields are errors.
func (p Prices) LoadPrices(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("batch: prices: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var m map[string]Price
	if err := dec.Decode(&m); err != nil {
		return fmt.Errorf("batch: prices %s: %w", path, err)
	}
	for model, pr := range m {
		for _, v := range []float64{pr.Input, pr.Output} {
			if v < 0 || v > 1e6 || math.IsNaN(v) {
				return fmt.Errorf("batch: prices %s: model %q: price %v out of range", path, model, v)
			}
		}
		p[model] = pr
	}
	return nil
}
