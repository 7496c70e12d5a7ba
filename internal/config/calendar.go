package config

import (
	"strings"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
)

// Calendar windows in serve policies: `timezone`, `reset_at` and
// `week_starts` turn a limit per day, week, month or year into one per
// local calendar window (sluice.Calendar), enforced by fixed_window.

// policyCalendar applies a policy's calendar fields to pol.Limit and
// settles its algorithm: fixed_window by default for a calendar limit,
// an error for any other.
func (v *validator) policyCalendar(path string, p *PolicySection, pol *Policy) {
	set := p.Timezone != "" || p.ResetAt != "" || p.WeekStarts != ""
	if set && pol.Limit.Rate > 0 {
		cal := pol.Limit.Calendar
		switch {
		case p.Timezone != "" && strings.Contains(p.Limit, " in "):
			v.addf(path+".timezone", "the limit %q names its time zone already; give it in one place", p.Limit)
			return
		case cal.IsZero() && pol.Limit.Period == 24*time.Hour:
			cal = sluice.Calendar{Unit: sluice.Day, Location: time.UTC}
		case cal.IsZero() && pol.Limit.Period == 7*24*time.Hour:
			cal = sluice.Calendar{Unit: sluice.Week, Location: time.UTC, FirstWeekday: time.Monday}
		case cal.IsZero():
			v.addf(path+".limit", "%s: a calendar window is per day, week, month or year", pol.Limit)
			return
		}
		if p.Timezone != "" {
			loc, err := sluice.LoadLocation(p.Timezone)
			if err != nil {
				v.addf(path+".timezone", "%s", strings.TrimPrefix(err.Error(), "sluice: "))
				return
			}
			cal.Location = loc
		}
		if p.ResetAt != "" {
			at, err := sluice.ParseClock(p.ResetAt)
			if err != nil {
				v.addf(path+".reset_at", "%s", strings.TrimPrefix(err.Error(), "sluice: "))
				return
			}
			cal.ResetAt = at
		}
		if p.WeekStarts != "" {
			if cal.Unit != sluice.Week {
				v.addf(path+".week_starts", "only a limit per week has a first day, not %s", pol.Limit)
				return
			}
			d, err := sluice.ParseWeekday(p.WeekStarts)
			if err != nil {
				v.addf(path+".week_starts", "%s", strings.TrimPrefix(err.Error(), "sluice: "))
				return
			}
			cal.FirstWeekday = d
		}
		pol.Limit = sluice.PerCalendar(pol.Limit.Rate, cal)
	}
	if pol.Limit.Calendar.IsZero() {
		return
	}
	switch {
	case p.Algorithm == "":
		pol.Algorithm = sluice.FixedWindow
	case pol.Algorithm != sluice.FixedWindow:
		v.addf(path+".algorithm", "a calendar limit (%s) is enforced by fixed_window, not %s", pol.Limit, pol.Algorithm)
	}
	if p.Burst > 0 {
		v.addf(path+".burst", "a calendar window admits its whole limit at once and takes no burst")
	}
}

// FitOverride fits an override's limit to its policy, for the config's
// overrides and the runtime ones (package overrides) alike: a policy per
// calendar window passes its calendar to an override per day or week
// that names none ("500/day" in a policy with timezone: Europe/Berlin
// resets at Berlin's midnight too), and only fixed_window can enforce an
// override that is a calendar limit; otherwise it returns the problem.
func FitOverride(pol *Policy, l sluice.Limit) (sluice.Limit, string) {
	if c := pol.Limit.Calendar; !c.IsZero() && l.Calendar.IsZero() && l.Burst == 0 {
		switch {
		case c.Unit == sluice.Day && l.Period == 24*time.Hour, c.Unit == sluice.Week && l.Period == 7*24*time.Hour:
			return sluice.PerCalendar(l.Rate, c), ""
		}
	}
	if !l.Calendar.IsZero() && pol.Algorithm != sluice.FixedWindow {
		return l, "policy " + pol.Name + " uses " + pol.Algorithm.String() + "; a calendar limit needs fixed_window"
	}
	if problem := algo.LogRateProblem(pol.Algorithm, l); problem != "" {
		return l, "policy " + pol.Name + ": " + problem
	}
	return l, ""
}
