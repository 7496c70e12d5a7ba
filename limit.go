package sluice

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// Errors returned for bad input. They work with errors.Is; the wrapping error
// names the offending value.
var (
	// ErrInvalidLimit means a Limit or its textual form is malformed: zero,
	// negative, NaN, or too large to compute with.
	ErrInvalidLimit = errors.New("sluice: invalid limit")
	// ErrInvalidCost means a cost is negative, or zero where a charge is needed.
	ErrInvalidCost = errors.New("sluice: invalid cost")
	// ErrCostExceedsBurst means a request costs more than the limit can ever
	// admit at once, so retrying it is pointless.
	ErrCostExceedsBurst = errors.New("sluice: cost exceeds burst")
	// ErrInvalidRequest means a request lacks a key, an algorithm, or a lease
	// where one is required.
	ErrInvalidRequest = errors.New("sluice: invalid request")
	// ErrUnknownAlgorithm means an algorithm name or value is not one sluice knows.
	ErrUnknownAlgorithm = errors.New("sluice: unknown algorithm")
)

// maxPeriod bounds a limit's period so that every computation in
// nanoseconds, also as a double inside Redis Lua, stays exact.
const maxPeriod = 366 * 24 * time.Hour

// maxRate bounds Rate and Burst for the same reason.
const maxRate = 1 << 40

// Limit admits Rate events per Period, with room for a burst of Burst events
// at once. A token bucket of capacity Burst, refilled with Rate tokens every
// Period, is the model; window algorithms admit Rate events per window and
// ignore Burst.
//
// For example Limit{Rate: 10, Period: time.Second, Burst: 20} admits 20
// events at once, then one every 100ms.
//
// A Limit with a Calendar admits Rate events per calendar window (a local
// day, week, month or year in a time zone) and is enforced by the
// FixedWindow algorithm only; its Period must be Calendar.Unit.Period().
// PerCalendar builds one, and ParseLimit reads "5000/day in Europe/Berlin".
type Limit struct {
	// Rate is the number of events admitted per Period. It must be positive.
	Rate int64
	// Period is the span Rate refers to. It must be positive.
	Period time.Duration
	// Burst is the capacity: how many events may happen at once. Zero means Rate.
	Burst int64
	// Calendar, when set, makes the windows calendar windows in a time
	// zone rather than Period-long windows aligned to the Unix epoch.
	Calendar Calendar
	// Granularity is used by the SlidingWindowLog algorithm only, and
	// Request.Validate rejects it for any other. Zero, the default, keeps
	// the log exact: one entry per distinct admission instant. A positive
	// Granularity g stamps every admission (OpAllow and OpCharge) at the
	// end of the g-long slot, aligned to the Unix epoch, that holds it:
	// the admission time rounded up to a multiple of g. Admissions in one
	// slot share one entry, so a key keeps at most Period/g + 1 entries
	// whatever the rate, and each decision reads and writes that many.
	// Rounding up errs on the safe side: a unit counts from its true
	// admission until at least that time + Period (at most g longer), so
	// the log still admits at most Rate in any Period-long window of true
	// admission times; the cost is that the freed capacity comes back up
	// to g late, a utilisation at most g/Period lower. It must be a whole
	// number of milliseconds, positive, and at most Period.
	Granularity time.Duration
}

// PerSecond returns a Limit of rate events per second with a burst of rate.
func PerSecond(rate int64) Limit { return Limit{Rate: rate, Period: time.Second} }

// PerMinute returns a Limit of rate events per minute with a burst of rate.
func PerMinute(rate int64) Limit { return Limit{Rate: rate, Period: time.Minute} }

// PerHour returns a Limit of rate events per hour with a burst of rate.
func PerHour(rate int64) Limit { return Limit{Rate: rate, Period: time.Hour} }

// PerDay returns a Limit of rate events per day with a burst of rate.
func PerDay(rate int64) Limit { return Limit{Rate: rate, Period: 24 * time.Hour} }

// Capacity is the burst, or Rate when Burst is zero.
func (l Limit) Capacity() int64 {
	if l.Burst > 0 {
		return l.Burst
	}
	return l.Rate
}

