package sluice

import (
	"fmt"
	"strings"
)

// Algorithm names a rate-limiting algorithm. The zero value is invalid;
// [Options] treats it as GCRA.
type Algorithm uint8

// The algorithms sluice implements. Each store implements all of them with
// the same semantics; package algo holds the reference implementation.
const (
	// GCRA, the generic cell rate algorithm, behaves like a token bucket but
	// keeps a single timestamp per key. It is the default: the cheapest in
	// memory and in Redis.
	GCRA Algorithm = iota + 1
	// TokenBucket keeps a level and the time of the last refill per key:
	// the tutorial's algorithm, with the same answers as GCRA.
	TokenBucket
	// SlidingWindowLog keeps the events admitted in the last Period, one
	// timestamp and count per instant that admitted any: exact, but its
	// memory per key grows with the distinct instants (bounded by Rate).
	// A Limit.Granularity g stamps admissions at the end of their g-long
	// slot instead, bounding a key to Period/g + 1 entries at any rate,
	// still never more than Rate in any Period. Prefer
	// SlidingWindowCounter for large limits without a granularity.
	SlidingWindowLog
	// SlidingWindowCounter weighs the previous fixed window's count by how
	// much of it still overlaps the sliding window: two integers per key.
	SlidingWindowCounter
	// FixedWindow counts events in windows of Period aligned to the Unix
	// epoch, the way envoyproxy/ratelimit does; or, when the Limit has a
	// Calendar, in calendar windows of its time zone (local days, weeks,
	// months or years). It is the one algorithm for calendar limits.
	FixedWindow
	// Concurrency bounds how many leases are held at once. Limit.Rate is the
	// number of slots and Limit.Period the lease time-to-live: a holder that
	// crashes without releasing loses its slot after Period.
	Concurrency
)

var algorithmNames = [...]string{
	GCRA:                 "gcra",
	TokenBucket:          "token_bucket",
	SlidingWindowLog:     "sliding_window_log",
	SlidingWindowCounter: "sliding_window_counter",
	FixedWindow:          "fixed_window",
	Concurrency:          "concurrency",
}

// Algorithms lists every algorithm, in declaration order.
func Algorithms() []Algorithm {
	return []Algorithm{GCRA, TokenBucket, SlidingWindowLog, SlidingWindowCounter, FixedWindow, Concurrency}
}

// String returns the algorithm's configuration name, such as "token_bucket".
func (a Algorithm) String() string {
	if a.Valid() {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", a)
}

// Valid reports whether a is one of the declared algorithms.
func (a Algorithm) Valid() bool { return a >= GCRA && a <= Concurrency }

// ParseAlgorithm reads an algorithm name as String writes it. It also takes
// "sliding_window" for SlidingWindowCounter and dashes for underscores.
func ParseAlgorithm(s string) (Algorithm, error) {
	name := strings.ReplaceAll(strings.ToLower(strings.TrimSpace(s)), "-", "_")
	if name == "sliding_window" {
		return SlidingWindowCounter, nil
	}
	for _, a := range Algorithms() {
		if algorithmNames[a] == name {
			return a, nil
		}
	}
	return 0, fmt.Errorf("%w %q; valid: %s", ErrUnknownAlgorithm, s, strings.Join(algorithmNames[1:], ", "))
}

// MarshalText implements encoding.TextMarshaler.
func (a Algorithm) MarshalText() ([]byte, error) {
	if !a.Valid() {
		return nil, fmt.Errorf("%w: %d", ErrUnknownAlgorithm, a)
	}
	return []byte(a.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler with ParseAlgorithm.
func (a *Algorithm) UnmarshalText(b []byte) error {
	v, err := ParseAlgorithm(string(b))
	if err != nil {
		return err
	}
	*a = v
	return nil
}
