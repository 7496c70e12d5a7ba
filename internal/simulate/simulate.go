// Package simulate replays a traffic pattern through rate-limit algorithms
// on a virtual clock and tabulates what each admits: the tutorial's
// "token bucket vs sliding window" comparison, done properly. Every
// algorithm sees the same arrivals on its own memory store, so the numbers
// differ only by algorithm.
package simulate

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
)

// ErrBadPattern means a traffic pattern could not be built or read.
var ErrBadPattern = errors.New("simulate: bad traffic pattern")

// maxArrivals bounds a simulation, so that a typo cannot exhaust memory.
const maxArrivals = 5_000_000

// Pattern names a built-in traffic shape.
type Pattern string

// The built-in traffic shapes.
const (
	// Steady offers RPS requests per second, evenly spaced.
	Steady Pattern = "steady"
	// Burst offers a quarter of RPS steadily, plus a spike of RPS·2
	// requests at once every 5 seconds: what a bulk client does.
	Burst Pattern = "burst"
	// Ramp rises linearly from nothing to 2·RPS over the duration.
	Ramp Pattern = "ramp"
)

// Patterns lists the built-in patterns.
func Patterns() []Pattern { return []Pattern{Steady, Burst, Ramp} }

// Generate returns the arrival offsets of a built-in pattern, sorted.
func Generate(p Pattern, rps float64, duration time.Duration) ([]time.Duration, error) {
	if !(rps > 0) || math.IsInf(rps, 0) {
		return nil, fmt.Errorf("%w: rate %v must be a positive number", ErrBadPattern, rps)
	}
	if duration <= 0 {
		return nil, fmt.Errorf("%w: duration %s must be positive", ErrBadPattern, duration)
	}
	if rps*2*duration.Seconds() > maxArrivals {
		return nil, fmt.Errorf("%w: %v/s for %s is over %d requests", ErrBadPattern, rps, duration, maxArrivals)
	}
	var out []time.Duration
	even := func(r float64, from, to time.Duration) {
		step := time.Duration(float64(time.Second) / r)
		for t := from; t < to; t += step {
			out = append(out, t)
		}
	}
	switch p {
	case Steady:
		even(rps, 0, duration)
	case Burst:
		even(rps/4, 0, duration)
		spike := int(rps * 2)
		for at := time.Second; at < duration; at += 5 * time.Second {
			for range spike {
				out = append(out, at)
			}
		}
	case Ramp:
		// rate(t) = 2·rps·t/D; arrival k at t = D·sqrt(k/(rps·D))
		total := int(rps * duration.Seconds())
		for k := range total {
			out = append(out, time.Duration(float64(duration)*math.Sqrt(float64(k)/float64(total))))
		}
	default:
		return nil, fmt.Errorf("%w: unknown pattern %q; valid: steady, burst, ramp, or file:PATH", ErrBadPattern, p)
	}
	slices.Sort(out)
	return out, nil
}

// ReadArrivals reads one arrival per line: seconds since the start, such as
// "0.25", or an RFC 3339 timestamp, taken relative to the first line.
// Blank lines and lines starting with # are skipped.
func ReadArrivals(r io.Reader) ([]time.Duration, error) {
	var out []time.Duration
	var first time.Time
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		if len(out) >= maxArrivals {
			return nil, fmt.Errorf("%w: more than %d arrivals", ErrBadPattern, maxArrivals)
		}
		if secs, err := strconv.ParseFloat(text, 64); err == nil {
			if secs < 0 || math.IsNaN(secs) || secs > 366*24*3600 {
				return nil, fmt.Errorf("%w: line %d: %q is not a time offset in seconds", ErrBadPattern, line, text)
			}
			out = append(out, time.Duration(secs*float64(time.Second)))
			continue
		}
		ts, err := time.Parse(time.RFC3339Nano, text)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %q is neither seconds nor an RFC 3339 time", ErrBadPattern, line, text)
		}
		if first.IsZero() {
			first = ts
		}
		if d := ts.Sub(first); d >= 0 {
			out = append(out, d)
		} else {
			return nil, fmt.Errorf("%w: line %d: %s is before the first timestamp", ErrBadPattern, line, text)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("simulate: reading arrivals: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no arrivals", ErrBadPattern)
	}
	slices.Sort(out)
	return out, nil
}