// Validate reports whether l can be used. The error wraps ErrInvalidLimit.
func (l Limit) Validate() error {
	switch {
	case l.Rate <= 0:
		return fmt.Errorf("%w: rate %d must be positive", ErrInvalidLimit, l.Rate)
	case l.Rate > maxRate:
		return fmt.Errorf("%w: rate %d exceeds %d", ErrInvalidLimit, l.Rate, int64(maxRate))
	case l.Period <= 0:
		return fmt.Errorf("%w: period %s must be positive", ErrInvalidLimit, l.Period)
	case l.Period > maxPeriod:
		return fmt.Errorf("%w: period %s exceeds %s", ErrInvalidLimit, l.Period, maxPeriod)
	case l.Burst < 0:
		return fmt.Errorf("%w: burst %d must not be negative", ErrInvalidLimit, l.Burst)
	case l.Burst > maxRate:
		return fmt.Errorf("%w: burst %d exceeds %d", ErrInvalidLimit, l.Burst, int64(maxRate))
	}
	if err := l.validGranularity(); err != nil {
		return err
	}
	if !l.Calendar.IsZero() {
		if err := l.Calendar.Validate(); err != nil {
			return err
		}
		if l.Period != l.Calendar.Unit.Period() {
			return fmt.Errorf("%w: a calendar %s limit needs period %s, not %s", ErrInvalidLimit, l.Calendar.Unit, l.Calendar.Unit.Period(), l.Period)
		}
	}
	if l.Tau() > int64(maxPeriod)*16 {
		return fmt.Errorf("%w: burst %d at %s takes too long to refill", ErrInvalidLimit, l.Capacity(), l)
	}
	return nil
}

// validGranularity checks Granularity against the rules its doc states.
func (l Limit) validGranularity() error {
	g := l.Granularity
	switch {
	case g == 0:
		return nil
	case g < 0:
		return fmt.Errorf("%w: granularity %s must not be negative", ErrInvalidLimit, g)
	case g%time.Millisecond != 0:
		return fmt.Errorf("%w: granularity %s must be a whole number of milliseconds", ErrInvalidLimit, g)
	case g > l.Period:
		return fmt.Errorf("%w: granularity %s exceeds the period %s", ErrInvalidLimit, g, l.Period)
	case !l.Calendar.IsZero():
		return fmt.Errorf("%w: a calendar limit (%s) takes no granularity", ErrInvalidLimit, l)
	}
	return nil
}

// Interval is the time, in nanoseconds and rounded up, in which one event's
// worth of capacity comes back: Period / Rate.
func (l Limit) Interval() int64 { return l.CostInterval(1) }

// Tau is the refill time of the whole burst, in nanoseconds, for GCRA and
// the token bucket: Capacity × Interval, the interval rounded up as
// Interval rounds it, so that a full burst of single events (each taking
// one rounded Interval) fits it exactly. The burst's exact refill time
// rounded once (CostInterval(Capacity)) is a few nanoseconds shorter when
// the interval is not whole (7/s: 999,999,999+1 against 7 × 142,857,143),
// and the last event of a full burst was denied. It is capped at
// math.MaxInt64; Validate bounds it far below for a valid limit.
func (l Limit) Tau() int64 {
	c, iv := l.Capacity(), l.Interval()
	if c <= 0 || iv <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(c), uint64(iv))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo)
}

// CostInterval is the time, in nanoseconds and rounded up, in which cost
// events' worth of capacity comes back: cost·Period / Rate. It is computed in
// 128 bits, so it neither overflows nor drifts for valid limits; the rounding
// up makes a limiter err on the side of admitting less, by under a
// nanosecond per decision.
func (l Limit) CostInterval(cost int64) int64 {
	if l.Rate <= 0 || cost <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(cost), uint64(l.Period))
	if hi >= uint64(l.Rate) {
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, uint64(l.Rate))
	if r != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// String formats l the way ParseLimit reads it, for example "10/s",
// "100/min burst 20" or "5000/day in Europe/Berlin".
func (l Limit) String() string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(l.Rate, 10))
	b.WriteByte('/')
	if !l.Calendar.IsZero() {
		b.WriteString(l.Calendar.Unit.String())
		b.WriteByte(' ')
		b.WriteString(l.Calendar.String())
	} else {
		b.WriteString(formatPeriod(l.Period))
	}
	if l.Burst > 0 && l.Burst != l.Rate {
		b.WriteString(" burst ")
		b.WriteString(strconv.FormatInt(l.Burst, 10))
	}
	return b.String()
}

func formatPeriod(p time.Duration) string {
	for _, u := range []struct {
		name string
		d    time.Duration
	}{{"day", 24 * time.Hour}, {"h", time.Hour}, {"min", time.Minute}, {"s", time.Second}, {"ms", time.Millisecond}} {
		if p >= u.d && p%u.d == 0 {
			if n := p / u.d; n != 1 {
				return strconv.FormatInt(int64(n), 10) + u.name
			}
			return u.name
		}
	}
	return p.String()
}

var units = map[string]time.Duration{
	"ms": time.Millisecond, "millisecond": time.Millisecond, "milliseconds": time.Millisecond,
	"s": time.Second, "sec": time.Second, "second": time.Second, "seconds": time.Second,
	"m": time.Minute, "min": time.Minute, "minute": time.Minute, "minutes": time.Minute,
	"h": time.Hour, "hr": time.Hour, "hour": time.Hour, "hours": time.Hour,
	"d": 24 * time.Hour, "day": 24 * time.Hour, "days": 24 * time.Hour,
	"w": 7 * 24 * time.Hour, "week": 7 * 24 * time.Hour, "weeks": 7 * 24 * time.Hour,
}

