package simulate

import (
	"context"
	"strings"
	"testing"
	"time"
	_ "time/tzdata"
)

// The calendar scenario: every local day of March 2026 in Berlin admits
// exactly its 1000, each window starts at local midnight (23 hours long on
// March 29), a refusal's Retry-After reaches exactly to it, and the UTC-day
// comparison comes back an hour or two after local midnight.
func TestCalendarScenario(t *testing.T) {
	s := CalendarScenarios()["calendar"]
	res, err := RunCalendar(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	loc := s.Limit.Calendar.Location
	if len(res.Windows) != 31 {
		t.Fatalf("%d windows, want 31", len(res.Windows))
	}
	for i, w := range res.Windows {
		day := time.Date(2026, 3, 1+i, 0, 0, 0, 0, loc)
		if !w.Start.Equal(day) || !w.End.Equal(day.AddDate(0, 0, 1)) {
			t.Fatalf("window %d: [%s, %s), want local midnight %s", i, w.Start, w.End, day)
		}
		wantHours := 24.0
		if i == 28 {
			wantHours = 23
		}
		if h := w.End.Sub(w.Start).Hours(); h != wantHours {
			t.Fatalf("%s lasts %gh, want %g", day.Format(time.DateOnly), h, wantHours)
		}
		if w.Admitted != 1000 || w.Offered != int(wantHours*60) {
			t.Fatalf("%s: offered %d, admitted %d; want %g·60 and 1000", day.Format(time.DateOnly), w.Offered, w.Admitted, wantHours)
		}
		if w.Exhausted.IsZero() || !w.Exhausted.Add(w.RetryAfter).Equal(w.End) {
			t.Fatalf("%s: spent at %s, retry after %s: does not reach the window's end %s", day.Format(time.DateOnly), w.Exhausted, w.RetryAfter, w.End)
		}
	}
	for _, r := range res.UTCResets {
		if lt := r.In(loc); lt.Hour() != 1 && lt.Hour() != 2 || lt.Minute() != 0 || r.UTC().Hour() != 0 {
			t.Fatalf("the UTC-day limit came back at %s", lt)
		}
	}
	if len(res.UTCResets) < 29 {
		t.Fatalf("the UTC-day limit came back %d times", len(res.UTCResets))
	}
	var b strings.Builder
	if err := res.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2026-03-29 00:00 CET", "03-28 23:00", "  23  ", "2026-03-30 00:00 CEST", "03-29 22:00", "came back at 01:00 CET"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

func TestCalendarScenarioBad(t *testing.T) {
	s := CalendarScenarios()["calendar"]
	s.Days = 0
	if _, err := RunCalendar(context.Background(), s); err == nil {
		t.Error("0 days accepted")
	}
	s = CalendarScenarios()["calendar"]
	s.Limit.Calendar.Unit = 0
	if _, err := RunCalendar(context.Background(), s); err == nil {
		t.Error("a limit without calendar accepted")
	}
}
