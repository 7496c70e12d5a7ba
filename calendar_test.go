package sluice_test

import (
	"errors"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // the same zone rules on every machine

	"github.com/sluice-io/sluice"
)

func mustZone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := sluice.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// TestCalendarWindow checks windows across DST changes, month lengths,
// leap days, the turn of the year and zones far from UTC. Times are
// written in the zone's local time with their offset, so that each row
// says which wall clock and which instant it means.
func TestCalendarWindow(t *testing.T) {
	const f = "2006-01-02 15:04 -0700"
	cases := []struct {
		zone       string
		cal        sluice.Calendar
		at         string
		start, end string
		hours      float64
	}{
		// Europe/Berlin springs forward on 2026-03-29 02:00 → 03:00: a 23 h day.
		{"Europe/Berlin", sluice.Calendar{Unit: sluice.Day}, "2026-03-29 12:00 +0200", "2026-03-29 00:00 +0100", "2026-03-30 00:00 +0200", 23},
		{"Europe/Berlin", sluice.Calendar{Unit: sluice.Day}, "2026-03-29 01:59 +0100", "2026-03-29 00:00 +0100", "2026-03-30 00:00 +0200", 23},
		// ... and falls back on 2026-10-25 03:00 → 02:00: a 25 h day.
		{"Europe/Berlin", sluice.Calendar{Unit: sluice.Day}, "2026-10-25 02:30 +0100", "2026-10-25 00:00 +0200", "2026-10-26 00:00 +0100", 25},
		{"Europe/Berlin", sluice.Calendar{Unit: sluice.Day}, "2026-10-25 23:59 +0100", "2026-10-25 00:00 +0200", "2026-10-26 00:00 +0100", 25},
		// A reset time the clocks skip starts the window when they jump.
		{"Europe/Berlin", sluice.Calendar{Unit: sluice.Day, ResetAt: 150 * time.Minute}, "2026-03-29 03:00 +0200", "2026-03-29 03:00 +0200", "2026-03-30 02:30 +0200", 23.5},
		{"Europe/Berlin", sluice.Calendar{Unit: sluice.Day, ResetAt: 150 * time.Minute}, "2026-03-29 01:00 +0100", "2026-03-28 02:30 +0100", "2026-03-29 03:00 +0200", 23.5},
		// A reset time the clocks repeat starts at its first occurrence.
		{"Europe/Berlin", sluice.Calendar{Unit: sluice.Day, ResetAt: 150 * time.Minute}, "2026-10-25 02:40 +0200", "2026-10-25 02:30 +0200", "2026-10-26 02:30 +0100", 25},
		// America/New_York: 2026-03-08 02:00 → 03:00 and 2026-11-01 02:00 → 01:00.
		{"America/New_York", sluice.Calendar{Unit: sluice.Day}, "2026-03-08 23:59 -0400", "2026-03-08 00:00 -0500", "2026-03-09 00:00 -0400", 23},
		{"America/New_York", sluice.Calendar{Unit: sluice.Day}, "2026-11-01 01:30 -0500", "2026-11-01 00:00 -0400", "2026-11-02 00:00 -0500", 25},
		{"America/New_York", sluice.Calendar{Unit: sluice.Month}, "2026-03-31 23:59 -0400", "2026-03-01 00:00 -0500", "2026-04-01 00:00 -0400", 31*24 - 1},
		{"America/New_York", sluice.Calendar{Unit: sluice.Month}, "2026-11-15 12:00 -0500", "2026-11-01 00:00 -0400", "2026-12-01 00:00 -0500", 30*24 + 1},
		// Month lengths, leap days and the turn of the year, in UTC.
		{"UTC", sluice.Calendar{Unit: sluice.Month}, "2026-02-28 23:59 +0000", "2026-02-01 00:00 +0000", "2026-03-01 00:00 +0000", 28 * 24},
		{"UTC", sluice.Calendar{Unit: sluice.Month}, "2028-02-29 12:00 +0000", "2028-02-01 00:00 +0000", "2028-03-01 00:00 +0000", 29 * 24},
		{"UTC", sluice.Calendar{Unit: sluice.Day}, "2028-02-29 00:00 +0000", "2028-02-29 00:00 +0000", "2028-03-01 00:00 +0000", 24},
		{"UTC", sluice.Calendar{Unit: sluice.Year}, "2026-12-31 23:59 +0000", "2026-01-01 00:00 +0000", "2027-01-01 00:00 +0000", 365 * 24},
		{"UTC", sluice.Calendar{Unit: sluice.Year}, "2028-07-01 00:00 +0000", "2028-01-01 00:00 +0000", "2029-01-01 00:00 +0000", 366 * 24},
		{"Europe/Berlin", sluice.Calendar{Unit: sluice.Year}, "2027-01-01 00:00 +0100", "2027-01-01 00:00 +0100", "2028-01-01 00:00 +0100", 365 * 24},
		// Weeks: Monday by default in the text form, any first day here.
		{"UTC", sluice.Calendar{Unit: sluice.Week, FirstWeekday: time.Monday}, "2026-12-02 10:00 +0000", "2026-11-30 00:00 +0000", "2026-12-07 00:00 +0000", 7 * 24},
		{"UTC", sluice.Calendar{Unit: sluice.Week, FirstWeekday: time.Sunday}, "2026-12-05 23:00 +0000", "2026-11-29 00:00 +0000", "2026-12-06 00:00 +0000", 7 * 24},
		{"Europe/Berlin", sluice.Calendar{Unit: sluice.Week, FirstWeekday: time.Monday}, "2026-03-29 12:00 +0200", "2026-03-23 00:00 +0100", "2026-03-30 00:00 +0200", 7*24 - 1},
		// Pacific/Kiritimati is UTC+14: its day starts at 10:00 UTC the day before.
		{"Pacific/Kiritimati", sluice.Calendar{Unit: sluice.Day}, "2027-01-01 00:00 +1400", "2027-01-01 00:00 +1400", "2027-01-02 00:00 +1400", 24},
		{"Pacific/Kiritimati", sluice.Calendar{Unit: sluice.Year}, "2026-12-31 09:59 +0000", "2026-01-01 00:00 +1400", "2027-01-01 00:00 +1400", 365 * 24},
		// Kiritimati skipped 1994-12-31 entirely: no window holds that date.
		{"Pacific/Kiritimati", sluice.Calendar{Unit: sluice.Day}, "1995-01-01 00:00 +1400", "1995-01-01 00:00 +1400", "1995-01-02 00:00 +1400", 24},
		{"Pacific/Kiritimati", sluice.Calendar{Unit: sluice.Day}, "1994-12-30 23:59 -1000", "1994-12-30 00:00 -1000", "1995-01-01 00:00 +1400", 0},
		// America/Santiago falls back at 24:00 → 23:00: its wall clock first
		// reads the next midnight an hour later, so the day lasts 25 h.
		{"America/Santiago", sluice.Calendar{Unit: sluice.Day}, "2026-04-04 23:30 -0400", "2026-04-04 00:00 -0300", "2026-04-05 00:00 -0400", 25},
		// ... and springs forward at 24:00 → 01:00: the day starts at 01:00.
		{"America/Santiago", sluice.Calendar{Unit: sluice.Day}, "2026-09-06 01:00 -0300", "2026-09-06 01:00 -0300", "2026-09-07 00:00 -0300", 23},
		{"America/Santiago", sluice.Calendar{Unit: sluice.Day}, "2026-09-05 23:59 -0400", "2026-09-05 00:00 -0400", "2026-09-06 01:00 -0300", 24},
	}
	for _, c := range cases {
		c.cal.Location = mustZone(t, c.zone)
		at, err := time.Parse(f, c.at)
		if err != nil {
			t.Fatal(err)
		}
		start, end := c.cal.Window(at)
		wantStart, _ := time.Parse(f, c.start)
		wantEnd, _ := time.Parse(f, c.end)
		if !start.Equal(wantStart) || !end.Equal(wantEnd) {
			t.Errorf("%s %s at %s: window [%s, %s), want [%s, %s)", c.zone, c.cal.Unit, c.at,
				start.In(c.cal.Location).Format(f), end.In(c.cal.Location).Format(f), c.start, c.end)
			continue
		}
		if c.hours > 0 && end.Sub(start) != time.Duration(c.hours*float64(time.Hour)) {
			t.Errorf("%s %s at %s: window lasts %s, want %vh", c.zone, c.cal.Unit, c.at, end.Sub(start), c.hours)
		}
		// The boundaries themselves: start is in the window, end is not.
		if s, _ := c.cal.Window(start); !s.Equal(start) {
			t.Errorf("%s: window of its own start %s begins at %s", c.zone, start, s)
		}
		if s, _ := c.cal.Window(end.Add(-time.Nanosecond)); !s.Equal(start) {
			t.Errorf("%s: window of end-1ns begins at %s", c.zone, s)
		}
		if s, _ := c.cal.Window(end); !s.Equal(end) {
			t.Errorf("%s: window of end %s begins at %s", c.zone, end, s)
		}
	}
}

