package simulate

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
)

// DelayResult compares algorithms with and without delay mode (a max wait,
// as `max_wait` in sluice serve): the same arrivals, once answered at once
// (admitted or denied), once reserved, held and sent after their delay.
type DelayResult struct {
	// Bucket is the width of one row.
	Bucket time.Duration
	// Limit is the limit every run enforced.
	Limit sluice.Limit
	// MaxWait is the delay mode's max wait.
	MaxWait time.Duration
	// Offered counts the arrivals per bucket.
	Offered []int
	// Algorithms lists the algorithms, in the order they were run.
	Algorithms []sluice.Algorithm
	// Allowed counts, without delay mode, the admitted arrivals per
	// bucket; it has as many buckets as Offered.
	Allowed map[sluice.Algorithm][]int
	// Passed counts, in delay mode, the requests per bucket of the time
	// they went ahead (arrival plus delay); it may have more buckets than
	// Offered, the last arrivals' delays running past the last arrival.
	Passed map[sluice.Algorithm][]int
	// Denied counts, in delay mode, the denied arrivals per bucket.
	Denied map[sluice.Algorithm][]int
	// Held counts, in delay mode, the arrivals held per bucket.
	Held map[sluice.Algorithm][]int
	// TotalDelay and MaxDelay sum and bound the delays of each algorithm.
	TotalDelay, MaxDelay map[sluice.Algorithm]time.Duration
}

