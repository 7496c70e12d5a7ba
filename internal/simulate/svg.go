package simulate

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"time"
)

// palette colours the algorithms' lines; it is read, never written.
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"}

// WriteSVG draws the result as a chart: offered requests per bucket as grey
// bars, each algorithm's admitted requests as a coloured line, the limit's
// steady rate as a dashed line, with axes and a legend.
func (r *Result) WriteSVG(w io.Writer) error {
	const (
		width, height = 960.0, 480.0
		left, right   = 60.0, 260.0
		top, bottom   = 40.0, 50.0
	)
	plotW, plotH := width-left-right, height-top-bottom
	n := len(r.Offered)
	peak := 1
	for i := range n {
		peak = max(peak, r.Offered[i])
		for _, a := range r.Algorithms {
			peak = max(peak, r.Allowed[a][i])
		}
	}
	x := func(i float64) float64 { return left + plotW*i/float64(n) }
	y := func(v float64) float64 { return top + plotH - plotH*v/float64(peak) }
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(bw, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(bw, `<text x="%.0f" y="24" font-size="16">%s: admitted per %s</text>`+"\n", left, html.EscapeString("limit "+r.Limit.String()), r.Bucket)
	// bars: offered
	barW := plotW / float64(n)
	for i, o := range r.Offered {
		fmt.Fprintf(bw, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#ddd"><title>t=%s offered %d</title></rect>`+"\n",
			x(float64(i))+barW*0.1, y(float64(o)), barW*0.8, top+plotH-y(float64(o)), time.Duration(i)*r.Bucket, o)
	}
	// steady rate per bucket
	steady := float64(r.Limit.Rate) * float64(r.Bucket) / float64(r.Limit.Period)
	if steady <= float64(peak) {
		fmt.Fprintf(bw, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#555" stroke-dasharray="6 4"/>`+"\n", left, left+plotW, y(steady), y(steady))
	}
	// axes and ticks
	fmt.Fprintf(bw, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, left+plotW, top+plotH, top+plotH)
	fmt.Fprintf(bw, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, left, top, top+plotH)
	for k := 0; k <= 4; k++ {
		v := float64(peak) * float64(k) / 4
		fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" text-anchor="end">%.0f</text>`+"\n", left-6, y(v)+4, v)
	}
	step := max(1, n/10)
	for i := 0; i < n; i += step {
		fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x(float64(i)+0.5), top+plotH+18, time.Duration(i)*r.Bucket)
	}
	fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" text-anchor="middle">time</text>`+"\n", left+plotW/2, height-8)
	// lines: admitted
	for k, a := range r.Algorithms {
		colour := palette[k%len(palette)]
		// Earlier lines are drawn wider, so that algorithms that agree
		// still show one above the other.
		stroke := 2 + 2*float64(len(r.Algorithms)-1-k)
		fmt.Fprintf(bw, `<polyline fill="none" stroke="%s" stroke-width="%.0f" stroke-opacity="0.85" data-algorithm="%s" points="`, colour, stroke, a)
		for i, c := range r.Allowed[a] {
			fmt.Fprintf(bw, "%.1f,%.1f ", x(float64(i)+0.5), y(float64(c)))
		}
		fmt.Fprintln(bw, `"/>`)
		ly := top + 20*float64(k)
		fmt.Fprintf(bw, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/>`+"\n", width-right+15, width-right+40, ly, ly, colour)
		fmt.Fprintf(bw, `<text x="%.1f" y="%.1f">%s (%d)</text>`+"\n", width-right+46, ly+4, a, r.Total(a))
	}
	ly := top + 20*float64(len(r.Algorithms))
	fmt.Fprintf(bw, `<rect x="%.1f" y="%.1f" width="25" height="10" fill="#ddd"/><text x="%.1f" y="%.1f">offered</text>`+"\n", width-right+15, ly-5, width-right+46, ly+4)
	fmt.Fprintf(bw, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#555" stroke-dasharray="6 4"/><text x="%.1f" y="%.1f">steady rate</text>`+"\n", width-right+15, width-right+40, ly+20, ly+20, width-right+46, ly+24)
	fmt.Fprintln(bw, "</svg>")
	return bw.Flush()
}
