package redisstore

import (
	"context"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
)

// A token bucket key written by an older sluice as "LEVEL LAST" is read by
// both the one-key and the batch scripts, which then write the full time.
func TestTokenBucketReadsOldValue(t *testing.T) {
	srv := redistest.Standalone(t)
	now := time.Unix(1_800_000_000, 123_456_789)
	clk := clock.NewFake(now)
	s := newStore(t, Options{URL: srv.URL(), Clock: clk, DisableDenyCache: true})
	ctx := context.Background()
	lim := sluice.Limit{Rate: 10, Period: 10 * time.Second} // a token per second, tau 10s
	for _, batch := range []bool{false, true} {
		key := redistest.Prefix(t) + map[bool]string{false: "one", true: "batch"}[batch]
		// Level 2 tokens measured 3s ago: 5 tokens now.
		old := "2000000000 " + itoa(now.Add(-3*time.Second).UnixNano())
		if _, err := srv.Do(ctx, "SET", key, old, "PX", "60000"); err != nil {
			t.Fatal(err)
		}
		req := sluice.Request{Key: key, Algorithm: sluice.TokenBucket, Limit: lim, Cost: 1}
		var d sluice.Decision
		var err error
		if batch {
			var ds []sluice.Decision
			ds, err = s.ApplyAll(ctx, sluice.OpAllow, []sluice.Request{req, {Key: key + ":g", Algorithm: sluice.GCRA, Limit: lim, Cost: 1}})
			if err == nil {
				d = ds[0]
			}
		} else {
			d, err = s.Apply(ctx, sluice.OpAllow, req)
		}
		if err != nil || !d.Allowed || d.Remaining != 4 || d.ResetAfter != 6*time.Second {
			t.Fatalf("batch %v: %+v %v, want allowed with 4 left, full in 6s", batch, d, err)
		}
		v, err := srv.Do(ctx, "GET", key)
		if err != nil || v != itoa(now.Add(6*time.Second).UnixNano()) {
			t.Fatalf("batch %v: stored %v %v, want the time it is full", batch, v, err)
		}
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// A GCRA or token bucket key that an older sluice charged past year 2286
// (a 20-digit TAT, as a charge of MaxInt64 wrote) is read by the one-key and
// the batch scripts as a debt of algo.MaxAhead, denied and refundable, not
// as an error on every later call until its 292-year TTL ran out.
func TestFarTATReadAsCappedDebt(t *testing.T) {
	srv := redistest.Standalone(t)
	now := time.Unix(1_800_000_000, 123_456_789)
	clk := clock.NewFake(now)
	s := newStore(t, Options{URL: srv.URL(), Clock: clk, DisableDenyCache: true})
	ctx := context.Background()
	lim := sluice.Limit{Rate: 10, Period: time.Second}
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket} {
		for _, batch := range []bool{false, true} {
			key := redistest.Prefix(t) + a.String() + map[bool]string{false: ":one", true: ":batch"}[batch]
			if _, err := srv.Do(ctx, "SET", key, "10000000000000000000", "PX", "60000"); err != nil {
				t.Fatal(err)
			}
			req := sluice.Request{Key: key, Algorithm: a, Limit: lim, Cost: 1}
			apply := func(op sluice.Op, r sluice.Request) (sluice.Decision, error) {
				if !batch {
					return s.Apply(ctx, op, r)
				}
				ds, err := s.ApplyAll(ctx, op, []sluice.Request{r, {Key: key + ":other", Algorithm: a, Limit: lim, Cost: 1}})
				if err != nil {
					return sluice.Decision{}, err
				}
				return ds[0], nil
			}
			if d, err := apply(sluice.OpPeek, req); err != nil || d.Allowed || d.ResetAfter != algo.MaxAhead {
				t.Fatalf("%s batch %v: %+v %v, want denied, full again in algo.MaxAhead", a, batch, d, err)
			}
			r := req
			r.Cost = math.MaxInt64
			if d, err := apply(sluice.OpRefund, r); err != nil || d.Remaining != 10 {
				t.Fatalf("%s batch %v: refund: %+v %v, want full", a, batch, d, err)
			}
		}
	}
}
