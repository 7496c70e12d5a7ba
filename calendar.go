package sluice

// Calendar windows: a limit per local day, week, month or year.
//
// A window starts at the first instant whose local wall clock, in the
// calendar's time zone, reads the unit's first day at ResetAt (midnight by
// default), and ends where the next one starts. Windows thus follow the
// zone's rules: a day is 23 hours long when the clocks spring forward and 25
// when they fall back, a month is 28 to 31 days, and a wall time the clocks
// skip (02:30 on a spring-forward night, or midnight in zones that change at
// midnight) starts the window at the instant the clocks jump. A local date
// a zone skipped entirely (Pacific/Apia's 2011-12-30) has no window.
//
// Every boundary is a whole Unix second: zone offsets are whole seconds and
// ResetAt is too. Redis scripts rely on it (see package redisstore).

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// CalendarUnit is the length of a calendar window.
type CalendarUnit uint8

// The calendar units. The zero value means no calendar.
const (
	// Day windows start every local day at ResetAt.
	Day CalendarUnit = iota + 1
	// Week windows start on Calendar.FirstWeekday at ResetAt.
	Week
	// Month windows start on the first day of each month at ResetAt.
	Month
	// Year windows start on January 1 at ResetAt.
	Year
)

var unitNames = [...]string{Day: "day", Week: "week", Month: "month", Year: "year"}

// String returns the unit's name, such as "month".
func (u CalendarUnit) String() string {
	if u >= Day && u <= Year {
		return unitNames[u]
	}
	return fmt.Sprintf("unit(%d)", u)
}

// Period is the nominal Limit.Period of a calendar limit of unit u: the
// longest the window can be, in whole days: 24h, 7×24h, 31×24h and
// 366×24h. Windows themselves come from the calendar (a local day may last
// 23 or 25 hours); Period only keeps Limit's rate arithmetic, such as
// Limit.Interval, meaningful and conservative.
func (u CalendarUnit) Period() time.Duration {
	switch u {
	case Day:
		return 24 * time.Hour
	case Week:
		return 7 * 24 * time.Hour
	case Month:
		return 31 * 24 * time.Hour
	case Year:
		return 366 * 24 * time.Hour
	}
	return 0
}

// ErrInvalidCalendar means a Calendar is malformed: an unknown unit or
// weekday, a ResetAt outside [0, 24h) or not whole seconds, or an unknown
// time zone. It wraps ErrInvalidLimit.
var ErrInvalidCalendar = fmt.Errorf("%w: calendar", ErrInvalidLimit)

// Calendar describes calendar windows in a time zone. The zero Calendar
// (Unit 0) means none: the limit's windows are Period long and aligned to
// the Unix epoch. A Calendar is comparable; two Calendars are equal when
// they hold the same *time.Location pointer, so load a zone once and reuse
// it.
//
// For example Calendar{Unit: Day, Location: berlin} starts a window at
// every local midnight in Europe/Berlin, and Calendar{Unit: Week,
// FirstWeekday: time.Monday, ResetAt: 9 * time.Hour} every Monday at 09:00
// UTC.
type Calendar struct {
	// Unit is the window's length: Day, Week, Month or Year.
	Unit CalendarUnit
	// Location is the time zone of the wall clock; nil means UTC. Load it
	// with LoadLocation (time.LoadLocation minus "Local").
	Location *time.Location
	// ResetAt is the local wall time at which windows start, after
	// midnight: 0 (midnight) up to 23:59:59, in whole seconds.
	ResetAt time.Duration
	// FirstWeekday is the day on which Week windows start. Its zero value
	// is time.Sunday; ParseLimit and the configuration files default to
	// time.Monday (ISO 8601). Other units ignore it.
	FirstWeekday time.Weekday
}

// IsZero reports whether c is no calendar.
func (c Calendar) IsZero() bool { return c.Unit == 0 }

// Validate reports whether c can be used. The error wraps ErrInvalidCalendar.
func (c Calendar) Validate() error {
	switch {
	case c.Unit < Day || c.Unit > Year:
		return fmt.Errorf("%w: unknown unit %d", ErrInvalidCalendar, c.Unit)
	case c.ResetAt < 0 || c.ResetAt >= 24*time.Hour:
		return fmt.Errorf("%w: reset time %s must be in [00:00, 24:00)", ErrInvalidCalendar, c.ResetAt)
	case c.ResetAt%time.Second != 0:
		return fmt.Errorf("%w: reset time %s must be whole seconds", ErrInvalidCalendar, c.ResetAt)
	case c.FirstWeekday < time.Sunday || c.FirstWeekday > time.Saturday:
		return fmt.Errorf("%w: unknown weekday %d", ErrInvalidCalendar, c.FirstWeekday)
	}
	return nil
}

// Zone is the name of c's time zone, "UTC" when Location is nil.
func (c Calendar) Zone() string { return c.loc().String() }

func (c Calendar) loc() *time.Location {
	if c.Location == nil {
		return time.UTC
	}
	return c.Location
}

// String formats c the way ParseLimit reads it after the unit, for
// example "in Europe/Berlin at 09:00 from sunday".
func (c Calendar) String() string {
	var b strings.Builder
	b.WriteString("in ")
	b.WriteString(c.Zone())
	if c.ResetAt != 0 {
		h, m, s := splitClock(c.ResetAt)
		fmt.Fprintf(&b, " at %02d:%02d", h, m)
		if s != 0 {
			fmt.Fprintf(&b, ":%02d", s)
		}
	}
	if c.Unit == Week && c.FirstWeekday != time.Monday {
		b.WriteString(" from ")
		b.WriteString(strings.ToLower(c.FirstWeekday.String()))
	}
	return b.String()
}

