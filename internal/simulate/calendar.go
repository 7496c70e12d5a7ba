package simulate

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
)

// CalendarScenario is a limit per calendar window in a time zone, against
// steady traffic, side by side with the same rate per UTC day (the fixed
// window of Period 24h aligned to the Unix epoch, which is what a "daily"
// limit without a zone resets on). `sluice simulate --scenario calendar`
// replays one over a simulated month on a virtual clock.
type CalendarScenario struct {
	// Name and Description head the table.
	Name, Description string
	// Limit is a calendar limit; the comparison enforces Limit.Rate per
	// UTC day.
	Limit sluice.Limit
	// Start is when the traffic starts; it offers PerHour requests an
	// hour, evenly spaced, for Days days.
	Start   time.Time
	Days    int
	PerHour int
}

// CalendarDay is one calendar window of a calendar scenario.
type CalendarDay struct {
	// Start and End bound the window (End is the next window's Start).
	Start, End time.Time
	// Offered counts the window's requests; Admitted those the calendar
	// limit admitted, and UTCAdmitted those the UTC-day limit admitted
	// in the same span.
	Offered, Admitted, UTCAdmitted int
	// Exhausted is the window's first refusal, zero if none.
	Exhausted time.Time
	// RetryAfter is that refusal's: the time to End.
	RetryAfter time.Duration
}

// CalendarResult is what a calendar scenario admitted, window by window.
type CalendarResult struct {
	Scenario CalendarScenario
	Windows  []CalendarDay
	// UTCResets are the instants at which the UTC-day limit admitted again
	// after a refusal.
	UTCResets []time.Time
}

// CalendarScenarios lists the built-in calendar scenarios by name.
func CalendarScenarios() map[string]CalendarScenario {
	berlin, _ := sluice.LoadLocation("Europe/Berlin")
	c := CalendarScenario{
		Name: "calendar",
		Description: "1000 requests per local day in Europe/Berlin against 60 an hour, through March 2026: " +
			"each day is spent after 1000 minutes (16:40; 17:40 on March 29, a 23-hour day) and comes back at local midnight " +
			"(23:00 UTC, 22:00 UTC from March 29 on); the same rate per UTC day comes back at 01:00 or 02:00 local",
		Limit: sluice.PerCalendar(1000, sluice.Calendar{Unit: sluice.Day, Location: berlin}),
		Start: time.Date(2026, 3, 1, 0, 0, 0, 0, berlin),
		Days:  31, PerHour: 60,
	}
	return map[string]CalendarScenario{c.Name: c}
}

// RunCalendar replays s.
func RunCalendar(ctx context.Context, s CalendarScenario) (*CalendarResult, error) {
	if s.Days <= 0 || s.PerHour <= 0 || s.Days*24*s.PerHour > maxBudgetArrivals {
		return nil, fmt.Errorf("%w: %d days at %d an hour: want 1 to %d requests", ErrBadPattern, s.Days, s.PerHour, maxBudgetArrivals)
	}
	if err := s.Limit.Validate(); err != nil || s.Limit.Calendar.IsZero() {
		return nil, fmt.Errorf("%w: %s is not a calendar limit (%v)", ErrBadPattern, s.Limit, err)
	}
	clk := clock.NewFake(s.Start)
	st, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		return nil, fmt.Errorf("simulate: %w", err)
	}
	defer st.Close()
	cal := sluice.Request{Key: "calendar", Algorithm: sluice.FixedWindow, Limit: s.Limit, Cost: 1}
	utc := sluice.Request{Key: "utc", Algorithm: sluice.FixedWindow, Limit: sluice.PerDay(s.Limit.Rate), Cost: 1}
	res := &CalendarResult{Scenario: s}
	step := time.Hour / time.Duration(s.PerHour)
	end := s.Start.AddDate(0, 0, s.Days)
	var w *CalendarDay
	utcDenied := false
	for t := s.Start; t.Before(end); t = t.Add(step) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		clk.Set(t)
		if w == nil || !t.Before(w.End) {
			start, wend := s.Limit.Calendar.Window(t)
			res.Windows = append(res.Windows, CalendarDay{Start: start, End: wend})
			w = &res.Windows[len(res.Windows)-1]
		}
		w.Offered++
		d, err := st.Apply(ctx, sluice.OpAllow, cal)
		if err != nil {
			return nil, fmt.Errorf("simulate: %w", err)
		}
		if d.Allowed {
			w.Admitted++
		} else if w.Exhausted.IsZero() {
			w.Exhausted, w.RetryAfter = t, d.RetryAfter
		}
		u, err := st.Apply(ctx, sluice.OpAllow, utc)
		if err != nil {
			return nil, fmt.Errorf("simulate: %w", err)
		}
		if u.Allowed {
			w.UTCAdmitted++
			if utcDenied {
				res.UTCResets = append(res.UTCResets, t)
			}
		}
		utcDenied = !u.Allowed
	}
	return res, nil
}

// WriteTable prints the scenario and a row per calendar window: its local
// start and its start in UTC, its length, what each limit admitted, and
// when the window was spent and how long its Retry-After said to wait.
func (r *CalendarResult) WriteTable(w io.Writer) error {
	s := r.Scenario
	loc := s.Limit.Calendar.Location
	if loc == nil {
		loc = time.UTC
	}
	fmt.Fprintf(w, "scenario %s: %s\n", s.Name, s.Description)
	fmt.Fprintf(w, "limit %s (fixed_window on calendar windows) against %d/day per UTC day (fixed_window, epoch-aligned)\n\n", s.Limit, s.Limit.Rate)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "window (local)\tstarts (UTC)\thours\toffered\tadmitted\tspent at\tretry after\tper UTC day\t")
	for _, d := range r.Windows {
		spent, retry := "-", "-"
		if !d.Exhausted.IsZero() {
			spent, retry = d.Exhausted.In(loc).Format("15:04"), d.RetryAfter.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%g\t%d\t%d\t%s\t%s\t%d\t\n", d.Start.In(loc).Format("2006-01-02 15:04 MST"), d.Start.UTC().Format("01-02 15:04"),
			d.End.Sub(d.Start).Hours(), d.Offered, d.Admitted, spent, retry, d.UTCAdmitted)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.UTCResets) > 0 {
		fmt.Fprintf(w, "\nthe UTC-day limit came back at %s local, not at local midnight\n", r.UTCResets[0].In(loc).Format("15:04 MST"))
	}
	return nil
}
