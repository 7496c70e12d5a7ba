package console

import (
	"strconv"
	"strings"
	"time"

	"github.com/sluice-io/sluice"
)

// HumanLimit writes a limit for people: "20000 per day", "100 per 10
// minutes, burst 20", "5000 per day (calendar days in Europe/Berlin)"; a
// concurrency limit is "10 in flight".
func HumanLimit(a sluice.Algorithm, l sluice.Limit) string {
	if a == sluice.Concurrency {
		return strconv.FormatInt(l.Rate, 10) + " in flight"
	}
	var b strings.Builder
	b.WriteString(strconv.FormatInt(l.Rate, 10))
	b.WriteString(" per ")
	if !l.Calendar.IsZero() {
		b.WriteString(l.Calendar.Unit.String())
		b.WriteString(" (calendar ")
		b.WriteString(l.Calendar.Unit.String())
		b.WriteString("s in ")
		b.WriteString(l.Calendar.Zone())
		b.WriteString(")")
	} else {
		b.WriteString(HumanPeriod(l.Period))
	}
	if l.Burst > 0 && l.Burst != l.Rate {
		b.WriteString(", burst ")
		b.WriteString(strconv.FormatInt(l.Burst, 10))
	}
	return b.String()
}

// periodUnits are the units of HumanPeriod, longest first.
var periodUnits = []struct {
	one, many string
	d         time.Duration
}{
	{"week", "weeks", 7 * 24 * time.Hour}, {"day", "days", 24 * time.Hour}, {"hour", "hours", time.Hour},
	{"minute", "minutes", time.Minute}, {"second", "seconds", time.Second}, {"millisecond", "milliseconds", time.Millisecond},
}

// HumanPeriod writes a limit's period: "day", "10 minutes", "second";
// one that no unit divides is a duration, as HumanDuration writes it.
func HumanPeriod(p time.Duration) string {
	for _, u := range periodUnits {
		if p >= u.d && p%u.d == 0 {
			if n := int64(p / u.d); n != 1 {
				return strconv.FormatInt(n, 10) + " " + u.many
			}
			return u.one
		}
	}
	return HumanDuration(p)
}

// HumanDuration writes a wait for people, in its two largest units:
// "350ms", "1.5s", "1m30s", "2h5m", "3d4h" (rounded up).
func HumanDuration(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	if d < time.Second {
		return strconv.FormatInt(int64((d+time.Millisecond-1)/time.Millisecond), 10) + "ms"
	}
	if d < 10*time.Second {
		tenths := int64((d + 100*time.Millisecond - 1) / (100 * time.Millisecond))
		if tenths%10 == 0 {
			return strconv.FormatInt(tenths/10, 10) + "s"
		}
		return strconv.FormatInt(tenths/10, 10) + "." + strconv.FormatInt(tenths%10, 10) + "s"
	}
	d = (d + time.Second - 1).Truncate(time.Second)
	parts := []struct {
		name string
		d    time.Duration
	}{{"d", 24 * time.Hour}, {"h", time.Hour}, {"m", time.Minute}, {"s", time.Second}}
	var b strings.Builder
	n := 0
	for _, p := range parts {
		if q := d / p.d; q > 0 || n > 0 {
			if n == 2 {
				break
			}
			if q > 0 {
				b.WriteString(strconv.FormatInt(int64(q), 10))
				b.WriteString(p.name)
			}
			d -= q * p.d
			n++
		}
	}
	return b.String()
}
