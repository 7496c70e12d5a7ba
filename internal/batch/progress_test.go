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