// ParseLimit reads a limit such as "10/s", "100/min", "1000/h", "5000/day",
// "100/10s" or "10/s burst 30" (also written "10/s, burst=30").
//
// Calendar limits name a unit and, after "in", an IANA time zone:
// "5000/day in Europe/Berlin", "1M tokens/month in America/New_York",
// "100/week in UTC from sunday", "5000/day in Asia/Tokyo at 09:00". "at"
// sets the local reset time (default midnight) and "from" the first day of
// a week (default Monday). "month" and "year" are always calendar windows,
// in UTC when no zone is named; "day" and "week" without a zone are 24h and
// 7×24h windows aligned to the Unix epoch, as before.
//
// Rates may carry a k, M or G suffix (thousands, millions, billions) and a
// label: requests, tokens, calls or events. Errors wrap ErrInvalidLimit and
// quote the input.
func ParseLimit(s string) (Limit, error) {
	bad := func(format string, args ...any) (Limit, error) {
		return Limit{}, fmt.Errorf("%w %q: %s", ErrInvalidLimit, s, fmt.Sprintf(format, args...))
	}
	if len(s) > maxLimitText {
		return Limit{}, fmt.Errorf("%w: limit text of %d bytes is longer than %d", ErrInvalidLimit, len(s), maxLimitText)
	}
	spec := strings.TrimSpace(s)
	var burstText string
	if i := strings.Index(spec, "burst"); i >= 0 {
		burstText = strings.TrimSpace(strings.TrimLeft(spec[i+len("burst"):], " =:"))
		spec = strings.TrimRight(strings.TrimSpace(spec[:i]), " ,;")
		if burstText == "" {
			return bad("burst needs a number")
		}
	}
	rateText, periodText, ok := strings.Cut(spec, "/")
	if !ok {
		return bad("want RATE/PERIOD, for example 10/s or 100/min")
	}
	rate, err := parseRate(strings.TrimSpace(rateText))
	if err != nil {
		return bad("rate: %v", err)
	}
	// The period, then the calendar clauses: in ZONE, at HH:MM, from DAY.
	words := strings.Fields(periodText)
	n := 0
	for n < len(words) && !calendarWord[strings.ToLower(words[n])] {
		n++
	}
	periodText = strings.Join(words[:n], "")
	var cal Calendar
	calendar := n < len(words)
	if calendar {
		if cal, err = parseCalendar(words[n:]); err != nil {
			return bad("%v", err)
		}
	}
	i := 0
	for i < len(periodText) && periodText[i] >= '0' && periodText[i] <= '9' {
		i++
	}
	mult := int64(1)
	if i > 0 {
		mult, err = strconv.ParseInt(periodText[:i], 10, 64)
		if err != nil || mult <= 0 {
			return bad("period multiplier %q must be a positive integer", periodText[:i])
		}
	}
	unitText := strings.ToLower(periodText[i:])
	if u, ok := calendarUnits[unitText]; ok && (calendar || u == Month || u == Year) {
		if i > 0 {
			return bad("a calendar %s takes no multiplier %q", u, periodText[:i])
		}
		cal.Unit = u
		if u != Week {
			cal.FirstWeekday = 0
		}
		l := PerCalendar(rate, cal)
		if burstText != "" && burstText != strconv.FormatInt(rate, 10) {
			return bad("a calendar window admits its rate at once and takes no burst")
		}
		if err := l.Validate(); err != nil {
			return Limit{}, fmt.Errorf("%q: %w", s, err)
		}
		return l, nil
	}
	if calendar {
		return bad("calendar windows are a day, week, month or year, not %q", periodText)
	}
	unit, ok := units[unitText]
	if !ok {
		return bad("unknown unit %q; use ms, s, min, h, day, week, month or year", periodText[i:])
	}
	if mult > int64(maxPeriod/unit) {
		return bad("period %s%s is longer than %s", periodText[:i], periodText[i:], maxPeriod)
	}
	l := Limit{Rate: rate, Period: time.Duration(mult) * unit}
	if burstText != "" {
		if l.Burst, err = parseCount(burstText); err != nil {
			return bad("burst: %v", err)
		}
	}
	if err := l.Validate(); err != nil {
		return Limit{}, fmt.Errorf("%q: %w", s, err)
	}
	return l, nil
}

// maxLimitText bounds the text ParseLimit reads.
const maxLimitText = 256

var calendarWord = map[string]bool{"in": true, "at": true, "from": true}

