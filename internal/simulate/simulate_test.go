package simulate_test

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/simulate"
)

func TestBurstComparison(t *testing.T) {
	arr, err := simulate.Generate(simulate.Burst, 20, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	limit := sluice.Limit{Rate: 10, Period: time.Second, Burst: 20}
	algos := []sluice.Algorithm{sluice.TokenBucket, sluice.GCRA, sluice.SlidingWindowLog, sluice.FixedWindow}
	res, err := simulate.Run(context.Background(), limit, algos, arr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Second 1 holds the spike of 40 plus 5 steady arrivals. The token
	// bucket spends its saved burst (20, minus the 1s of steady use it
	// refilled) on it; the windows admit their rate of 10 and no more.
	if got := res.Offered[1]; got != 45 {
		t.Fatalf("offered in second 1: %d", got)
	}
	for a, want := range map[sluice.Algorithm]int{sluice.TokenBucket: 24, sluice.GCRA: 24, sluice.SlidingWindowLog: 10, sluice.FixedWindow: 10} {
		if got := res.Allowed[a][1]; got != want {
			t.Errorf("%s admitted %d in the spike second, want %d", a, got, want)
		}
	}
	if res.Total(sluice.TokenBucket) != res.Total(sluice.GCRA) {
		t.Error("token bucket and GCRA disagree")
	}
	var table bytes.Buffer
	if err := res.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "24/21") || !strings.Contains(table.String(), "total") {
		t.Fatalf("table:\n%s", table.String())
	}
}

func TestSVGIsWellFormedAndNamesEachAlgorithm(t *testing.T) {
	arr, _ := simulate.Generate(simulate.Ramp, 30, 5*time.Second)
	algos := []sluice.Algorithm{sluice.TokenBucket, sluice.SlidingWindowCounter}
	res, err := simulate.Run(context.Background(), sluice.PerSecond(10), algos, arr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var svg bytes.Buffer
	if err := res.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	lines := polylines(t, &svg, "data-algorithm")
	for _, a := range algos {
		if !lines[a.String()] {
			t.Errorf("no line for %s", a)
		}
	}
}

// polylines checks that svg is well-formed XML and returns the values of
// attribute attr of its polylines.
func polylines(t *testing.T, svg io.Reader, attr string) map[string]bool {
	t.Helper()
	dec := xml.NewDecoder(svg)
	lines := map[string]bool{}
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return lines
		}
		if err != nil {
			t.Fatalf("chart is not well-formed XML: %v", err)
		}
		if el, ok := tok.(xml.StartElement); ok && el.Name.Local == "polyline" {
			for _, a := range el.Attr {
				if a.Name.Local == attr {
					lines[a.Value] = true
				}
			}
		}
	}
}

func TestReadArrivals(t *testing.T) {
	got, err := simulate.ReadArrivals(strings.NewReader("# header\n0.5\n0\n\n1.25\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{0, 500 * time.Millisecond, 1250 * time.Millisecond}
	if len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("got %v", got)
	}
	ts, err := simulate.ReadArrivals(strings.NewReader("2026-01-01T00:00:00Z\n2026-01-01T00:00:02.5Z\n"))
	if err != nil || ts[1] != 2500*time.Millisecond {
		t.Fatalf("timestamps: %v %v", ts, err)
	}
	for _, bad := range []string{"", "abc\n", "-1\n", "NaN\n", "2026-01-02T00:00:00Z\n2026-01-01T00:00:00Z\n"} {
		if _, err := simulate.ReadArrivals(strings.NewReader(bad)); !errors.Is(err, simulate.ErrBadPattern) {
			t.Errorf("ReadArrivals(%q) = %v, want ErrBadPattern", bad, err)
		}
	}
}

func TestGenerateRejects(t *testing.T) {
	for _, c := range []struct {
		p   simulate.Pattern
		rps float64
		d   time.Duration
	}{{"zigzag", 1, time.Second}, {simulate.Steady, 0, time.Second}, {simulate.Steady, 1, 0}, {simulate.Steady, 1e9, time.Hour}} {
		if _, err := simulate.Generate(c.p, c.rps, c.d); !errors.Is(err, simulate.ErrBadPattern) {
			t.Errorf("Generate(%q, %v, %s) = %v", c.p, c.rps, c.d, err)
		}
	}
}
