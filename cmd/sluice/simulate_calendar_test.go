package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestSimulateCalendar: `sluice simulate --scenario calendar` prints a
// month of local days in Berlin, with the 23-hour day and the resets at
// local midnight.
func TestSimulateCalendar(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"simulate", "--scenario", "calendar"}, &out, &errOut); err != nil {
		t.Fatalf("%v: %s", err, errOut.String())
	}
	for _, want := range []string{"scenario calendar", "1000/day in Europe/Berlin", "2026-03-29 00:00 CET   03-28 23:00     23", "2026-03-30 00:00 CEST   03-29 22:00", "came back at 01:00 CET local"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
