package config

import (
	"errors"
	"strings"
	"testing"
	"time"
	_ "time/tzdata"

	"github.com/sluice-io/sluice"
)

func TestCalendarPolicies(t *testing.T) {
	cfg, err := Parse("cal.yaml", []byte(`
policies:
  daily:
    limit: 5000/day
    timezone: Europe/Berlin
  morning:
    limit: 100/day
    timezone: America/New_York
    reset_at: "09:00"
  weekly:
    algorithm: fixed_window
    limit: 700/week
    timezone: Asia/Tokyo
    week_starts: sunday
  monthly:
    limit: 1M tokens/month in America/New_York
  monthly_utc:
    limit: 1000/month
    timezone: Pacific/Kiritimati
  rolling:
    limit: 5000/day
  quota: {limit: 5000/day, timezone: Europe/Berlin}
  monthly9: {limit: 1M/month in America/New_York, reset_at: "09:00"}
tiers:
  pro:
    policies: [daily, monthly]
keys:
  - name: big
    hash: "`+strings.Repeat("ab", 32)+`"
    tier: pro
    overrides: {daily: 9000/day}
overrides:
  - {key: "user:1", policy: daily, limit: 50/day}
  - {key: "user:1", policy: monthly, limit: 10/day in UTC}
`))
	if err != nil {
		t.Fatal(err)
	}
	check := func(name, wantLimit string, wantAlgo sluice.Algorithm) {
		t.Helper()
		p := cfg.Policies[name]
		if p == nil || p.Limit.String() != wantLimit || p.Algorithm != wantAlgo {
			t.Errorf("policy %s = %+v, want %s by %s", name, p, wantLimit, wantAlgo)
		}
	}
	check("daily", "5000/day in Europe/Berlin", sluice.FixedWindow)
	check("morning", "100/day in America/New_York at 09:00", sluice.FixedWindow)
	check("weekly", "700/week in Asia/Tokyo from sunday", sluice.FixedWindow)
	check("monthly", "1000000/month in America/New_York", sluice.FixedWindow)
	check("monthly_utc", "1000/month in Pacific/Kiritimati", sluice.FixedWindow)
	check("rolling", "5000/day", sluice.GCRA)
	check("quota", "5000/day in Europe/Berlin", sluice.FixedWindow)
	check("monthly9", "1000000/month in America/New_York at 09:00", sluice.FixedWindow)
	// Overrides per day take their policy's calendar.
	key := cfg.Keys[strings.Repeat("ab", 32)]
	if got := cfg.LimitFor(cfg.Policies["daily"], "key:x", key); got.String() != "9000/day in Europe/Berlin" {
		t.Errorf("key override = %s", got)
	}
	if got := cfg.LimitFor(cfg.Policies["daily"], "user:1", nil); got.String() != "50/day in Europe/Berlin" {
		t.Errorf("identity override = %s", got)
	}
	if got := cfg.LimitFor(cfg.Policies["monthly"], "user:1", nil); got.String() != "10/day in UTC" {
		t.Errorf("identity override of a month by a day = %s", got)
	}
	// The policy's calendar is usable as it stands.
	start, end := cfg.Policies["morning"].Limit.Calendar.Window(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	if end.Sub(start) != 25*time.Hour {
		t.Errorf("morning window on the fall-back day: [%s, %s)", start, end)
	}
}

func TestBadCalendarPolicies(t *testing.T) {
	cases := []struct{ yaml, want string }{
		{"limit: 10/min\n    timezone: UTC", "policies.p.limit: 10/min: a calendar window is per day, week, month or year"},
		{"limit: 10/day\n    timezone: Mars/Base", `policies.p.timezone: invalid limit: calendar: unknown time zone "Mars/Base"`},
		{"limit: 10/day\n    timezone: Local", `policies.p.timezone: invalid limit: calendar: time zone "Local" depends on the machine`},
		{"limit: 10/day in UTC\n    timezone: Europe/Berlin", "policies.p.timezone: the limit \"10/day in UTC\" names its time zone already"},
		{"limit: 10/day\n    reset_at: \"25:00\"", `policies.p.reset_at: invalid limit: calendar: reset time "25:00" is not a time of day`},
		{"limit: 10/day\n    week_starts: sunday", "policies.p.week_starts: only a limit per week has a first day"},
		{"limit: 10/week\n    week_starts: someday", `policies.p.week_starts: invalid limit: calendar: unknown weekday "someday"`},
		{"limit: 10/day\n    timezone: UTC\n    algorithm: gcra", "policies.p.algorithm: a calendar limit (10/day in UTC) is enforced by fixed_window, not gcra"},
		{"limit: 10/month\n    burst: 20", "policies.p.burst: a calendar window admits its whole limit at once"},
	}
	for _, c := range cases {
		_, err := Parse("bad.yaml", []byte("policies:\n  p:\n    "+c.yaml+"\n"))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q:\n got %v\nwant %s", c.yaml, err, c.want)
		}
	}
	_, err := Parse("bad.yaml", []byte("policies:\n  p:\n    limit: 10/min\noverrides:\n  - {key: a, policy: p, limit: 10/month}\n"))
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "overrides[0].limit: policy p uses gcra; a calendar limit needs fixed_window") {
		t.Errorf("calendar override of a gcra policy: %v", err)
	}
}