var calendarUnits = map[string]CalendarUnit{
	"day": Day, "days": Day, "d": Day,
	"week": Week, "weeks": Week, "w": Week,
	"month": Month, "months": Month, "mo": Month,
	"year": Year, "years": Year, "y": Year, "yr": Year,
}

// parseCalendar reads the clauses "in ZONE", "at HH:MM[:SS]" and "from
// WEEKDAY", each at most once, in any order. Unit is left to the caller;
// FirstWeekday defaults to Monday.
func parseCalendar(words []string) (Calendar, error) {
	c := Calendar{FirstWeekday: time.Monday}
	seen := map[string]bool{}
	for len(words) > 0 {
		kw := strings.ToLower(words[0])
		if !calendarWord[kw] {
			return c, fmt.Errorf("unexpected %q; want in ZONE, at HH:MM or from WEEKDAY", words[0])
		}
		if seen[kw] {
			return c, fmt.Errorf("%q given twice", kw)
		}
		seen[kw] = true
		if len(words) < 2 {
			return c, fmt.Errorf("%q needs a value", kw)
		}
		v := words[1]
		words = words[2:]
		var err error
		switch kw {
		case "in":
			c.Location, err = LoadLocation(v)
		case "at":
			c.ResetAt, err = ParseClock(v)
		case "from":
			c.FirstWeekday, err = ParseWeekday(v)
		}
		if err != nil {
			return c, err
		}
	}
	return c, nil
}

// ParseClock reads a local wall time "HH:MM" or "HH:MM:SS", from 00:00 to
// 23:59:59, as the duration after midnight, for Calendar.ResetAt. Errors
// wrap ErrInvalidCalendar.
func ParseClock(s string) (time.Duration, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return 0, fmt.Errorf("%w: reset time %q: want HH:MM", ErrInvalidCalendar, s)
	}
	var v [3]int
	for i, p := range parts {
		if len(p) != 2 || p[0] < '0' || p[0] > '9' || p[1] < '0' || p[1] > '9' {
			return 0, fmt.Errorf("%w: reset time %q: want HH:MM", ErrInvalidCalendar, s)
		}
		v[i] = int(p[0]-'0')*10 + int(p[1]-'0')
	}
	if v[0] > 23 || v[1] > 59 || v[2] > 59 {
		return 0, fmt.Errorf("%w: reset time %q is not a time of day", ErrInvalidCalendar, s)
	}
	return time.Duration(v[0])*time.Hour + time.Duration(v[1])*time.Minute + time.Duration(v[2])*time.Second, nil
}

// ParseWeekday reads a weekday in English, such as "monday" or "Mon".
// Errors wrap ErrInvalidCalendar.
func ParseWeekday(s string) (time.Weekday, error) {
	l := strings.ToLower(s)
	for d := time.Sunday; d <= time.Saturday; d++ {
		name := strings.ToLower(d.String())
		if l == name || (len(l) == 3 && l == name[:3]) {
			return d, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown weekday %q", ErrInvalidCalendar, s)
}

// parseRate reads a rate: a count with an optional k, M or G suffix, and
// an optional label such as "tokens".
func parseRate(s string) (int64, error) {
	num, label, _ := strings.Cut(s, " ")
	if label = strings.ToLower(strings.TrimSpace(label)); label != "" && !rateLabels[label] {
		return 0, fmt.Errorf("unknown label %q; use requests, tokens, calls or events", label)
	}
	mult := int64(1)
	if k := len(num); k > 1 {
		switch num[k-1] {
		case 'k', 'K':
			mult = 1e3
		case 'M':
			mult = 1e6
		case 'G':
			mult = 1e9
		}
		if mult > 1 {
			num = num[:k-1]
		}
	}
	n, err := parseCount(num)
	if err != nil {
		return 0, err
	}
	if n > maxRate/mult {
		return 0, fmt.Errorf("%q exceeds %d", s, int64(maxRate))
	}
	return n * mult, nil
}

var rateLabels = map[string]bool{
	"request": true, "requests": true, "req": true, "token": true, "tokens": true,
	"call": true, "calls": true, "event": true, "events": true,
}

// parseCount reads a positive integer. It rejects fractions, NaN, infinities
// and values that overflow, naming the text.
func parseCount(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		var numErr *strconv.NumError
		if errors.As(err, &numErr) && errors.Is(numErr.Err, strconv.ErrRange) {
			return 0, fmt.Errorf("%q overflows", s)
		}
		return 0, fmt.Errorf("%q is not a whole number", s)
	}
	if n <= 0 {
		return 0, fmt.Errorf("%q must be positive", s)
	}
	if n > maxRate {
		return 0, fmt.Errorf("%q exceeds %d", s, int64(maxRate))
	}
	return n, nil
}