// Result holds what each algorithm admitted, per bucket of time.
type Result struct {
	// Bucket is the width of one row, usually a second.
	Bucket time.Duration
	// Limit is the limit every algorithm enforced.
	Limit sluice.Limit
	// Offered counts the arrivals per bucket.
	Offered []int
	// Algorithms lists the algorithms in the order they were run.
	Algorithms []sluice.Algorithm
	// Allowed counts the admitted arrivals per algorithm and bucket.
	Allowed map[sluice.Algorithm][]int
}

// Run replays arrivals through each algorithm under limit, on a virtual
// clock, and counts per bucket.
func Run(ctx context.Context, limit sluice.Limit, algos []sluice.Algorithm, arrivals []time.Duration, bucket time.Duration) (*Result, error) {
	if err := limit.Validate(); err != nil {
		return nil, fmt.Errorf("simulate: %w", err)
	}
	if bucket <= 0 || len(arrivals) == 0 {
		return nil, fmt.Errorf("%w: need arrivals and a positive bucket", ErrBadPattern)
	}
	n := int(arrivals[len(arrivals)-1]/bucket) + 1
	res := &Result{Bucket: bucket, Limit: limit, Offered: make([]int, n), Algorithms: algos, Allowed: map[sluice.Algorithm][]int{}}
	for _, at := range arrivals {
		res.Offered[at/bucket]++
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, a := range algos {
		if a == sluice.Concurrency || !a.Valid() {
			return nil, fmt.Errorf("simulate: %w: %s cannot be simulated on arrivals alone", sluice.ErrUnknownAlgorithm, a)
		}
		clk := clock.NewFake(start)
		store, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
		if err != nil {
			return nil, err
		}
		lim, err := sluice.NewLimiter(sluice.Options{Store: store, Limit: limit, Algorithm: a})
		if err != nil {
			return nil, err
		}
		counts := make([]int, n)
		for _, at := range arrivals {
			clk.Set(start.Add(at))
			d, err := lim.Allow(ctx, "sim")
			if err != nil {
				return nil, fmt.Errorf("simulate: %s: %w", a, err)
			}
			if d.Allowed {
				counts[at/bucket]++
			}
		}
		res.Allowed[a] = counts
		_ = store.Close()
	}
	return res, nil
}

// Total returns the admitted count of algorithm a over the whole run.
func (r *Result) Total(a sluice.Algorithm) int {
	sum := 0
	for _, c := range r.Allowed[a] {
		sum += c
	}
	return sum
}

// WriteTable prints one row per bucket: the offered count, then allowed
// and denied per algorithm, and a totals row.
func (r *Result) WriteTable(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "limit %s, %s per row\n\n", r.Limit, r.Bucket)
	fmt.Fprintf(bw, "%8s %8s", "t", "offered")
	for _, a := range r.Algorithms {
		fmt.Fprintf(bw, " %24s", a.String()+" ok/denied")
	}
	fmt.Fprintln(bw)
	offered := 0
	for i, o := range r.Offered {
		offered += o
		fmt.Fprintf(bw, "%8s %8d", time.Duration(i)*r.Bucket, o)
		for _, a := range r.Algorithms {
			ok := r.Allowed[a][i]
			fmt.Fprintf(bw, " %24s", fmt.Sprintf("%d/%d", ok, o-ok))
		}
		fmt.Fprintln(bw)
	}
	fmt.Fprintf(bw, "%8s %8d", "total", offered)
	for _, a := range r.Algorithms {
		t := r.Total(a)
		fmt.Fprintf(bw, " %24s", fmt.Sprintf("%d/%d", t, offered-t))
	}
	fmt.Fprintln(bw)
	return bw.Flush()
}
