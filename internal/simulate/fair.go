package simulate

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/fairqueue"
	"github.com/sluice-io/sluice/memstore"
)

// Flow is a group of keys offering steady traffic in one class.
type Flow struct {
	// Name labels the group in tables and charts.
	Name string
	// Keys is how many keys the group has (at least 1); each offers RPS.
	Keys int
	// RPS is the requests per second each key offers.
	RPS float64
	// Class is the keys' priority class ("" for the only class).
	Class string
	// Weight is each key's fair-share weight (0 means 1).
	Weight float64
	// From and To bound when the flow offers traffic, from the start;
	// To zero means the scenario's Duration.
	From, To time.Duration
}

// Scenario is a shared capacity, the gateway queue in front of it, and the
// traffic of several flows: what `sluice simulate --scenario` replays
// through the gateway's scheduler (package fairqueue) on a virtual clock.
type Scenario struct {
	// Name and Description head the table.
	Name, Description string
	// Capacity is the shared limit of requests, such as 30/s.
	Capacity sluice.Limit
	// Classes are the priority classes, with their reserved shares.
	Classes []fairqueue.Class
	// Flows offer the traffic.
	Flows []Flow
	// MaxWait bounds a request's wait; MaxPerKey the waiting requests of
	// one key.
	MaxWait   time.Duration
	MaxPerKey int
	// Duration is how long the flows offer traffic.
	Duration time.Duration
	// Bucket is the width of one table row.
	Bucket time.Duration
}

// Scenarios lists the built-in scenarios by name.
func Scenarios() map[string]Scenario {
	fairness := Scenario{
		Name:        "fairness",
		Description: "1 heavy key offering 100 req/s and 9 light keys offering 2 req/s each share a model capacity of 30 req/s: light keys get everything, within 1s; the heavy key gets the rest",
		Capacity:    sluice.Limit{Rate: 30, Period: time.Second, Burst: 5},
		Flows:       []Flow{{Name: "heavy", Keys: 1, RPS: 100}, {Name: "light", Keys: 9, RPS: 2}},
		MaxWait:     2 * time.Second, MaxPerKey: 16, Duration: 20 * time.Second, Bucket: time.Second,
	}
	priority := Scenario{
		Name:        "priority",
		Description: "interactive (priority 10, 70% reserved) and batch (priority 0, 30% reserved) share 100 req/s; batch saturates it alone for 5s, both saturate it until 15s, then interactive alone: each borrows what the other leaves idle",
		Capacity:    sluice.Limit{Rate: 100, Period: time.Second, Burst: 20},
		Classes:     []fairqueue.Class{{Name: "interactive", Priority: 10, Share: 70}, {Name: "batch", Share: 30}},
		Flows: []Flow{
			{Name: "interactive", Keys: 1, RPS: 300, Class: "interactive", From: 5 * time.Second},
			{Name: "batch", Keys: 1, RPS: 300, Class: "batch", To: 15 * time.Second},
		},
		MaxWait: time.Second, MaxPerKey: 64, Duration: 20 * time.Second, Bucket: time.Second,
	}
	return map[string]Scenario{fairness.Name: fairness, priority.Name: priority}
}

// FlowResult is what one flow got.
type FlowResult struct {
	Flow
	// Offered and Admitted count per bucket, over all the flow's keys.
	Offered, Admitted []int
	// Outcomes counts the flow's requests by outcome (admitted, timeout,
	// full, denied).
	Outcomes map[fairqueue.Outcome]int
	// MinKeyShare is the lowest fraction of its requests one key of the
	// flow got admitted; MaxWait the longest wait of an admitted request.
	MinKeyShare float64
	MaxWait     time.Duration
}

// ScenarioResult is the outcome of RunScenario.
type ScenarioResult struct {
	Scenario Scenario
	Flows    []FlowResult
}

type simArrival struct {
	at   time.Duration
	flow int
	key  int
}