func splitClock(d time.Duration) (h, m, s int) {
	sec := int(d / time.Second)
	return sec / 3600, sec / 60 % 60, sec % 60
}

// Window returns the calendar window that holds t: start ≤ t < end. Both
// are whole Unix seconds. c must be valid.
//
// For example, for a Day calendar in Europe/Berlin, the window of
// 2026-03-29 12:00 CEST is [2026-03-28 23:00 UTC, 2026-03-29 22:00 UTC): 23
// hours, the clocks sprang forward that night.
func (c Calendar) Window(t time.Time) (start, end time.Time) {
	s, e := c.window(t.Unix())
	return time.Unix(s, 0), time.Unix(e, 0)
}

// WindowNanos is Window on Unix nanoseconds: start ≤ now < end.
func (c Calendar) WindowNanos(now int64) (start, end int64) {
	sec := now / 1e9
	if now%1e9 < 0 {
		sec--
	}
	s, e := c.window(sec)
	return s * 1e9, e * 1e9
}

// window finds the window of the Unix second t.
func (c Calendar) window(t int64) (start, end int64) {
	lt := time.Unix(t, 0).In(c.loc())
	y, m, d := lt.Date()
	switch c.Unit {
	case Week:
		d -= (int(lt.Weekday()) - int(c.FirstWeekday) + 7) % 7
	case Month:
		d = 1
	case Year:
		m, d = time.January, 1
	}
	k := 0 // the anchor is k units after y-m-d
	// The anchor's boundary is at most one unit off t's local date: one
	// back when t is before ResetAt, one on when the clocks fell back over
	// a boundary. The loops are bounded for odd zones all the same.
	// Each boundary is computed once: it walks the zone's rules.
	start = c.boundary(y, m, d, k)
	for i := 0; i < 4 && start > t; i++ {
		k--
		start = c.boundary(y, m, d, k)
	}
	end = c.boundary(y, m, d, k+1)
	for i := 0; i < 4 && end <= t; i++ {
		k++
		start, end = end, c.boundary(y, m, d, k+1)
	}
	return start, end
}

// boundary is the start of the window k units after the local date y-m-d.
func (c Calendar) boundary(y int, m time.Month, d, k int) int64 {
	switch c.Unit {
	case Day:
		d += k
	case Week:
		d += 7 * k
	case Month:
		m += time.Month(k)
	case Year:
		y += k
	}
	return c.at(y, m, d)
}

// at returns the first Unix second whose local wall clock reads the date
// y-m-d (normalised as time.Date does) at ResetAt or later: the wall time
// itself, its first occurrence when the clocks fell back over it, or the
// instant the clocks jumped over it.
func (c Calendar) at(y int, m time.Month, d int) int64 {
	h, mi, s := splitClock(c.ResetAt)
	w := time.Date(y, m, d, h, mi, s, 0, time.UTC).Unix() // the wall time, read as UTC
	loc := c.loc()
	// Offsets lie within ±16h (tzdata's extremes are -15:56 and +15:13
	// local mean times), so the instants that show w lie in [w-16h, w+16h].
	// Walk the zone periods there: each with offset off shows w at w-off
	// if that lies inside it; a jump forward from off0 to off1 at T skips
	// the wall times [T+off0, T+off1).
	const span = 16 * 3600
	best := int64(math.MaxInt64)
	t := w - span
	prevOff, first := 0, true
	for i := 0; i < 16 && t <= w+span; i++ {
		lt := time.Unix(t, 0).In(loc)
		_, off := lt.Zone()
		_, zend := lt.ZoneBounds()
		end := int64(math.MaxInt64)
		if !zend.IsZero() {
			end = zend.Unix()
		}
		if cand := w - int64(off); cand >= t && cand < end {
			best = min(best, cand)
		}
		if !first && int64(prevOff) < int64(off) && t+int64(prevOff) <= w && w < t+int64(off) {
			best = min(best, t)
		}
		if end == math.MaxInt64 || end <= t {
			break
		}
		prevOff, first, t = off, false, end
	}
	if best == math.MaxInt64 {
		// Unreachable with tzdata's rules; read w as UTC rather than fail.
		return w
	}
	return best
}

// LoadLocation loads an IANA time zone such as "Europe/Berlin" for a
// Calendar. Unlike time.LoadLocation it refuses "Local" and "", whose
// meaning depends on the machine, and names longer than 64 bytes. "UTC"
// is time.UTC. Errors wrap ErrInvalidCalendar. Programs that must not
// depend on the system's tzdata import time/tzdata (cmd/sluice does).
func LoadLocation(name string) (*time.Location, error) {
	switch {
	case name == "" || name == "Local":
		return nil, fmt.Errorf("%w: time zone %q depends on the machine; name an IANA zone such as Europe/Berlin or UTC", ErrInvalidCalendar, name)
	case len(name) > 64:
		return nil, fmt.Errorf("%w: time zone name of %d bytes is too long", ErrInvalidCalendar, len(name))
	case name == "UTC":
		return time.UTC, nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("%w: unknown time zone %q (%v)", ErrInvalidCalendar, name, err)
	}
	return loc, nil
}

// PerCalendar returns a Limit of rate events per calendar window of c, with
// Period set to c.Unit.Period(). Enforce it with the FixedWindow algorithm.
// For example PerCalendar(5000, Calendar{Unit: Day, Location: berlin}) is
// ParseLimit("5000/day in Europe/Berlin").
func PerCalendar(rate int64, c Calendar) Limit {
	return Limit{Rate: rate, Period: c.Unit.Period(), Calendar: c}
}
