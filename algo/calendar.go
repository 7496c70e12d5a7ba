package algo

import (
	"time"

	"github.com/sluice-io/sluice"
)

// windowOf returns the FixedWindow window of l that holds now (Unix ns):
// Period-long and aligned to the Unix epoch, or, for a calendar limit, the
// calendar window of l.Calendar.
func windowOf(l sluice.Limit, now int64) (start, end int64) {
	if !l.Calendar.IsZero() {
		return l.Calendar.WindowNanos(now)
	}
	p := int64(l.Period)
	start = now - now%p
	return start, start + p
}

// MaxCalendarWindows bounds the windows CalendarBounds returns.
const MaxCalendarWindows = 8

// CalendarBounds returns the boundaries, in ascending Unix seconds, of the
// calendar windows of c that hold any instant of [now-skew, now+skew]
// (Unix ns): b[0] ≤ now-skew and now+skew < b[len(b)-1], unless that
// takes more than MaxCalendarWindows windows (a skew of days on daily
// windows), where the list stops. A store whose clock cannot read time zones
// (Redis Lua) picks among them the window [b[i], b[i+1]) that holds its
// own time; when its time lies outside [b[0], b[len-1]), the list was
// computed around a clock more than skew away from the store's, and the
// caller computes it again around the store's time. c must be valid.
func CalendarBounds(c sluice.Calendar, now int64, skew time.Duration) []int64 {
	lo, hi := now-int64(skew), now+int64(skew)
	s, e := c.WindowNanos(lo)
	b := make([]int64, 0, 4)
	b = append(b, s/1e9, e/1e9)
	for len(b) <= MaxCalendarWindows && e <= hi {
		_, e = c.WindowNanos(e)
		b = append(b, e/1e9)
	}
	return b
}
