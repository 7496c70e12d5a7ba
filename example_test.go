package sluice_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
)

// The library in ten lines: a limit, a store, a limiter, a decision.
func Example() {
	store, _ := memstore.New(memstore.Options{})
	defer store.Close()
	limit, _ := sluice.ParseLimit("2/min")
	limiter, _ := sluice.NewLimiter(sluice.Options{Store: store, Limit: limit})
	for range 3 {
		d, _ := limiter.Allow(context.Background(), "user:42")
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfterSeconds())
	}
	// Output:
	// true 1 0
	// true 0 0
	// false 0 30
}

// AllowAll charges several limits all or nothing: a request the daily
// limit denies does not use up the per-second one.
func ExampleAllowAll() {
	store, _ := memstore.New(memstore.Options{})
	defer store.Close()
	perSecond := sluice.Request{Key: "{user:7}:s", Algorithm: sluice.GCRA, Limit: sluice.PerSecond(10), Cost: 1}
	perDay := sluice.Request{Key: "{user:7}:d", Algorithm: sluice.FixedWindow, Limit: sluice.PerDay(1), Cost: 1}
	for range 2 {
		d, members, _ := sluice.AllowAll(context.Background(), store, []sluice.Request{perSecond, perDay})
		fmt.Println(d.Allowed, members[0].Remaining)
	}
	// Output:
	// true 9
	// false 9
}

// Wait blocks until the limiter admits the event, sleeping exactly as long
// as needed rather than polling.
func ExampleLimiter_Wait() {
	store, _ := memstore.New(memstore.Options{})
	defer store.Close()
	limiter, _ := sluice.NewLimiter(sluice.Options{Store: store, Limit: sluice.Limit{Rate: 20, Period: time.Second, Burst: 1}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	for range 3 {
		if _, err := limiter.Wait(ctx, "batch", 1); err != nil {
			fmt.Println(err)
		}
	}
	fmt.Println(time.Since(start) >= 100*time.Millisecond)
	// Output: true
}

// Reserve admits what would be admitted within the max wait now, charged
// against the future: the caller holds it for its Delay (Wait sleeps it,
// and refunds if the context ends first). Beyond the max wait it is denied.
func ExampleLimiter_Reserve() {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store, _ := memstore.New(memstore.Options{Clock: clk})
	defer store.Close()
	limiter, _ := sluice.NewLimiter(sluice.Options{Store: store, Limit: sluice.Limit{Rate: 10, Period: time.Second, Burst: 2}})
	for range 5 {
		r, err := limiter.Reserve(context.Background(), "client", 1, 200*time.Millisecond)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(r.Decision.Allowed, r.Decision.Delay, r.Decision.RetryAfter)
	}
	// Output:
	// true 0s 0s
	// true 0s 0s
	// true 100ms 0s
	// true 200ms 0s
	// false 0s 100ms
}

// A concurrency limit holds leases; a crashed holder's lease lapses after
// the limit's period.
func ExampleLimiter_Acquire() {
	store, _ := memstore.New(memstore.Options{})
	defer store.Close()
	limiter, _ := sluice.NewLimiter(sluice.Options{Store: store, Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: 1, Period: time.Minute}})
	ctx := context.Background()
	lease, d, _ := limiter.Acquire(ctx, "report")
	fmt.Println(d.Allowed)
	_, d, _ = limiter.Acquire(ctx, "report")
	fmt.Println(d.Allowed)
	_, _ = limiter.Release(ctx, lease)
	_, d, _ = limiter.Acquire(ctx, "report")
	fmt.Println(d.Allowed)
	// Output:
	// true
	// false
	// true
}

func ExampleParseLimit() {
	l, _ := sluice.ParseLimit("100/min burst 20")
	fmt.Println(l.Rate, l.Period, l.Burst, l)
	_, err := sluice.ParseLimit("0/s")
	fmt.Println(err)
	// Output:
	// 100 1m0s 20 100/min burst 20
	// sluice: invalid limit "0/s": rate: "0" must be positive
}

// A calendar limit: 3 requests per local day in Europe/Berlin. The window
// resets at local midnight, whatever the UTC offset that day, and an
// exhausted window says how long until then. The clock is fixed here to
// make the output stable: 2026-03-29 is a 23-hour day in Berlin.
func ExamplePerCalendar() {
	berlin, _ := sluice.LoadLocation("Europe/Berlin")
	clk := clock.NewFake(time.Date(2026, 3, 29, 20, 0, 0, 0, berlin))
	store, _ := memstore.New(memstore.Options{Clock: clk})
	defer store.Close()
	limit := sluice.PerCalendar(3, sluice.Calendar{Unit: sluice.Day, Location: berlin})
	// The same as sluice.ParseLimit("3/day in Europe/Berlin").
	limiter, _ := sluice.NewLimiter(sluice.Options{Store: store, Limit: limit}) // FixedWindow
	for range 4 {
		d, _ := limiter.Allow(context.Background(), "user:42")
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfter)
	}
	start, end := limit.Calendar.Window(clk.Time())
	fmt.Println(limiter.Limit(), end.Sub(start))
	// Output:
	// true 2 0s
	// true 1 0s
	// true 0 0s
	// false 0 4h0m0s
	// 3/day in Europe/Berlin 23h0m0s
}

// An upstream's 10,000 requests per minute kept as a sliding window log in
// 300ms slots: never more than 10,000 in any minute, with at most 201
// entries per key however busy it is. A request admitted 100ms into a slot
// counts until that slot's end plus a minute.
func ExampleLimit_granularity() {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store, _ := memstore.New(memstore.Options{Clock: clk})
	defer store.Close()
	limit := sluice.Limit{Rate: 10_000, Period: time.Minute, Granularity: time.Minute / 200}
	req := sluice.Request{Key: "upstream:rpm", Algorithm: sluice.SlidingWindowLog, Limit: limit, Cost: 10_000}
	clk.Advance(100 * time.Millisecond)
	d, _ := store.Apply(context.Background(), sluice.OpAllow, req)
	fmt.Println(d.Allowed, d.ResetAfter)
	req.Cost = 1
	d, _ = store.Apply(context.Background(), sluice.OpAllow, req)
	fmt.Println(d.Allowed, d.RetryAfter)
	// Output:
	// true 1m0.2s
	// false 1m0.2s
}
