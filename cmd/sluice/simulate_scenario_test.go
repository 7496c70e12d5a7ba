package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSimulateScenario: `sluice simulate --scenario fairness` prints the
// per-flow table and writes the chart; an unknown scenario names the valid
// ones.
func TestSimulateScenario(t *testing.T) {
	chart := filepath.Join(t.TempDir(), "fair.svg")
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"simulate", "--scenario", "fairness", "--chart", chart}, &out, &errOut); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	for _, want := range []string{"scenario fairness", "heavy", "light", "worst key ok", "chart written"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
	if b, err := os.ReadFile(chart); err != nil || !bytes.Contains(b, []byte(`data-flow="light"`)) {
		t.Fatalf("chart: %v", err)
	}
	err := run(context.Background(), []string{"simulate", "--scenario", "nope"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "fairness, priority") {
		t.Fatalf("unknown scenario: %v", err)
	}
}