// RunScenario replays s through the gateway's scheduler over a memory
// store, both on one virtual clock, and counts per bucket and flow.
func RunScenario(ctx context.Context, s Scenario) (*ScenarioResult, error) {
	if err := s.Capacity.Validate(); err != nil {
		return nil, fmt.Errorf("simulate: %w", err)
	}
	if s.Bucket <= 0 || s.Duration <= 0 || len(s.Flows) == 0 {
		return nil, fmt.Errorf("%w: a scenario needs flows, a duration and a bucket", ErrBadPattern)
	}
	var arrivals []simArrival
	for fi, f := range s.Flows {
		if !(f.RPS > 0) || f.Keys < 1 || f.RPS*float64(f.Keys)*s.Duration.Seconds() > maxArrivals {
			return nil, fmt.Errorf("%w: flow %s: %d keys at %v/s", ErrBadPattern, f.Name, f.Keys, f.RPS)
		}
		from, to := f.From, f.To
		if to == 0 || to > s.Duration {
			to = s.Duration
		}
		step := time.Duration(float64(time.Second) / f.RPS)
		for k := range f.Keys {
			// Keys of a flow are spread over one step, so that they do
			// not all arrive at the same instant.
			for at := from + step*time.Duration(k)/time.Duration(f.Keys) + time.Duration(fi)*time.Millisecond; at < to; at += step {
				arrivals = append(arrivals, simArrival{at: at, flow: fi, key: k})
			}
		}
	}
	if len(arrivals) > maxArrivals {
		return nil, fmt.Errorf("%w: over %d requests", ErrBadPattern, maxArrivals)
	}
	slices.SortStableFunc(arrivals, func(a, b simArrival) int { return int(a.at - b.at) })
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clock.NewFake(start)
	store, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		return nil, err
	}
	defer store.Close()
	q, err := fairqueue.New(fairqueue.Options{
		Store: store, Clock: clk, Classes: s.Classes, KeyPrefix: "{sim}:", MaxWait: s.MaxWait, MaxPerKey: s.MaxPerKey,
		Capacities: map[string][]fairqueue.Limit{"model": {{Name: "rps", Kind: fairqueue.Requests, Algorithm: sluice.GCRA, Limit: s.Capacity}}},
	})
	if err != nil {
		return nil, fmt.Errorf("simulate: %w", err)
	}
	n := int((s.Duration+s.MaxWait)/s.Bucket) + 1
	res := &ScenarioResult{Scenario: s}
	perKey := make([][][2]int, len(s.Flows)) // offered, admitted per key
	for _, f := range s.Flows {
		res.Flows = append(res.Flows, FlowResult{Flow: f, Offered: make([]int, n), Admitted: make([]int, n), Outcomes: map[fairqueue.Outcome]int{}})
	}
	for fi, f := range s.Flows {
		perKey[fi] = make([][2]int, f.Keys)
	}
	type pending struct {
		w *fairqueue.Waiter
		a simArrival
	}
	var waiting []pending
	finish := func(p pending) {
		r := p.w.Result()
		fr := &res.Flows[p.a.flow]
		fr.Outcomes[r.Outcome]++
		if r.Outcome == fairqueue.Admitted {
			fr.Admitted[int((p.a.at+r.Waited)/s.Bucket)]++
			fr.MaxWait = max(fr.MaxWait, r.Waited)
			perKey[p.a.flow][p.a.key][1]++
		}
	}
	next := int64(0)
	for i := 0; i < len(arrivals) || len(waiting) > 0; {
		at := int64(-1)
		if i < len(arrivals) {
			at = start.Add(arrivals[i].at).UnixNano()
		}
		if next != 0 && (at < 0 || next < at) {
			at = next
		}
		if at < 0 {
			return nil, fmt.Errorf("simulate: %d requests wait but the scheduler wants no wake-up", len(waiting))
		}
		if at > clk.Now() {
			clk.Set(time.Unix(0, at))
		}
		for i < len(arrivals) && start.Add(arrivals[i].at).UnixNano() <= clk.Now() {
			a := arrivals[i]
			i++
			f := s.Flows[a.flow]
			w, err := q.Submit(ctx, &fairqueue.Item{Key: fmt.Sprintf("%s-%d", f.Name, a.key), Group: f.Name, Class: f.Class, Weight: f.Weight, Capacity: "model"})
			if err != nil {
				return nil, fmt.Errorf("simulate: %w", err)
			}
			res.Flows[a.flow].Offered[int(a.at/s.Bucket)]++
			perKey[a.flow][a.key][0]++
			waiting = append(waiting, pending{w, a})
		}
		next = q.Dispatch(ctx)
		waiting = slices.DeleteFunc(waiting, func(p pending) bool {
			select {
			case <-p.w.Done():
				finish(p)
				return true
			default:
				return false
			}
		})
	}
	for fi := range res.Flows {
		res.Flows[fi].MinKeyShare = 1
		for _, k := range perKey[fi] {
			if k[0] > 0 {
				res.Flows[fi].MinKeyShare = min(res.Flows[fi].MinKeyShare, float64(k[1])/float64(k[0]))
			}
		}
	}
	// Drop the trailing rows in which nothing happened.
	last := 0
	for _, fr := range res.Flows {
		for b := range n {
			if fr.Offered[b] > 0 || fr.Admitted[b] > 0 {
				last = max(last, b)
			}
		}
	}
	for fi := range res.Flows {
		res.Flows[fi].Offered = res.Flows[fi].Offered[:last+1]
		res.Flows[fi].Admitted = res.Flows[fi].Admitted[:last+1]
	}
	return res, nil
}

