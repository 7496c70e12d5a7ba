package batch

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// counters are the run's live numbers, updated by the workers.
type counters struct {
	ok, failed, retrying, retried, retries atomic.Int64
	promptTokens, completionTokens         atomic.Int64
	// skipped counts input lines not called: done or failed before, or
	// duplicate ids.
	skipped, interrupted atomic.Int64
	// waitUntil is when the latest announced retry wait ends (Unix
	// nanoseconds), and waitRateLimit whether that wait is for a 429.
	waitUntil     atomic.Int64
	waitRateLimit atomic.Bool

	mu      sync.Mutex
	byModel map[string]*[2]int64 // prompt, completion tokens
}

// maxModels bounds the per-model token table; further models are summed
// under one unpriced entry.
const maxModels = 256

const otherModels = "(other models)"

// waiting records that a call waits until t before its retry, raising the
// run's announced wait if t is later.
func (c *counters) waiting(t time.Time, rateLimit bool) {
	n := t.UnixNano()
	for {
		cur := c.waitUntil.Load()
		if n <= cur {
			return
		}
		if c.waitUntil.CompareAndSwap(cur, n) {
			c.waitRateLimit.Store(rateLimit)
			return
		}
	}
}

// wait returns how long the announced wait still lasts at now, and a
// description of it; zero when none.
func (c *counters) wait(now time.Time) (time.Duration, string) {
	d := time.Duration(c.waitUntil.Load() - now.UnixNano())
	if d <= 0 {
		return 0, ""
	}
	d = d.Round(time.Second)
	if c.waitRateLimit.Load() {
		return d, "waiting for rate limit, " + d.String()
	}
	return d, "waiting to retry, " + d.String()
}

func (c *counters) addUsage(model string, prompt, completion int64) {
	c.promptTokens.Add(prompt)
	c.completionTokens.Add(completion)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byModel == nil {
		c.byModel = map[string]*[2]int64{}
	}
	m, ok := c.byModel[model]
	if !ok {
		if len(c.byModel) >= maxModels {
			model = otherModels
		}
		if m, ok = c.byModel[model]; !ok {
			m = new([2]int64)
			c.byModel[model] = m
		}
	}
	m[0] += prompt
	m[1] += completion
}

// progress reports the run's progress: a redrawn bar on a terminal, or a
// log line every interval otherwise.
type progress struct {
	w        io.Writer
	tty      bool
	interval time.Duration
	total    int64 // prompts in the input, 0 when unknown
	start    time.Time
	c        *counters
	log      *slog.Logger
	waitSeen time.Time // when the current wait was first seen; zero when none
}

func (p *progress) run(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	every := p.interval
	if p.tty {
		every = 200 * time.Millisecond
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			if p.tty {
				fmt.Fprintf(p.w, "\r\x1b[K%s\n", p.bar(time.Now()))
			}
			return
		case now := <-t.C:
			if p.tty {
				fmt.Fprintf(p.w, "\r\x1b[K%s", p.bar(now))
			} else {
				p.logLine(now)
			}
		}
	}
}

// snapshot returns the done count, the rate per second, the ETA (0 when
// unknown) and the wait under way ("" when none). During a wait the ETA
// is the wait plus the time the prompts left take at the rate seen so far
// (not counting the wait), so that it does not stand still while nothing
// completes.
func (p *progress) snapshot(now time.Time) (done int64, rate float64, eta time.Duration, wait string) {
	done = p.c.ok.Load() + p.c.failed.Load()
	if el := now.Sub(p.start).Seconds(); el > 0 {
		rate = float64(done) / el
	}
	waitLeft, wait := p.c.wait(now)
	if left := p.total - done - p.c.skipped.Load(); p.total > 0 && left > 0 {
		r := rate
		if waitLeft > 0 {
			// The rate before the wait began: the wait is counted once.
			if el := now.Add(-p.waitElapsed(now)).Sub(p.start).Seconds(); el > 0 {
				r = float64(done) / el
			}
		}
		if r > 0 {
			eta = waitLeft + time.Duration(float64(left)/r*float64(time.Second))
			eta = eta.Round(time.Second)
		}
	}
	return done, rate, eta, wait
}

// waitElapsed is how long the progress has seen the current wait last.
func (p *progress) waitElapsed(now time.Time) time.Duration {
	if p.waitSeen.IsZero() {
		p.waitSeen = now
	}
	return now.Sub(p.waitSeen)
}

func (p *progress) bar(now time.Time) string {
	done, rate, eta, wait := p.snapshot(now)
	if wait == "" {
		p.waitSeen = time.Time{}
	}
	var b strings.Builder
	todo := p.total - p.c.skipped.Load()
	if todo > 0 {
		const width = 24
		frac := min(float64(done)/float64(todo), 1)
		fill := int(frac * width)
		b.WriteByte('[')
		b.WriteString(strings.Repeat("=", fill))
		if fill < width {
			b.WriteByte('>')
			b.WriteString(strings.Repeat(" ", width-fill-1))
		}
		fmt.Fprintf(&b, "] %3.0f%% %d/%d", frac*100, done, todo)
	} else {
		fmt.Fprintf(&b, "%d done", done)
	}
	fmt.Fprintf(&b, " | %.1f/s", rate)
	if wait != "" {
		fmt.Fprintf(&b, " | %s", wait)
	}
	if eta > 0 {
		fmt.Fprintf(&b, " | ETA %s", eta)
	}
	fmt.Fprintf(&b, " | ok %d failed %d retrying %d | %s tok",
		p.c.ok.Load(), p.c.failed.Load(), p.c.retrying.Load(), humanCount(p.c.promptTokens.Load()+p.c.completionTokens.Load()))
	return b.String()
}

func (p *progress) logLine(now time.Time) {
	done, rate, eta, wait := p.snapshot(now)
	if wait == "" {
		p.waitSeen = time.Time{}
	}
	attrs := []any{"done", done, "total", max(p.total-p.c.skipped.Load(), 0), "ok", p.c.ok.Load(), "failed", p.c.failed.Load(),
		"retrying", p.c.retrying.Load(), "rate_per_s", fmt.Sprintf("%.2f", rate), "eta", eta.String(),
		"tokens", p.c.promptTokens.Load() + p.c.completionTokens.Load()}
	if wait != "" {
		attrs = append(attrs, "waiting", wait)
	}
	p.log.Info("batch progress", attrs...)
}

func humanCount(n int64) string {
	switch {
	case n >= 10_000_000:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 10_000:
		return fmt.Sprintf("%.1fk", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}
