package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSimulateDelayMode(t *testing.T) {
	chart := filepath.Join(t.TempDir(), "d.svg")
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"simulate", "--duration", "6s", "--limit", "10/s burst 5", "--max-wait", "1s", "--chart", chart}, &out, &errOut); err != nil {
		t.Fatalf("simulate: %v\n%s", err, errOut.String())
	}
	for _, want := range []string{"delay mode with max wait 1s", "gcra+wait passed/denied/held", "14/26/14", "gcra delay mode: "} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "fixed_window") {
		t.Fatalf("a window algorithm in delay mode:\n%s", out.String())
	}
	if b, err := os.ReadFile(chart); err != nil || !bytes.Contains(b, []byte(`data-series="gcra+wait"`)) {
		t.Fatalf("chart: %v", err)
	}
	for _, args := range [][]string{
		{"simulate", "--max-wait", "1s", "--algorithms", "fixed_window"},
		{"simulate", "--max-wait", "-1s"},
	} {
		if err := run(context.Background(), args, &out, &out); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
