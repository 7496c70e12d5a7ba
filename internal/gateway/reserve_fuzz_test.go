package gateway

import (
	"encoding/json"
	"math"
	"math/big"
	"testing"
)

// bigReservation is reservation's model in exact arithmetic.
func bigReservation(prompt, budget, choices int64) *big.Int {
	r := new(big.Int).Mul(big.NewInt(max(budget, 0)), big.NewInt(max(choices, 1)))
	r.Add(r, big.NewInt(max(prompt, 0)))
	if r.Cmp(big.NewInt(math.MaxInt64)) > 0 {
		r.SetInt64(math.MaxInt64)
	}
	return r
}

// FuzzReservation checks the reservation arithmetic against math/big: it
// never wraps (it equals the exact value, saturated at MaxInt64), and it is
// monotone in every input.
func FuzzReservation(f *testing.F) {
	for _, s := range [][4]int64{
		{0, 0, 0, 0}, {7, 1, 1, 1}, {1, math.MaxInt64, 1, 1}, {5, 1 << 62, 2, 1}, {5, 1 << 62, 4, 3},
		{math.MaxInt64, 1, 1, 1}, {3, math.MaxInt64/128 + 1, 128, 1}, {-1, -1, -1, -1}, {math.MinInt64, 2, math.MinInt64, 5},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	f.Fuzz(func(t *testing.T, prompt, budget, choices, delta int64) {
		got := reservation(prompt, budget, choices)
		if want := bigReservation(prompt, budget, choices); want.Cmp(big.NewInt(got)) != 0 {
			t.Fatalf("reservation(%d, %d, %d) = %d, want %s", prompt, budget, choices, got, want)
		}
		if got < 0 {
			t.Fatalf("reservation(%d, %d, %d) = %d < 0", prompt, budget, choices, got)
		}
		d := max(delta, 0)
		up := func(v int64) int64 { // v+d, saturated
			if v > math.MaxInt64-d {
				return math.MaxInt64
			}
			return v + d
		}
		for i, more := range []int64{
			reservation(up(prompt), budget, choices),
			reservation(prompt, up(budget), choices),
			reservation(prompt, budget, up(choices)),
		} {
			if more < got {
				t.Fatalf("not monotone in input %d: %d then %d after +%d", i, got, more, d)
			}
		}
	})
}

// FuzzParseBody: a body the gateway accepts reads the same to an exact,
// case-sensitive decoder (a Python upstream's) as to encoding/json's
// case-insensitive struct decoding (a Go upstream's) and to the gateway,
// and its reservation covers the largest budget times the most choices,
// exactly (math/big), saturated at MaxInt64.
func FuzzParseBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`,
		`{"model":"m","max_tokens":9223372036854775807,"n":2}`,
		`{"model":"m","max_tokens":5,"MAX_TOKENS":100000}`,
		`{"model":"m","max_tokens":5,"max_tokens":100000}`,
		`{"model":"m","max\u005ftokens":5,"max_completion_tokens":7,"best_of":3,"n":2}`,
		`{"model":"m","max_output_tokens":4611686018427387904,"n":128}`,
		`{"model":"m","n":129}`,
		`{"model":"m","x":{"MAX_TOKENS":1},"y":["N",{"n":3}],"max_tokens":4}`,
		`{"model":"m","\u004dAX_TOKENS":1,"max_tokens":4}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := parseBody(body, epChat)
		if err != nil {
			return
		}
		type view struct {
			model           string
			budget, choices int64
		}
		var exact map[string]json.RawMessage
		if json.Unmarshal(body, &exact) != nil {
			t.Fatalf("accepted a body that is not a JSON object: %q", body)
		}
		e := view{choices: 1}
		_ = json.Unmarshal(exact["model"], &e.model)
		for _, name := range []string{"max_tokens", "max_completion_tokens", "max_output_tokens"} {
			var v int64
			if json.Unmarshal(exact[name], &v) == nil {
				e.budget = max(e.budget, v)
			}
		}
		for _, name := range []string{"n", "best_of"} {
			var v int64
			if json.Unmarshal(exact[name], &v) == nil {
				e.choices = max(e.choices, v)
			}
		}
		var loose struct {
			Model               string `json:"model"`
			MaxTokens           *int64 `json:"max_tokens"`
			MaxCompletionTokens *int64 `json:"max_completion_tokens"`
			MaxOutputTokens     *int64 `json:"max_output_tokens"`
			N                   *int64 `json:"n"`
			BestOf              *int64 `json:"best_of"`
		}
		if json.Unmarshal(body, &loose) != nil {
			t.Fatalf("accepted a body encoding/json refuses: %q", body)
		}
		l := view{model: loose.Model, choices: 1}
		for _, v := range []*int64{loose.MaxTokens, loose.MaxCompletionTokens, loose.MaxOutputTokens} {
			if v != nil {
				l.budget = max(l.budget, *v)
			}
		}
		for _, v := range []*int64{loose.N, loose.BestOf} {
			if v != nil {
				l.choices = max(l.choices, *v)
			}
		}
		g := view{p.model, p.budget, p.choices}
		if g != e || g != l {
			t.Fatalf("gateway %+v, exact %+v, case-insensitive %+v: %q", g, e, l, body)
		}
		want := bigReservation(p.promptEst, p.budget, p.choices)
		if got := reservation(p.promptEst, p.budget, p.choices); want.Cmp(big.NewInt(got)) != 0 {
			t.Fatalf("reservation %d, want %s: %q", got, want, body)
		}
	})
}
