package simulate

import (
	"bufio"
	"context"
	"fmt"
	"html"
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
	const (
		width, height = 960.0, 480.0
		left, right   = 60.0, 260.0
		top, bottom   = 40.0, 50.0
	)
	plotW, plotH := width-left-right, height-top-bottom
	n := r.rows()
	peak := 1
	for i := range n {
		peak = max(peak, at(r.Offered, i))
		for _, a := range r.Algorithms {
			peak = max(peak, at(r.Allowed[a], i), at(r.Passed[a], i))
		}
	}
	x := func(i float64) float64 { return left + plotW*i/float64(n) }
	y := func(v float64) float64 { return top + plotH - plotH*v/float64(peak) }
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(bw, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(bw, `<text x="%.0f" y="24" font-size="16">%s: admitted per %s</text>`+"\n", left,
		html.EscapeString(fmt.Sprintf("limit %s, delay mode max wait %s", r.Limit, r.MaxWait)), r.Bucket)
	barW := plotW / float64(n)
	for i, o := range r.Offered {
		fmt.Fprintf(bw, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#ddd"><title>t=%s offered %d</title></rect>`+"\n",
			x(float64(i))+barW*0.1, y(float64(o)), barW*0.8, top+plotH-y(float64(o)), time.Duration(i)*r.Bucket, o)
	}
	steady := float64(r.Limit.Rate) * float64(r.Bucket) / float64(r.Limit.Period)
	if steady <= float64(peak) {
		fmt.Fprintf(bw, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#555" stroke-dasharray="2 3"/>`+"\n", left, left+plotW, y(steady), y(steady))
	}
	fmt.Fprintf(bw, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, left+plotW, top+plotH, top+plotH)
	fmt.Fprintf(bw, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, left, top, top+plotH)
	for k := 0; k <= 4; k++ {
		v := float64(peak) * float64(k) / 4
		fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" text-anchor="end">%.0f</text>`+"\n", left-6, y(v)+4, v)
	}
	for i := 0; i < n; i += max(1, n/10) {
		fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x(float64(i)+0.5), top+plotH+18, time.Duration(i)*r.Bucket)
	}
	fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" text-anchor="middle">time</text>`+"\n", left+plotW/2, height-8)
	line := func(series []int, colour, dash, name, label string, ly float64) {
		fmt.Fprintf(bw, `<polyline fill="none" stroke="%s" stroke-width="2.5" stroke-opacity="0.85" stroke-dasharray="%s" data-series="%s" points="`, colour, dash, name)
		for i := range n {
			fmt.Fprintf(bw, "%.1f,%.1f ", x(float64(i)+0.5), y(float64(at(series, i))))
		}
		fmt.Fprintln(bw, `"/>`)
		fmt.Fprintf(bw, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="3" stroke-dasharray="%s"/>`+"\n", width-right+15, width-right+40, ly, ly, colour, dash)
		fmt.Fprintf(bw, `<text x="%.1f" y="%.1f">%s</text>`+"\n", width-right+46, ly+4, html.EscapeString(label))
	}
	ly := top
	for k, a := range r.Algorithms {
		colour := palette[k%len(palette)]
		line(r.Allowed[a], colour, "none", a.String(), fmt.Sprintf("%s, at once (%d)", a, sum(r.Allowed[a])), ly)
		line(r.Passed[a], colour, "7 4", a.String()+"+wait", fmt.Sprintf("%s, max wait %s (%d)", a, r.MaxWait, sum(r.Passed[a])), ly+20)
		ly += 40
	}
	fmt.Fprintf(bw, `<rect x="%.1f" y="%.1f" width="25" height="10" fill="#ddd"/><text x="%.1f" y="%.1f">offered</text>`+"\n", width-right+15, ly-5, width-right+46, ly+4)
	fmt.Fprintf(bw, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#555" stroke-dasharray="2 3"/><text x="%.1f" y="%.1f">steady rate</text>`+"\n", width-right+15, width-right+40, ly+20, ly+20, width-right+46, ly+24)
	fmt.Fprintln(bw, "</svg>")
	return bw.Flush()
}
