package simulate

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/pricing"
	"github.com/sluice-io/sluice/memstore"
)

// BudgetScenario is a dollar budget per calendar window, spent by steady
// traffic on one model, with the gateway's accounting: each request
// reserves its maximum cost (prompt at the input price plus max_tokens at
// the output price) and, once answered, is settled to the cost of its
// usage. `sluice simulate --scenario budget` replays one over a simulated
// month, on a virtual clock and the memory store.
type BudgetScenario struct {
	// Name and Description head the table.
	Name, Description string
	// Budget is spent per window of Calendar (FixedWindow enforces it).
	Budget   pricing.Micros
	Calendar sluice.Calendar
	// Price is the model's; Model names it in the table.
	Model string
	Price pricing.Price
	// Start is when the traffic starts; it offers PerHour requests an hour
	// for Days days.
	Start   time.Time
	Days    int
	PerHour int
	// Each request has Prompt tokens (Cached of them from the prompt
	// cache), asks for MaxTokens and gets Completion.
	Prompt, Cached, MaxTokens, Completion int64
}

// BudgetDay is one local day of a budget scenario.
type BudgetDay struct {
	// Day is the local date, at midnight in the calendar's zone.
	Day time.Time
	// Offered, Admitted and Refused count the day's requests.
	Offered, Admitted, Refused int
	// Spent is what the day's requests cost after settlement; Window the
	// spend of the budget window at the end of the day.
	Spent, Window pricing.Micros
}

// BudgetResult is what a budget scenario spent, day by day.
type BudgetResult struct {
	Scenario BudgetScenario
	Days     []BudgetDay
	// MaxCost and Cost are one request's reservation and settled cost.
	MaxCost, Cost pricing.Micros
	// MaxWindow is the most any window was charged.
	MaxWindow pricing.Micros
	// Exhausted is the first refusal; Resumed the first admission after it.
	Exhausted, Resumed time.Time
}

// BudgetScenarios lists the built-in budget scenarios by name.
func BudgetScenarios() map[string]BudgetScenario {
	ny, _ := sluice.LoadLocation("America/New_York")
	b := BudgetScenario{
		Name: "budget",
		Description: "a $500 budget per calendar month in America/New_York on gpt-4o; 100 requests an hour, each 2000 prompt tokens (500 cached) " +
			"and up to 1000 completion tokens (600 used): the budget runs out on January 21 and comes back at local midnight on February 1, 05:00 UTC",
		Budget:   500 * pricing.Dollar,
		Calendar: sluice.Calendar{Unit: sluice.Month, Location: ny},
		Model:    "gpt-4o",
		Price:    pricing.Price{pricing.Input: 2_500_000, pricing.CachedInput: 1_250_000, pricing.Output: 10_000_000, pricing.Reasoning: 10_000_000},
		Start:    time.Date(2027, 1, 1, 0, 0, 0, 0, ny),
		Days:     40, PerHour: 100,
		Prompt: 2000, Cached: 500, MaxTokens: 1000, Completion: 600,
	}
	return map[string]BudgetScenario{b.Name: b}
}

// maxBudgetArrivals bounds a budget scenario's requests.
const maxBudgetArrivals = 2_000_000