// TestCalendarWindowsTile walks two years of windows in several zones and
// units: each window starts where the last ended, lies within its unit's
// bounds, and starts at the local reset time.
func TestCalendarWindowsTile(t *testing.T) {
	for _, zone := range []string{"Europe/Berlin", "America/New_York", "Pacific/Kiritimati", "Australia/Lord_Howe", "America/Santiago", "Asia/Kathmandu", "UTC"} {
		for _, u := range []sluice.CalendarUnit{sluice.Day, sluice.Week, sluice.Month, sluice.Year} {
			for _, reset := range []time.Duration{0, 150 * time.Minute, 23*time.Hour + 59*time.Minute} {
				cal := sluice.Calendar{Unit: u, Location: mustZone(t, zone), ResetAt: reset, FirstWeekday: time.Wednesday}
				from := time.Date(2025, 12, 20, 0, 0, 0, 0, time.UTC)
				_, end := cal.Window(from)
				for end.Before(from.AddDate(2, 0, 0)) {
					s, e := cal.Window(end)
					if !s.Equal(end) || !e.After(s) {
						t.Fatalf("%s %s at %s: window [%s, %s) does not follow %s", zone, u, reset, s, e, end)
					}
					if l := e.Sub(s); l < u.Period()-u.Period()/10-3*time.Hour || l > u.Period()+3*time.Hour {
						t.Fatalf("%s %s: window [%s, %s) lasts %s", zone, u, s, e, l)
					}
					lt := s.In(cal.Location)
					wall := time.Duration(lt.Hour())*time.Hour + time.Duration(lt.Minute())*time.Minute + time.Duration(lt.Second())*time.Second
					if zs, _ := lt.ZoneBounds(); wall != reset && !zs.Equal(s) {
						t.Fatalf("%s %s: window starts at local %s, not at %s nor when the clocks jump", zone, u, lt, reset)
					}
					end = e
				}
			}
		}
	}
}

