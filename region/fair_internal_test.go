package region

import (
	"testing"
	"time"

	"github.com/sluice-io/sluice"
)

// A key's demand is reported from its home region, and its refill
// allotted, no more often than it refills a unit (and at least every
// fairFresh/4, so that reports stay counted): a key at 1/min that a client
// keeps asking for cost its home 20 table calls a second at the fixed
// 50ms, whatever the client's rate.
func TestFairIntervalFollowsRefill(t *testing.T) {
	for _, c := range []struct {
		limit sluice.Limit
		want  time.Duration
	}{
		{sluice.Limit{Rate: 400, Period: time.Second, Burst: 400}, fairEvery}, // 2.5ms a unit
		{sluice.Limit{Rate: 10, Period: time.Second, Burst: 10}, 100 * time.Millisecond},
		{sluice.Limit{Rate: 1, Period: time.Minute, Burst: 1}, fairFresh / 4},
		{sluice.Limit{}, fairEvery},
	} {
		req := sluice.Request{Key: "k", Algorithm: sluice.GCRA, Limit: c.limit}
		if got := fairInterval(&req); got != c.want {
			t.Errorf("%+v: every %s, want %s", c.limit, got, c.want)
		}
	}
}
