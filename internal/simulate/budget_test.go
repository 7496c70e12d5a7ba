package simulate

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/pricing"
)

// TestBudgetScenario: over a simulated month the budget is never charged
// past itself (plus one reservation), no request passes between its
// exhaustion and the local first of the month, and the first one at that
// instant does, five hours after midnight UTC.
func TestBudgetScenario(t *testing.T) {
	s := BudgetScenarios()["budget"]
	res, err := RunBudget(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if res.MaxWindow > s.Budget+res.MaxCost || res.MaxWindow < s.Budget-res.MaxCost {
		t.Fatalf("a window was charged %s of %s", res.MaxWindow, s.Budget)
	}
	ny := s.Calendar.Location
	feb1 := time.Date(2027, 2, 1, 0, 0, 0, 0, ny)
	if !res.Resumed.Equal(feb1) {
		t.Fatalf("admitted again at %s, want %s (local midnight)", res.Resumed, feb1)
	}
	if got := res.Exhausted.In(ny); got.Month() != time.January || got.Day() != 21 {
		t.Fatalf("exhausted at %s", got)
	}
	var january, refusedJan int
	for _, d := range res.Days {
		if d.Day.Month() == time.January {
			january += d.Admitted
			refusedJan += d.Refused
		}
	}
	if spent := res.Cost * pricing.Micros(january); spent > s.Budget || s.Budget-spent > res.MaxCost {
		t.Fatalf("January spent %s of %s", spent, s.Budget)
	}
	if refusedJan == 0 {
		t.Fatal("nothing refused in January")
	}
	var buf bytes.Buffer
	if err := res.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2027-01-21", "2027-02-01", "admitted again: 2027-02-01 00:00:00 EST (2027-02-01 05:00:00 UTC)"} {
		if !strings.Contains(buf.String(), want) {
			t.Fatalf("no %q in\n%s", want, buf.String())
		}
	}
	bad := s
	bad.Days = 0
	if _, err := RunBudget(context.Background(), bad); err == nil {
		t.Fatal("0 days accepted")
	}
	bad = s
	bad.Calendar = sluice.Calendar{Unit: 9}
	if _, err := RunBudget(context.Background(), bad); err == nil {
		t.Fatal("a bad calendar accepted")
	}
}