func TestParseCalendarLimit(t *testing.T) {
	berlin, ny := mustZone(t, "Europe/Berlin"), mustZone(t, "America/New_York")
	good := []struct {
		in   string
		want sluice.Limit
	}{
		{"5000/day in Europe/Berlin", sluice.PerCalendar(5000, sluice.Calendar{Unit: sluice.Day, Location: berlin})},
		{"1M tokens/month in America/New_York", sluice.PerCalendar(1_000_000, sluice.Calendar{Unit: sluice.Month, Location: ny})},
		{"1000/month", sluice.PerCalendar(1000, sluice.Calendar{Unit: sluice.Month, Location: time.UTC})},
		{"10k requests/year in UTC", sluice.PerCalendar(10_000, sluice.Calendar{Unit: sluice.Year, Location: time.UTC})},
		{"100/week in UTC from sunday", sluice.PerCalendar(100, sluice.Calendar{Unit: sluice.Week, Location: time.UTC, FirstWeekday: time.Sunday})},
		{"100/week in Europe/Berlin", sluice.PerCalendar(100, sluice.Calendar{Unit: sluice.Week, Location: berlin, FirstWeekday: time.Monday})},
		{"5000/day in Europe/Berlin at 09:30", sluice.PerCalendar(5000, sluice.Calendar{Unit: sluice.Day, Location: berlin, ResetAt: 9*time.Hour + 30*time.Minute})},
		{"5000/day at 09:00", sluice.PerCalendar(5000, sluice.Calendar{Unit: sluice.Day, Location: time.UTC, ResetAt: 9 * time.Hour})},
		{"7/week", sluice.Limit{Rate: 7, Period: 7 * 24 * time.Hour}},
	}
	for _, c := range good {
		got, err := sluice.ParseLimit(c.in)
		if err != nil || got.String() != c.want.String() || got.Rate != c.want.Rate || got.Period != c.want.Period ||
			got.Calendar.Unit != c.want.Calendar.Unit || got.Calendar.Zone() != c.want.Calendar.Zone() ||
			got.Calendar.ResetAt != c.want.Calendar.ResetAt || got.Calendar.FirstWeekday != c.want.Calendar.FirstWeekday {
			t.Errorf("ParseLimit(%q) = %v (%+v), %v; want %v", c.in, got, got.Calendar, err, c.want)
			continue
		}
		if back, err := sluice.ParseLimit(got.String()); err != nil || back.String() != got.String() {
			t.Errorf("round trip of %q via %q = %v, %v", c.in, got.String(), back, err)
		}
	}
	bad := []struct{ in, mention string }{
		{"5000/day in Local", "Local"},
		{"5000/day in Mars/Olympus", "Mars/Olympus"},
		{"5000/day in ../../etc/passwd", "passwd"},
		{"5000/day in " + strings.Repeat("A", 100), "too long"},
		{"5000/day in Europe/Berlin at 24:00", "24:00"},
		{"5000/day in Europe/Berlin at 9:00", "9:00"},
		{"5000/day in Europe/Berlin in UTC", "twice"},
		{"5000/day in", "needs a value"},
		{"5000/h in UTC", "day, week, month or year"},
		{"5000/2day in UTC", "multiplier"},
		{"5000/week from funday", "funday"},
		{"5000/day in UTC burst 9000", "burst"},
		{"5000 dollars/day in UTC", "dollars"},
		{"99999999999M/month", "exceeds"},
		{"5000/day in \xff\xfe", "time zone"},
		{strings.Repeat("1", 300) + "/day", "longer"},
	}
	for _, c := range bad {
		_, err := sluice.ParseLimit(c.in)
		if !errors.Is(err, sluice.ErrInvalidLimit) {
			t.Errorf("ParseLimit(%q) error %v, want ErrInvalidLimit", c.in, err)
			continue
		}
		if !strings.Contains(err.Error(), c.mention) {
			t.Errorf("ParseLimit(%q) error %q does not mention %s", c.in, err, c.mention)
		}
	}
}

func TestCalendarLimitNeedsFixedWindow(t *testing.T) {
	l := sluice.PerCalendar(10, sluice.Calendar{Unit: sluice.Day})
	for _, a := range sluice.Algorithms() {
		req := sluice.Request{Key: "k", Algorithm: a, Limit: l, Cost: 1, Lease: "x"}
		err := req.Validate(sluice.OpAllow)
		if (a == sluice.FixedWindow) != (err == nil) {
			t.Errorf("%s: Validate = %v", a, err)
		}
	}
	bad := l
	bad.Period = time.Hour
	if err := bad.Validate(); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("calendar day with period 1h: %v", err)
	}
	bad = l
	bad.Calendar.ResetAt = 1500 * time.Millisecond
	if err := bad.Validate(); !errors.Is(err, sluice.ErrInvalidCalendar) {
		t.Errorf("reset at 1.5s: %v", err)
	}
}
