package batch

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestProgressBar(t *testing.T) {
	var c counters
	start := time.Unix(1000, 0)
	p := &progress{total: 110, start: start, c: &c}
	c.skipped.Add(10)
	c.ok.Add(40)
	c.failed.Add(10)
	c.retrying.Add(2)
	c.addUsage("m", 12000, 3000)
	got := p.bar(start.Add(10 * time.Second))
	for _, want := range []string{"[============>           ]", " 50% 50/100", "5.0/s", "ETA 10s", "ok 40 failed 10 retrying 2", "15.0k tok"} {
		if !strings.Contains(got, want) {
			t.Errorf("bar %q lacks %q", got, want)
		}
	}
	var buf bytes.Buffer
	p.log = slog.New(slog.NewTextHandler(&buf, nil))
	p.logLine(start.Add(10 * time.Second))
	for _, want := range []string{"done=50", "total=100", "ok=40", "failed=10", "retrying=2", "rate_per_s=5.00", "eta=10s", "tokens=15000"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log line %q lacks %q", buf.String(), want)
		}
	}
	// Unknown total: a count, no ETA.
	p.total = 0
	if got := p.bar(start.Add(time.Second)); !strings.HasPrefix(got, "50 done") || strings.Contains(got, "ETA") {
		t.Errorf("bar without total: %q", got)
	}
}

func TestProgressRunDrawsOnTTY(t *testing.T) {
	var c counters
	var buf bytes.Buffer
	p := &progress{w: &buf, tty: true, total: 1, start: time.Now(), c: &c}
	stop, done := make(chan struct{}), make(chan struct{})
	go p.run(stop, done)
	c.ok.Add(1)
	close(stop)
	<-done
	if out := buf.String(); !strings.Contains(out, "\r\x1b[K[========================] 100% 1/1") || !strings.HasSuffix(out, "\n") {
		t.Fatalf("tty output %q", out)
	}
}

// TestProgressShowsWait: during an announced wait the bar says so, and the
// ETA counts the wait, then the prompts left at the rate seen before it.
func TestProgressShowsWait(t *testing.T) {
	var c counters
	start := time.Unix(1000, 0)
	p := &progress{total: 30, start: start, c: &c}
	c.ok.Add(28)
	now := start.Add(28 * time.Second) // 1 prompt/s
	c.waiting(now.Add(3*time.Minute), true)
	got := p.bar(now)
	for _, want := range []string{"waiting for rate limit, 3m0s", "ETA 3m2s"} {
		if !strings.Contains(got, want) {
			t.Errorf("bar %q lacks %q", got, want)
		}
	}
	// A minute into the wait: the ETA went down by a minute, not up.
	got = p.bar(now.Add(time.Minute))
	for _, want := range []string{"waiting for rate limit, 2m0s", "ETA 2m2s"} {
		if !strings.Contains(got, want) {
			t.Errorf("bar %q lacks %q", got, want)
		}
	}
	// An earlier wait does not shorten the announced one; a retry wait
	// that is not a 429 is named as such.
	c.waiting(now, false)
	if _, w := c.wait(now.Add(time.Minute)); w != "waiting for rate limit, 2m0s" {
		t.Errorf("wait %q", w)
	}
	var buf bytes.Buffer
	p.log = slog.New(slog.NewJSONHandler(&buf, nil))
	p.logLine(now.Add(time.Minute))
	for _, want := range []string{`"waiting":"waiting for rate limit, 2m0s"`, `"eta":"2m2s"`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log line %s lacks %s", buf.String(), want)
		}
	}
	// After the wait: no wait shown.
	if got := p.bar(now.Add(4 * time.Minute)); strings.Contains(got, "waiting") {
		t.Errorf("bar %q after the wait", got)
	}
}