// RunBudget replays s.
func RunBudget(ctx context.Context, s BudgetScenario) (*BudgetResult, error) {
	if s.Days <= 0 || s.PerHour <= 0 || s.Days*24*s.PerHour > maxBudgetArrivals {
		return nil, fmt.Errorf("%w: %d days at %d an hour: want 1 to %d requests", ErrBadPattern, s.Days, s.PerHour, maxBudgetArrivals)
	}
	limit := sluice.PerCalendar(int64(s.Budget), s.Calendar)
	if err := limit.Validate(); err != nil {
		return nil, fmt.Errorf("simulate: budget: %w", err)
	}
	clk := clock.NewFake(s.Start)
	st, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		return nil, fmt.Errorf("simulate: %w", err)
	}
	defer st.Close()
	res := &BudgetResult{Scenario: s,
		MaxCost: s.Price.Cost(pricing.Usage{pricing.Input: s.Prompt, pricing.Output: s.MaxTokens}),
		Cost:    s.Price.Cost(pricing.OpenAIUsage(s.Prompt, s.Cached, s.Completion, 0)),
	}
	req := sluice.Request{Key: "budget", Algorithm: sluice.FixedWindow, Limit: limit, Cost: int64(res.MaxCost)}
	loc := s.Calendar.Location
	if loc == nil {
		loc = time.UTC
	}
	step := time.Hour / time.Duration(s.PerHour)
	end := s.Start.AddDate(0, 0, s.Days)
	var day *BudgetDay
	for t := s.Start; t.Before(end); t = t.Add(step) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		clk.Set(t)
		lt := t.In(loc)
		if d := time.Date(lt.Year(), lt.Month(), lt.Day(), 0, 0, 0, 0, loc); day == nil || !d.Equal(day.Day) {
			res.Days = append(res.Days, BudgetDay{Day: d})
			day = &res.Days[len(res.Days)-1]
		}
		day.Offered++
		d, err := st.Apply(ctx, sluice.OpAllow, req)
		if err != nil {
			return nil, fmt.Errorf("simulate: %w", err)
		}
		if !d.Allowed {
			day.Refused++
			if res.Exhausted.IsZero() {
				res.Exhausted = t
			}
			if err := res.peek(ctx, st, req, day); err != nil {
				return nil, err
			}
			continue
		}
		if !res.Exhausted.IsZero() && res.Resumed.IsZero() {
			res.Resumed = t
		}
		day.Admitted++
		res.MaxWindow = max(res.MaxWindow, pricing.Micros(limit.Rate-d.Remaining))
		// Settled: the unused part of the reservation comes back.
		if back := res.MaxCost - res.Cost; back > 0 {
			r := req
			r.Cost = int64(back)
			if _, err := st.Apply(ctx, sluice.OpRefund, r); err != nil {
				return nil, fmt.Errorf("simulate: %w", err)
			}
		}
		day.Spent += res.Cost
		if err := res.peek(ctx, st, req, day); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// peek records the window's spend in day.
func (r *BudgetResult) peek(ctx context.Context, st sluice.Store, req sluice.Request, day *BudgetDay) error {
	req.Cost = 0
	p, err := st.Apply(ctx, sluice.OpPeek, req)
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	day.Window = pricing.Micros(req.Limit.Rate - max(p.Remaining, 0))
	return nil
}

// WriteTable prints the scenario, a row per local day, and when the budget
// ran out and came back.
func (r *BudgetResult) WriteTable(w io.Writer) error {
	s := r.Scenario
	fmt.Fprintf(w, "scenario %s: %s\n", s.Name, s.Description)
	fmt.Fprintf(w, "budget $%s per %s %s; one request reserves $%s and costs $%s after settlement\n\n",
		s.Budget, s.Calendar.Unit, s.Calendar, r.MaxCost, r.Cost)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "day\toffered\tadmitted\trefused\tspent $\twindow spent $\t")
	for _, d := range r.Days {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t\n", d.Day.Format("2006-01-02"), d.Offered, d.Admitted, d.Refused, d.Spent, d.Window)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nmost charged to a window: $%s of $%s\n", r.MaxWindow, s.Budget)
	if !r.Exhausted.IsZero() {
		fmt.Fprintf(w, "first refusal: %s (%s)\n", r.Exhausted.In(s.Start.Location()).Format(time.DateTime+" MST"), r.Exhausted.UTC().Format(time.DateTime+" MST"))
	}
	if !r.Resumed.IsZero() {
		fmt.Fprintf(w, "admitted again: %s (%s)\n", r.Resumed.In(s.Start.Location()).Format(time.DateTime+" MST"), r.Resumed.UTC().Format(time.DateTime+" MST"))
	}
	return nil
}
