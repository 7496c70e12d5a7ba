package simulate

import (
	"bytes"
	"context"
	"encoding/xml"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/fairqueue"
)

func runScenario(t *testing.T, name string) *ScenarioResult {
	t.Helper()
	res, err := RunScenario(context.Background(), Scenarios()[name])
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestScenarioFairness: the fairness scenario shows every light key's
// requests admitted within 1s, and the heavy key taking the rest of the
// 30 req/s.
func TestScenarioFairness(t *testing.T) {
	res := runScenario(t, "fairness")
	heavy, light := res.Flows[0], res.Flows[1]
	if light.MinKeyShare != 1 || light.MaxWait > time.Second {
		t.Fatalf("light keys: worst key %.2f admitted, max wait %s", light.MinKeyShare, light.MaxWait)
	}
	for b := 2; b < 19; b++ {
		if got := heavy.Admitted[b] + light.Admitted[b]; got < 29 || got > 31 {
			t.Errorf("t=%ds: %d admitted, want the capacity of 30", b, got)
		}
	}
	if heavy.Outcomes[fairqueue.Admitted] < 240 {
		t.Fatalf("heavy got %d, want the rest (~260)", heavy.Outcomes[fairqueue.Admitted])
	}
	var buf bytes.Buffer
	if err := res.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "light") || !strings.Contains(buf.String(), "100%") {
		t.Fatalf("table:\n%s", buf.String())
	}
}

// TestScenarioPriority: batch alone gets the whole capacity, both
// saturated share it 70/30, interactive alone gets all of it.
func TestScenarioPriority(t *testing.T) {
	res := runScenario(t, "priority")
	inter, batch := res.Flows[0], res.Flows[1]
	sum := func(f FlowResult, from, to int) int {
		n := 0
		for b := from; b < to; b++ {
			n += f.Admitted[b]
		}
		return n
	}
	if b := sum(batch, 1, 5); b < 390 || sum(inter, 1, 5) != 0 {
		t.Errorf("batch alone: %d in 4s, want ~400", b)
	}
	i, b := sum(inter, 6, 15), sum(batch, 6, 15)
	if share := float64(i) / float64(i+b); share < 0.67 || share > 0.73 {
		t.Errorf("both saturated: interactive %d, batch %d: share %.3f, want 0.70 ±0.03", i, b, share)
	}
	if i := sum(inter, 16, 20); i < 390 {
		t.Errorf("interactive alone: %d in 4s, want ~400", i)
	}
}

// TestScenarioSVG: the chart is well-formed XML with one line per flow.
func TestScenarioSVG(t *testing.T) {
	res := runScenario(t, "priority")
	var buf bytes.Buffer
	if err := res.WriteSVG(&buf); err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(&buf)
	lines := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			lines++
		}
	}
	if lines != 2 {
		t.Fatalf("%d polylines", lines)
	}
}

// TestScenarioBad: a scenario without flows or with absurd rates is
// refused, not run out of memory.
func TestScenarioBad(t *testing.T) {
	s := Scenarios()["fairness"]
	s.Flows = []Flow{{Name: "x", Keys: 1 << 30, RPS: 1e9}}
	if _, err := RunScenario(context.Background(), s); err == nil {
		t.Fatal("huge flow accepted")
	}
	s.Flows = nil
	if _, err := RunScenario(context.Background(), s); err == nil {
		t.Fatal("no flows accepted")
	}
}