// WriteTable prints one row per bucket, offered and admitted per flow and
// the flows' shares of what was admitted, then a summary per flow.
func (r *ScenarioResult) WriteTable(w io.Writer) error {
	bw := bufio.NewWriter(w)
	s := r.Scenario
	fmt.Fprintf(bw, "scenario %s: %s\ncapacity %s, max wait %s, %s per row\n\n", s.Name, s.Description, s.Capacity, s.MaxWait, s.Bucket)
	fmt.Fprintf(bw, "%8s", "t")
	for _, f := range r.Flows {
		fmt.Fprintf(bw, " %22s", f.Name+" ok/offered share")
	}
	fmt.Fprintln(bw)
	for b := range r.Flows[0].Offered {
		fmt.Fprintf(bw, "%8s", time.Duration(b)*s.Bucket)
		total := 0
		for _, f := range r.Flows {
			total += f.Admitted[b]
		}
		for _, f := range r.Flows {
			share := 0.0
			if total > 0 {
				share = 100 * float64(f.Admitted[b]) / float64(total)
			}
			fmt.Fprintf(bw, " %22s", fmt.Sprintf("%d/%d %3.0f%%", f.Admitted[b], f.Offered[b], share))
		}
		fmt.Fprintln(bw)
	}
	fmt.Fprintf(bw, "\n%-12s %5s %8s %9s %8s %8s %6s %12s %9s\n", "flow", "keys", "offered", "admitted", "timeout", "full", "denied", "worst key ok", "max wait")
	for _, f := range r.Flows {
		offered := 0
		for _, o := range f.Offered {
			offered += o
		}
		fmt.Fprintf(bw, "%-12s %5d %8d %9d %8d %8d %6d %11.0f%% %9s\n", f.Name, f.Keys, offered, f.Outcomes[fairqueue.Admitted],
			f.Outcomes[fairqueue.Timeout], f.Outcomes[fairqueue.Full], f.Outcomes[fairqueue.Denied], 100*f.MinKeyShare, f.MaxWait.Round(time.Millisecond))
	}
	return bw.Flush()
}

// WriteSVG draws admitted requests per bucket, one line per flow, over the
// capacity's steady rate.
func (r *ScenarioResult) WriteSVG(w io.Writer) error {
	s := r.Scenario
	steady := steadyPerBucket(s.Capacity.Rate, s.Capacity.Period, s.Bucket)
	c := &chart{
		title:  fmt.Sprintf("scenario %s: admitted per %s, capacity %s", s.Name, s.Bucket, s.Capacity),
		bucket: s.Bucket, n: len(r.Flows[0].Admitted), peak: int(steady * 1.2),
		ref: steady, refDash: "6 4", refLabel: "capacity",
	}
	for k, f := range r.Flows {
		c.lines = append(c.lines, chartLine{values: f.Admitted, colour: palette[k%len(palette)], width: 3, attr: "flow", name: f.Name,
			label: fmt.Sprintf("%s: %d x %g/s (%d ok)", f.Name, f.Keys, f.RPS, f.Outcomes[fairqueue.Admitted])})
	}
	return c.write(w)
}
