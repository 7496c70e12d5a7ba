package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
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
