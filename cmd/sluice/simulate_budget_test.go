package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestSimulateBudget: `sluice simulate --scenario budget` prints a
// simulated month of a dollar budget, day by day, and its reset at local
// midnight.
func TestSimulateBudget(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"simulate", "--scenario", "budget"}, &out, &errOut); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	for _, want := range []string{"scenario budget", "2027-01-21", "window spent $", "admitted again: 2027-02-01 00:00:00 EST (2027-02-01 05:00:00 UTC)"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
}
