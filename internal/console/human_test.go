package console

import (
	"testing"
	"time"

	"github.com/sluice-io/sluice"
)

func TestHumanLimit(t *testing.T) {
	berlin, err := sluice.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		a    sluice.Algorithm
		l    sluice.Limit
		want string
	}{
		{sluice.GCRA, sluice.PerDay(20000), "20000 per day"},
		{sluice.GCRA, sluice.Limit{Rate: 100, Period: 10 * time.Minute, Burst: 20}, "100 per 10 minutes, burst 20"},
		{sluice.TokenBucket, sluice.PerSecond(10), "10 per second"},
		{sluice.FixedWindow, sluice.Limit{Rate: 3, Period: 90 * time.Second}, "3 per 90 seconds"},
		{sluice.FixedWindow, sluice.Limit{Rate: 3, Period: 1500 * time.Microsecond}, "3 per 2ms"},
		{sluice.Concurrency, sluice.Limit{Rate: 10, Period: time.Minute}, "10 in flight"},
		{sluice.FixedWindow, sluice.PerCalendar(5000, sluice.Calendar{Unit: sluice.Day, Location: berlin}), "5000 per day (calendar days in Europe/Berlin)"},
	} {
		if got := HumanLimit(c.a, c.l); got != c.want {
			t.Errorf("HumanLimit(%v, %v) = %q, want %q", c.a, c.l, got, c.want)
		}
	}
}

func TestHumanDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                 "0s",
		350 * time.Millisecond:            "350ms",
		90 * time.Second:                  "1m30s",
		time.Minute:                       "1m",
		1440 * time.Minute:                "1d",
		2*time.Hour + 5*time.Minute + 9e9: "2h5m",
		26*time.Hour + 30*time.Minute:     "1d2h",
		time.Hour + 30*time.Second:        "1h",
		1500 * time.Millisecond:           "1.5s",
		1401 * time.Millisecond:           "1.5s",
		2 * time.Second:                   "2s",
		10500 * time.Millisecond:          "11s",
	} {
		if got := HumanDuration(d); got != want {
			t.Errorf("HumanDuration(%s) = %q, want %q", d, got, want)
		}
	}
}
