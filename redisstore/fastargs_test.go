package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
)

// The fast scripts as production calls them, on Redis TIME (the
// conformance suite runs them on a test's clock, with the whole ARGV): op
// and the fewest values (gcra_fast.lua leaves out the cost's interval
// when it is the effective cost's; fixedwindow_fast.lua takes the period
// packed in one value). A peek of cost 0 checks one unit, an allow and a
// charge of 1 take one, a refund of 1 gives one back, for GCRA, the token
// bucket, and fixed windows of whole and of fractional seconds (periods
// long enough that no window ends during the test).
func TestFastScriptsRedisTime(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	for _, c := range []struct {
		a     sluice.Algorithm
		lim   sluice.Limit
		nargs int  // the ARGV of an allow of cost 1
		plain bool // Options.PlainWindows: fixedwindow_plain.lua, slack after the period, rate and cost
	}{
		{sluice.GCRA, sluice.Limit{Rate: 2, Period: time.Hour}, 3, false},
		{sluice.TokenBucket, sluice.Limit{Rate: 2, Period: time.Hour}, 3, false},
		{sluice.FixedWindow, sluice.Limit{Rate: 2, Period: 1000 * time.Hour}, 4, false},
		{sluice.FixedWindow, sluice.Limit{Rate: 2, Period: 200*time.Hour + 500*time.Millisecond}, 4, false},
		{sluice.FixedWindow, sluice.Limit{Rate: 2, Period: 1000 * time.Hour}, 4, true},
		{sluice.FixedWindow, sluice.Limit{Rate: 2, Period: 200*time.Hour + 500*time.Millisecond}, 4, true},
	} {
		s := newStore(t, Options{URL: srv.URL(), DisableDenyCache: true, PlainWindows: c.plain})
		name := c.a.String() + "/" + c.lim.Period.String()
		if c.plain {
			name += "/plain"
		}
		req := sluice.Request{Key: redistest.Prefix(t) + name, Algorithm: c.a, Limit: c.lim, Cost: 1}
		p, err := newFastParams(&req)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(p.argv[sluice.OpAllow]); n != c.nargs {
			t.Errorf("%s: %d ARGV values %q, want %d", name, n, p.argv[sluice.OpAllow], c.nargs)
		}
		step := func(op sluice.Op, cost int64, allowed bool, remaining int64) {
			t.Helper()
			r := req
			r.Cost = cost
			d, err := s.Apply(ctx, op, r)
			if err != nil || d.Allowed != allowed || d.Remaining != remaining || d.ResetAfter < 0 || d.ResetAfter > c.lim.Period {
				t.Fatalf("%s: %s of %d: %+v %v, want allowed %v with %d left, reset within the period", name, op, cost, d, err, allowed, remaining)
			}
		}
		step(sluice.OpPeek, 0, true, 2)
		step(sluice.OpAllow, 1, true, 1)
		step(sluice.OpPeek, 0, true, 1)
		step(sluice.OpAllow, 1, true, 0)
		step(sluice.OpPeek, 0, false, 0)
		step(sluice.OpAllow, 1, false, 0)
		if c.plain {
			// the plain path's denied INCRBY stays counted (plain.go)
			step(sluice.OpRefund, 1, true, 0)
		}
		step(sluice.OpRefund, 1, true, 1)
		step(sluice.OpCharge, 1, true, 0)
		step(sluice.OpAllow, 1, false, 0)
		if c.plain {
			continue // a key per window, whose TTL runs past it by the slack
		}
		// The key expires with its state: within a period, not before.
		if ttl, err := srv.Do(ctx, "PTTL", req.Key); err != nil || ttl.(int64) <= 0 || ttl.(int64) > c.lim.Period.Milliseconds()+1 {
			t.Fatalf("%s: PTTL %v %v, want within the period", name, ttl, err)
		}
	}
}
