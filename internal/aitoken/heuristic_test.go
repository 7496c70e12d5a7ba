package aitoken

import (
	"sort"
	"testing"
)

// heuristicFloor is the bound docs/gateway.md states for the heuristic:
// on every text of the golden corpus of at least 20 tokens (prose, code,
// CJK, emoji, long words, base64, whitespace runs, random text) it counts
// at least this share of the tokens cl100k_base and o200k_base count
// (the stand-ins for a provider's own tokenizer).
const heuristicFloor = 0.5

// TestHeuristicBound measures the heuristic against the golden corpus
// and holds it to heuristicFloor; -v prints the worst texts.
func TestHeuristicBound(t *testing.T) {
	type worst struct {
		ratio float64
		enc   string
		kind  string
		text  string
	}
	var all []worst
	for _, g := range readGolden(t) {
		h := Count(g.Text)
		for enc, want := range map[string]int64{"cl100k_base": g.CL100K, "o200k_base": g.O200K} {
			if want < 20 {
				continue
			}
			all = append(all, worst{float64(h) / float64(want), enc, g.Kind, g.Text})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].ratio < all[j].ratio })
	for _, w := range all[:min(8, len(all))] {
		t.Logf("%.2f %s %s %.40q", w.ratio, w.enc, w.kind, w.text)
	}
	if all[0].ratio < heuristicFloor {
		t.Errorf("heuristic counts %.2f of %s's tokens of a %s text, below the stated %.2f", all[0].ratio, all[0].enc, all[0].kind, heuristicFloor)
	}
}