// RunDelay replays arrivals through each algorithm under limit twice, on a
// virtual clock: without delay mode, and with maxWait. Only algorithms
// that take reservations (GCRA and TokenBucket) can.
func RunDelay(ctx context.Context, limit sluice.Limit, algos []sluice.Algorithm, arrivals []time.Duration, bucket, maxWait time.Duration) (*DelayResult, error) {
	if maxWait <= 0 || maxWait > sluice.MaxReserveWait {
		return nil, fmt.Errorf("simulate: max wait %s must be between 0 and %s", maxWait, sluice.MaxReserveWait)
	}
	for _, a := range algos {
		if !sluice.Reserves(a) {
			return nil, fmt.Errorf("simulate: delay mode needs gcra or token_bucket, not %s", a)
		}
	}
	plain, err := Run(ctx, limit, algos, arrivals, bucket)
	if err != nil {
		return nil, err
	}
	n := len(plain.Offered)
	res := &DelayResult{
		Bucket: bucket, Limit: limit, MaxWait: maxWait, Offered: plain.Offered, Algorithms: algos, Allowed: plain.Allowed,
		Passed: map[sluice.Algorithm][]int{}, Denied: map[sluice.Algorithm][]int{}, Held: map[sluice.Algorithm][]int{},
		TotalDelay: map[sluice.Algorithm]time.Duration{}, MaxDelay: map[sluice.Algorithm]time.Duration{},
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, a := range algos {
		clk := clock.NewFake(start)
		store, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
		if err != nil {
			return nil, err
		}
		lim, err := sluice.NewLimiter(sluice.Options{Store: store, Limit: limit, Algorithm: a})
		if err != nil {
			return nil, err
		}
		passed := make([]int, int((arrivals[len(arrivals)-1]+maxWait)/bucket)+1)
		denied, held := make([]int, n), make([]int, n)
		for _, at := range arrivals {
			clk.Set(start.Add(at))
			r, err := lim.Reserve(ctx, "sim", 1, maxWait)
			if err != nil {
				return nil, fmt.Errorf("simulate: %s: %w", a, err)
			}
			d := r.Decision
			if !d.Allowed {
				denied[at/bucket]++
				continue
			}
			passed[(at+d.Delay)/bucket]++
			if d.Delay > 0 {
				held[at/bucket]++
				res.TotalDelay[a] += d.Delay
				res.MaxDelay[a] = max(res.MaxDelay[a], d.Delay)
			}
		}
		for len(passed) > n && passed[len(passed)-1] == 0 {
			passed = passed[:len(passed)-1]
		}
		res.Passed[a], res.Denied[a], res.Held[a] = passed, denied, held
		_ = store.Close()
	}
	return res, nil
}

func sum(xs []int) int {
	t := 0
	for _, x := range xs {
		t += x
	}
	return t
}

// rows is the number of buckets the table and chart show.
func (r *DelayResult) rows() int {
	n := len(r.Offered)
	for _, p := range r.Passed {
		n = max(n, len(p))
	}
	return n
}

func at(xs []int, i int) int {
	if i < len(xs) {
		return xs[i]
	}
	return 0
}

// WriteTable prints one row per bucket: the offered count; per algorithm
// what it admitted without delay mode, and in delay mode what went ahead
// in that bucket, was denied, and was held; then totals and the delays.
func (r *DelayResult) WriteTable(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "limit %s, delay mode with max wait %s, %s per row\n", r.Limit, r.MaxWait, r.Bucket)
	fmt.Fprintf(bw, "(ok/denied: answered at once; passed/denied/held: delay mode, passed counted when the request went ahead)\n\n")
	fmt.Fprintf(bw, "%8s %8s", "t", "offered")
	for _, a := range r.Algorithms {
		fmt.Fprintf(bw, " %22s %30s", a.String()+" ok/denied", a.String()+"+wait passed/denied/held")
	}
	fmt.Fprintln(bw)
	for i := range r.rows() {
		fmt.Fprintf(bw, "%8s %8d", time.Duration(i)*r.Bucket, at(r.Offered, i))
		for _, a := range r.Algorithms {
			ok := at(r.Allowed[a], i)
			fmt.Fprintf(bw, " %22s %30s", fmt.Sprintf("%d/%d", ok, at(r.Offered, i)-ok),
				fmt.Sprintf("%d/%d/%d", at(r.Passed[a], i), at(r.Denied[a], i), at(r.Held[a], i)))
		}
		fmt.Fprintln(bw)
	}
	offered := sum(r.Offered)
	fmt.Fprintf(bw, "%8s %8d", "total", offered)
	for _, a := range r.Algorithms {
		ok := sum(r.Allowed[a])
		fmt.Fprintf(bw, " %22s %30s", fmt.Sprintf("%d/%d", ok, offered-ok),
			fmt.Sprintf("%d/%d/%d", sum(r.Passed[a]), sum(r.Denied[a]), sum(r.Held[a])))
	}
	fmt.Fprintln(bw)
	fmt.Fprintln(bw)
	for _, a := range r.Algorithms {
		mean := time.Duration(0)
		if h := sum(r.Held[a]); h > 0 {
			mean = r.TotalDelay[a] / time.Duration(h)
		}
		fmt.Fprintf(bw, "%s delay mode: %d admitted instead of %d, %d held, mean delay %s, max %s\n",
			a, sum(r.Passed[a]), sum(r.Allowed[a]), sum(r.Held[a]), mean.Round(time.Millisecond), r.MaxDelay[a].Round(time.Millisecond))
	}
	return bw.Flush()
}

// WriteSVG draws the comparison: offered requests per bucket as grey bars,
// each algorithm's admitted requests without delay mode as a solid line and
// the requests that went ahead in delay mode as a dashed one, the limit's
// steady rate as a dotted line, with axes and a legend.
func (r *DelayResult) WriteSVG(w io.Writer) error {
	c := &chart{
		title:  fmt.Sprintf("limit %s, delay mode max wait %s: admitted per %s", r.Limit, r.MaxWait, r.Bucket),
		bucket: r.Bucket, n: r.rows(), bars: r.Offered,
		ref: steadyPerBucket(r.Limit.Rate, r.Limit.Period, r.Bucket), refDash: "2 3", refLabel: "steady rate",
	}
	for k, a := range r.Algorithms {
		colour := palette[k%len(palette)]
		c.lines = append(c.lines,
			chartLine{values: r.Allowed[a], colour: colour, width: 2.5, attr: "series", name: a.String(),
				label: fmt.Sprintf("%s, at once (%d)", a, sum(r.Allowed[a]))},
			chartLine{values: r.Passed[a], colour: colour, dash: "7 4", width: 2.5, attr: "series", name: a.String() + "+wait",
				label: fmt.Sprintf("%s, max wait %s (%d)", a, r.MaxWait, sum(r.Passed[a]))})
	}
	return c.write(w)
}
