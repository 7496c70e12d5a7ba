package storetest

import (
	"context"
	"errors"
	"time"
	_ "time/tzdata" // the same zone rules on every machine

	"github.com/sluice-io/sluice"
)

// calendarScenarios: calendar windows reset exactly at the local boundary
// (checked to the nanosecond on both sides), never at the UTC one, across
// DST changes, month ends, leap days, the turn of the year, and in a zone
// fourteen hours ahead of UTC. Expected boundaries are written as local
// wall times with time.Date, not derived from sluice's own window code.
func calendarScenarios() []scenario {
	zone := func(h *harness, name string) *time.Location {
		loc, err := time.LoadLocation(name)
		if err != nil {
			h.t.Fatal(err)
		}
		return loc
	}
	// exhaust sets the clock to from, spends the limit of 3, and checks the
	// denial's RetryAfter is the time to the local boundary, then that the
	// window still denies 1ns before it and admits exactly at it, with
	// ResetAfter the length of the next window.
	exhaust := func(h *harness, req sluice.Request, from, boundary, nextEnd time.Time) {
		h.t.Helper()
		h.clk.Set(from)
		left := boundary.Sub(from)
		next := nextEnd.Sub(boundary)
		h.steps(req, []step{
			allow(0, 2, true, 1, 0, left),
			peek(0, 1, true, 1, 0, left),
			allow(0, 1, true, 0, 0, left),
			allow(0, 1, false, 0, left, left),
			allow(left-ms, 1, false, 0, ms, ms),
			allow(ms-1, 1, false, 0, 1, 1),
			allow(1, 1, true, 2, 0, next), // exactly at the local boundary
			allow(0, 2, true, 0, 0, next),
			allow(ms, 1, false, 0, next-ms, next-ms),
		})
	}
	cal := func(h *harness, name string, c sluice.Calendar) sluice.Request {
		return sluice.Request{Key: h.key(name), Algorithm: sluice.FixedWindow, Limit: sluice.PerCalendar(3, c)}
	}
	return []scenario{
		{"calendar/BerlinSpringForward", func(h *harness) {
			b := zone(h, "Europe/Berlin")
			r := cal(h, "ber-spring", sluice.Calendar{Unit: sluice.Day, Location: b})
			// 2026-03-29 has 23 hours: it ends at 22:00 UTC.
			exhaust(h, r, time.Date(2026, 3, 29, 1, 30, 0, 0, b), time.Date(2026, 3, 30, 0, 0, 0, 0, b), time.Date(2026, 3, 31, 0, 0, 0, 0, b))
		}},
		{"calendar/BerlinFallBack", func(h *harness) {
			b := zone(h, "Europe/Berlin")
			r := cal(h, "ber-fall", sluice.Calendar{Unit: sluice.Day, Location: b})
			// From the first local midnight of a 25-hour day.
			exhaust(h, r, time.Date(2026, 10, 25, 0, 0, 0, 0, b), time.Date(2026, 10, 26, 0, 0, 0, 0, b), time.Date(2026, 10, 27, 0, 0, 0, 0, b))
		}},
		{"calendar/NewYorkSpringForward", func(h *harness) {
			ny := zone(h, "America/New_York")
			r := cal(h, "ny-spring", sluice.Calendar{Unit: sluice.Day, Location: ny})
			exhaust(h, r, time.Date(2026, 3, 8, 0, 0, 0, 0, ny), time.Date(2026, 3, 9, 0, 0, 0, 0, ny), time.Date(2026, 3, 10, 0, 0, 0, 0, ny))
		}},
		{"calendar/NewYorkFallBack", func(h *harness) {
			ny := zone(h, "America/New_York")
			r := cal(h, "ny-fall", sluice.Calendar{Unit: sluice.Day, Location: ny})
			exhaust(h, r, time.Date(2026, 11, 1, 1, 30, 0, 0, ny), time.Date(2026, 11, 2, 0, 0, 0, 0, ny), time.Date(2026, 11, 3, 0, 0, 0, 0, ny))
		}},
		{"calendar/NewYorkResetAt0900", func(h *harness) {
			ny := zone(h, "America/New_York")
			r := cal(h, "ny-0900", sluice.Calendar{Unit: sluice.Day, Location: ny, ResetAt: 9 * time.Hour})
			// 08:00 local is in yesterday's window, which ends at 09:00 local.
			exhaust(h, r, time.Date(2026, 11, 1, 8, 0, 0, 0, ny), time.Date(2026, 11, 1, 9, 0, 0, 0, ny), time.Date(2026, 11, 2, 9, 0, 0, 0, ny))
		}},
		{"calendar/Feb28NoLeap", func(h *harness) {
			ny := zone(h, "America/New_York")
			r := cal(h, "feb27", sluice.Calendar{Unit: sluice.Month, Location: ny})
			exhaust(h, r, time.Date(2027, 2, 28, 23, 0, 0, 0, ny), time.Date(2027, 3, 1, 0, 0, 0, 0, ny), time.Date(2027, 4, 1, 0, 0, 0, 0, ny))
		}},
		{"calendar/Feb29Leap", func(h *harness) {
			ny := zone(h, "America/New_York")
			r := cal(h, "feb28", sluice.Calendar{Unit: sluice.Month, Location: ny})
			exhaust(h, r, time.Date(2028, 2, 28, 23, 0, 0, 0, ny), time.Date(2028, 3, 1, 0, 0, 0, 0, ny), time.Date(2028, 4, 1, 0, 0, 0, 0, ny))
			d := cal(h, "feb29", sluice.Calendar{Unit: sluice.Day, Location: ny})
			exhaust(h, d, time.Date(2028, 2, 29, 12, 0, 0, 0, ny), time.Date(2028, 3, 1, 0, 0, 0, 0, ny), time.Date(2028, 3, 2, 0, 0, 0, 0, ny))
		}},
		{"calendar/NewYearBerlin", func(h *harness) {
			b := zone(h, "Europe/Berlin")
			r := cal(h, "year", sluice.Calendar{Unit: sluice.Year, Location: b})
			exhaust(h, r, time.Date(2026, 12, 31, 23, 0, 0, 0, b), time.Date(2027, 1, 1, 0, 0, 0, 0, b), time.Date(2028, 1, 1, 0, 0, 0, 0, b))
		}},
		{"calendar/Kiritimati", func(h *harness) {
			k := zone(h, "Pacific/Kiritimati")
			// UTC+14: the day of 2027-01-01 starts at 10:00 UTC on 2026-12-31.
			r := cal(h, "kir", sluice.Calendar{Unit: sluice.Day, Location: k})
			exhaust(h, r, time.Date(2026, 12, 31, 20, 0, 0, 0, k), time.Date(2027, 1, 1, 0, 0, 0, 0, k), time.Date(2027, 1, 2, 0, 0, 0, 0, k))
			w := cal(h, "kir-week", sluice.Calendar{Unit: sluice.Week, Location: k, FirstWeekday: time.Sunday})
			// 2027-01-02 is a Saturday; the week ends on Sunday 2027-01-03 local.
			exhaust(h, w, time.Date(2027, 1, 2, 12, 0, 0, 0, k), time.Date(2027, 1, 3, 0, 0, 0, 0, k), time.Date(2027, 1, 10, 0, 0, 0, 0, k))
		}},
		{"calendar/NotAtUTCMidnight", func(h *harness) {
			b := zone(h, "Europe/Berlin")
			r := cal(h, "utc", sluice.Calendar{Unit: sluice.Day, Location: b})
			// Spent at 23:30 local; UTC midnight (02:00 local) does not reset it.
			h.clk.Set(time.Date(2026, 7, 1, 0, 30, 0, 0, b))
			utcMidnight := time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)
			localMidnight := time.Date(2026, 7, 2, 0, 0, 0, 0, b)
			h.steps(r, []step{
				allow(0, 3, true, 0, 0, localMidnight.Sub(h.clk.Time())),
				allow(utcMidnight.Sub(h.clk.Time()), 1, false, 0, 22*time.Hour, 22*time.Hour),
			})
		}},
		{"calendar/RefundChargeReset", func(h *harness) {
			r := cal(h, "rcr", sluice.Calendar{Unit: sluice.Month})
			h.clk.Set(time.Date(2026, 4, 30, 0, 0, 0, 0, time.UTC))
			day := 24 * time.Hour
			h.steps(r, []step{
				allow(0, 3, true, 0, 0, day),
				refund(0, 2, 2, day),
				{op: sluice.OpCharge, cost: 4, want: sluice.Decision{Allowed: true, Remaining: -2, ResetAfter: day}},
				allow(0, 1, false, 0, day, day),
				{op: sluice.OpReset, want: sluice.Decision{Allowed: true, Remaining: 3}},
				allow(day, 1, true, 2, 0, 31*day), // May
				{op: sluice.OpAllow, cost: 4, err: sluice.ErrCostExceedsBurst},
			})
		}},
		{"calendar/AllOrNothing", func(h *harness) {
			ctx := context.Background()
			b := zone(h, "Europe/Berlin")
			h.clk.Set(time.Date(2026, 3, 29, 12, 0, 0, 0, b))
			day := cal(h, "batch-day", sluice.Calendar{Unit: sluice.Day, Location: b})
			day.Cost = 1
			month := cal(h, "batch-month", sluice.Calendar{Unit: sluice.Month, Location: b})
			month.Limit = sluice.PerCalendar(5, month.Limit.Calendar)
			month.Cost = 1
			rpm := sluice.Request{Key: h.key("batch-rpm"), Algorithm: sluice.GCRA, Limit: sluice.PerMinute(100), Cost: 1}
			for i := range 3 {
				if d, _, err := sluice.AllowAll(ctx, h.store, []sluice.Request{rpm, day, month}); err != nil || !d.Allowed {
					h.t.Fatalf("batch %d: %+v %v", i, d, err)
				}
			}
			d, ds, err := sluice.AllowAll(ctx, h.store, []sluice.Request{rpm, day, month})
			toMidnight := time.Date(2026, 3, 30, 0, 0, 0, 0, b).Sub(h.clk.Time())
			if err != nil || d.Allowed || ds[1].Allowed || !ds[2].Allowed || ds[2].Remaining != 2 || d.RetryAfter != toMidnight {
				h.t.Fatalf("4th batch: %+v %+v %v; want denied by the day, retry %s", d, ds, err, toMidnight)
			}
			// The next local day admits two more, then the month is spent.
			h.clk.Set(time.Date(2026, 3, 30, 0, 0, 0, 0, b))
			for i := range 2 {
				if d, _, err := sluice.AllowAll(ctx, h.store, []sluice.Request{rpm, day, month}); err != nil || !d.Allowed {
					h.t.Fatalf("next day, batch %d: %+v %v", i, d, err)
				}
			}
			d, _, err = sluice.AllowAll(ctx, h.store, []sluice.Request{day, month})
			toApril := time.Date(2026, 4, 1, 0, 0, 0, 0, b).Sub(h.clk.Time())
			if err != nil || d.Allowed || d.RetryAfter != toApril {
				h.t.Fatalf("month spent: %+v %v; want retry %s", d, err, toApril)
			}
		}},
		{"calendar/NeedsFixedWindow", func(h *harness) {
			r := cal(h, "gcra", sluice.Calendar{Unit: sluice.Day})
			r.Algorithm = sluice.GCRA
			r.Cost = 1
			if _, err := h.store.Apply(context.Background(), sluice.OpAllow, r); !errors.Is(err, sluice.ErrInvalidLimit) {
				h.t.Fatalf("calendar limit with gcra: %v, want ErrInvalidLimit", err)
			}
		}},
	}
}
