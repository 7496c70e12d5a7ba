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

// chart is what every chart of this package draws: counts per time bucket
// as coloured lines over optional grey bars (the offered requests), a
// dashed reference line (a steady rate), axes and a legend.
type chart struct {
	title  string
	bucket time.Duration
	n      int   // buckets shown
	bars   []int // offered per bucket; nil for none
	peak   int   // the y axis' top at least; raised to fit bars and lines
	lines  []chartLine
	// ref is the reference line's value, drawn when it fits under the
	// peak, dashed as refDash and named refLabel in the legend.
	ref               float64
	refDash, refLabel string
}

// chartLine is one line of a chart.
type chartLine struct {
	values []int
	colour string
	dash   string  // stroke-dasharray; "" for solid
	width  float64 // stroke width
	attr   string  // the polyline's data-<attr>="<name>", for tests and tools
	name   string
	label  string // the legend's text
}

// write renders c as SVG.
func (c *chart) write(w io.Writer) error {
	const (
		width, height = 960.0, 480.0
		left, right   = 60.0, 260.0
		top, bottom   = 40.0, 50.0
	)
	plotW, plotH := width-left-right, height-top-bottom
	n := max(c.n, 1)
	peak := max(c.peak, 1)
	for i := range n {
		peak = max(peak, at(c.bars, i))
		for _, l := range c.lines {
			peak = max(peak, at(l.values, i))
		}
	}
	x := func(i float64) float64 { return left + plotW*i/float64(n) }
	y := func(v float64) float64 { return top + plotH - plotH*v/float64(peak) }
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(bw, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(bw, `<text x="%.0f" y="24" font-size="16">%s</text>`+"\n", left, html.EscapeString(c.title))
	barW := plotW / float64(n)
	for i, o := range c.bars {
		fmt.Fprintf(bw, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#ddd"><title>t=%s offered %d</title></rect>`+"\n",
			x(float64(i))+barW*0.1, y(float64(o)), barW*0.8, top+plotH-y(float64(o)), time.Duration(i)*c.bucket, o)
	}
	if c.ref <= float64(peak) {
		fmt.Fprintf(bw, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#555" stroke-dasharray="%s"/>`+"\n", left, left+plotW, y(c.ref), y(c.ref), c.refDash)
	}
	// Axes and ticks.
	fmt.Fprintf(bw, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, left+plotW, top+plotH, top+plotH)
	fmt.Fprintf(bw, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, left, top, top+plotH)
	for k := 0; k <= 4; k++ {
		v := float64(peak) * float64(k) / 4
		fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" text-anchor="end">%.0f</text>`+"\n", left-6, y(v)+4, v)
	}
	for i := 0; i < n; i += max(1, n/10) {
		fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x(float64(i)+0.5), top+plotH+18, time.Duration(i)*c.bucket)
	}
	fmt.Fprintf(bw, `<text x="%.1f" y="%.1f" text-anchor="middle">time</text>`+"\n", left+plotW/2, height-8)
	// Lines, each with its legend row.
	ly := top
	for _, l := range c.lines {
		dash := l.dash
		if dash == "" {
			dash = "none"
		}
		fmt.Fprintf(bw, `<polyline fill="none" stroke="%s" stroke-width="%g" stroke-opacity="0.85" stroke-dasharray="%s" data-%s="%s" points="`,
			l.colour, l.width, dash, l.attr, html.EscapeString(l.name))
		for i := range n {
			fmt.Fprintf(bw, "%.1f,%.1f ", x(float64(i)+0.5), y(float64(at(l.values, i))))
		}
		fmt.Fprintln(bw, `"/>`)
		fmt.Fprintf(bw, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="3" stroke-dasharray="%s"/>`+"\n", width-right+15, width-right+40, ly, ly, l.colour, dash)
		fmt.Fprintf(bw, `<text x="%.1f" y="%.1f">%s</text>`+"\n", width-right+46, ly+4, html.EscapeString(l.label))
		ly += 20
	}
	if c.bars != nil {
		fmt.Fprintf(bw, `<rect x="%.1f" y="%.1f" width="25" height="10" fill="#ddd"/><text x="%.1f" y="%.1f">offered</text>`+"\n", width-right+15, ly-5, width-right+46, ly+4)
		ly += 20
	}
	fmt.Fprintf(bw, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#555" stroke-dasharray="%s"/><text x="%.1f" y="%.1f">%s</text>`+"\n",
		width-right+15, width-right+40, ly, ly, c.refDash, width-right+46, ly+4, html.EscapeString(c.refLabel))
	fmt.Fprintln(bw, "</svg>")
	return bw.Flush()
}

// steadyPerBucket is how many requests limit-like rate/period admits per
// bucket at its steady rate.
func steadyPerBucket(rate int64, period, bucket time.Duration) float64 {
	return float64(rate) * float64(bucket) / float64(period)
}

// WriteSVG draws the result as a chart: offered requests per bucket as grey
// bars, each algorithm's admitted requests as a coloured line, the limit's
// steady rate as a dashed line, with axes and a legend.
func (r *Result) WriteSVG(w io.Writer) error {
	c := &chart{
		title: fmt.Sprintf("limit %s: admitted per %s", r.Limit, r.Bucket), bucket: r.Bucket, n: len(r.Offered), bars: r.Offered,
		ref: steadyPerBucket(r.Limit.Rate, r.Limit.Period, r.Bucket), refDash: "6 4", refLabel: "steady rate",
	}
	for k, a := range r.Algorithms {
		c.lines = append(c.lines, chartLine{
			values: r.Allowed[a], colour: palette[k%len(palette)],
			// Earlier lines are drawn wider, so that algorithms that
			// agree still show one above the other.
			width: 2 + 2*float64(len(r.Algorithms)-1-k),
			attr:  "algorithm", name: a.String(), label: fmt.Sprintf("%s (%d)", a, r.Total(a)),
		})
	}
	return c.write(w)
}
