package aitoken

import (
	"math"
	"testing"
)

func TestOpenAIUsage(t *testing.T) {
	for _, v := range []struct {
		p, c, o, r int64
		want       Usage
	}{
		{100, 40, 50, 20, Usage{60, 40, 30, 20}},
		{100, 0, 50, 0, Usage{100, 0, 50, 0}},
		{-5, 10, -1, 3, Usage{0, 0, 0, 0}}, // negative wholes, parts capped
		{10, 50, 5, 9, Usage{0, 10, 0, 5}},
	} {
		if got := OpenAIUsage(v.p, v.c, v.o, v.r); got != v.want {
			t.Errorf("OpenAIUsage(%d,%d,%d,%d) = %v, want %v", v.p, v.c, v.o, v.r, got, v.want)
		}
	}
	u := Usage{math.MaxInt64, 1, math.MaxInt64, 1}
	if u.Total() != math.MaxInt64 || u.Prompt() != math.MaxInt64 {
		t.Errorf("Total did not saturate: %d", u.Total())
	}
}

func TestWeights(t *testing.T) {
	w := Weights{1000, 100, 1000, 1000}
	u := Usage{60, 40, 30, 20}
	if got := w.Apply(u); got != 60+4+30+20 {
		t.Errorf("Apply = %d, want 114", got)
	}
	if got := w.Apply(u, Input, CachedInput); got != 64 {
		t.Errorf("input kinds = %d, want 64", got)
	}
	if got := w.Apply(Usage{0, 1}); got != 1 {
		t.Errorf("0.1 of a token rounds up to %d, want 1", got)
	}
	if got := (Weights{MaxWeight, MaxWeight, MaxWeight, MaxWeight}).Apply(Usage{math.MaxInt64, math.MaxInt64, math.MaxInt64, math.MaxInt64}); got != math.MaxInt64 {
		t.Errorf("Apply did not saturate: %d", got)
	}
	if got := (Weights{-5, 1000}).Apply(Usage{10, -10}); got != 0 {
		t.Errorf("negative weight or count: %d", got)
	}
	if got := DefaultWeights.Apply(u); got != u.Total() {
		t.Errorf("default weights: %d, want %d", got, u.Total())
	}
	for s, want := range map[string]int64{"1": 1000, "0.1": 100, "1.25": 1250, "0": 0, "1000": MaxWeight, "0.001": 1, "2.": 2000} {
		if got, err := ParseWeight(s); err != nil || got != want {
			t.Errorf("ParseWeight(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "-1", "1000.001", "0.0001", "1e3", "NaN", "inf", "1,5", ".5", "99999999999999999999"} {
		if _, err := ParseWeight(s); err == nil {
			t.Errorf("ParseWeight(%q) accepted", s)
		}
	}
	for _, k := range []Kind{Input, CachedInput, Output, Reasoning} {
		if p, err := ParseKind(k.String()); err != nil || p != k {
			t.Errorf("ParseKind(%q) = %v, %v", k, p, err)
		}
	}
	if _, err := ParseKind("cached"); err == nil {
		t.Error("ParseKind(cached) accepted")
	}
}
