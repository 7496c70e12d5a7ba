package algo

import (
	"fmt"
	"time"

	"github.com/sluice-io/sluice"
)

// MaxAhead bounds how far ahead of now a GCRA or token bucket key's state
// may reach: a charge (sluice.OpCharge) that would put the key further in
// debt leaves it MaxAhead in debt, about 36 years, rather than
// overflowing. It is a power of two, exact as a double in the Redis
// scripts, above the longest refill a valid limit has (16 × 366 days)
// plus the longest reservation, and small enough that now + MaxAhead plus
// any increment stays far below 2^63 and a 19-digit decimal.
const MaxAhead = time.Duration(1 << 60)

// MaxCount bounds the counts of the counting algorithms (fixed window,
// sliding window counter and log, concurrency): a charge counts at most
// MaxCount, and a count stops there. With every rate at most 2^40, a count
// that high denies as a higher one would, and count + cost stays exact in
// the Redis scripts' doubles (below 2^53) and far from overflowing an int64.
const MaxCount = 1 << 52

// ahead is tat + inc for a key charged inc nanoseconds of refill at now,
// no further than MaxAhead ahead of now.
func ahead(tat, inc, now int64) int64 {
	if limit := now + int64(MaxAhead); inc >= limit-tat {
		return max(limit, tat)
	}
	return tat + inc
}

// addCount is count + cost for the counting algorithms, at most MaxCount.
func addCount(count, cost int64) int64 {
	return min(count+min(cost, MaxCount), MaxCount)
}

// MaxLogRate bounds the rate of a sliding_window_log limit in sluice
// serve's config, its Envoy descriptors and overrides (the library takes
// any). The log keeps every admission of its window, and each decision
// reads and rewrites it (in Redis, the key's whole list on every call): at
// a rate of a million per window one hot key would stall the Redis that
// every decision of the fleet shares.
const MaxLogRate = 10_000

// LogRateProblem says why l is too high a rate for algorithm a, or "".
func LogRateProblem(a sluice.Algorithm, l sluice.Limit) string {
	if a != sluice.SlidingWindowLog || l.Rate <= MaxLogRate {
		return ""
	}
	return fmt.Sprintf("sliding_window_log keeps every admission of its window, at most %d (here %d, each decision reading and rewriting them all); use sliding_window_counter for a higher rate", MaxLogRate, l.Rate)
}
