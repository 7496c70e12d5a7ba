package redisstore

// Calendar windows in Lua, which knows no time zones.
//
// A calendar limit's windows (local days, weeks, months, years; see
// sluice.Calendar) are computed in Go, where the zone rules are, but the
// decision is made against Redis TIME like every other: Go sends the
// boundaries of the windows that hold any instant within calendarSkew of
// its own clock (algo.CalendarBounds, whole Unix seconds, usually two or
// three), and the script picks the one that holds Redis's time. When none
// does, because the client's clock is more than calendarSkew off Redis's,
// the script writes nothing and replies with Redis's time, and the store
// computes the boundaries around that time and asks once more. The client
// clock thus only chooses which boundaries to send: it never moves one,
// and a window resets when Redis's clock reaches the local boundary.

import (
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
)

// calendarFile is the Lua of calendar windows, ALGOS[calendarID].
const calendarFile = "calendar.lua"

// calendarID is the scripts' number for a calendar window, clear of
// sluice.Algorithm's values.
const calendarID = "16"

// calendarSkew is how far from the client's clock the boundaries sent
// reach. A client clock off by more costs one more round trip per call,
// never a wrong window.
const calendarSkew = 15 * time.Minute

// of returns the script for one-algorithm batches of req's kind.
func (s *scripts) of(req *sluice.Request) *rueidis.Lua {
	if !req.Limit.Calendar.IsZero() {
		return s.calendar
	}
	return s.single[req.Algorithm]
}

// appendCalendarArgs appends the ARGV of a calendar window request: as
// appendArgs, with the boundaries around hint (Unix ns) in the lease slot.
func appendCalendarArgs(args []string, req *sluice.Request, hint int64) []string {
	l := req.Limit
	var b strings.Builder
	for i, t := range algo.CalendarBounds(l.Calendar, hint, calendarSkew) {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatInt(t, 10))
	}
	eff := max(req.Cost, 1)
	return append(args,
		calendarID,
		strconv.FormatInt(int64(l.Period), 10),
		"0",
		strconv.FormatInt(l.Rate, 10),
		"0",
		// a refund naming its charge's window: ReservedAhead, negated
		// (calendar.lua)
		strconv.FormatInt(-max(int64(req.ReservedAhead), 0), 10),
		"0",
		strconv.FormatInt(eff, 10),
		strconv.FormatInt(req.Cost, 10),
		b.String(),
	)
}

// calendarMiss reports a script's reply that no calendar window sent
// holds Redis's time, and that time in Unix ns.
func calendarMiss(vals []int64, err error) (int64, bool) {
	if err != nil || len(vals) != 3 || vals[0] != -2 {
		return 0, false
	}
	return vals[1]*int64(time.Second) + vals[2], true
}

// decideCalendar builds the Decision of a calendar window from the reply:
// the count, the whole seconds from Redis's second to the window's end and
// Redis's nanoseconds within its second.
func decideCalendar(req *sluice.Request, r reply) sluice.Decision {
	l := req.Limit
	count, left := r.x, r.y*int64(time.Second)-r.z
	d := sluice.Decision{Limit: l, Allowed: r.ok, Remaining: l.Rate - count}
	if !r.ok {
		d.RetryAfter = dur(left)
		d.Remaining = max(0, d.Remaining)
		d.ResetAfter = dur(left)
	} else if count > 0 {
		d.ResetAfter = dur(left)
	}
	return d
}
