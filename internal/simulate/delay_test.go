package simulate_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/simulate"
)

// The delay-mode check, simulated: 30 requests at once under 10/s
// burst 5 with a max wait of 1s: 5 go at once, then one per 100ms row for
// ten rows, 15 are denied.
func TestDelaySimulation(t *testing.T) {
	arr := make([]time.Duration, 30)
	algos := []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket}
	res, err := simulate.RunDelay(context.Background(), sluice.Limit{Rate: 10, Period: time.Second, Burst: 5}, algos, arr, 100*time.Millisecond, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range algos {
		if got := res.Allowed[a]; len(got) != 1 || got[0] != 5 {
			t.Fatalf("%s at once: %v, want [5]", a, got)
		}
		want := []int{5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}
		if got := res.Passed[a]; len(got) != len(want) || !equal(got, want) {
			t.Fatalf("%s passed per 100ms: %v, want %v", a, got, want)
		}
		if res.Denied[a][0] != 15 || res.Held[a][0] != 10 || res.MaxDelay[a] != time.Second || res.TotalDelay[a] != 5500*time.Millisecond {
			t.Fatalf("%s: denied %v held %v delays %s max %s", a, res.Denied[a], res.Held[a], res.TotalDelay[a], res.MaxDelay[a])
		}
	}
	var table bytes.Buffer
	if err := res.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"5/25", "5/15/10", "1/0/0", "gcra delay mode: 15 admitted instead of 5, 10 held, mean delay 550ms, max 1s"} {
		if !strings.Contains(table.String(), want) {
			t.Fatalf("table lacks %q:\n%s", want, table.String())
		}
	}
	var svg bytes.Buffer
	if err := res.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	series := polylines(t, &svg, "data-series")
	for _, want := range []string{"gcra", "gcra+wait", "token_bucket", "token_bucket+wait"} {
		if !series[want] {
			t.Errorf("no line for %s: %v", want, series)
		}
	}
}

// A burst pattern: delay mode admits more of the spikes, and never lets
// more go ahead in a second than the limit's burst and rate allow.
func TestDelaySmoothsBursts(t *testing.T) {
	arr, err := simulate.Generate(simulate.Burst, 20, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	limit := sluice.Limit{Rate: 10, Period: time.Second, Burst: 10}
	res, err := simulate.RunDelay(context.Background(), limit, []sluice.Algorithm{sluice.GCRA}, arr, time.Second, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	plain, passed := sumOf(res.Allowed[sluice.GCRA]), sumOf(res.Passed[sluice.GCRA])
	if passed <= plain {
		t.Fatalf("delay mode admitted %d, at once %d", passed, plain)
	}
	for i, p := range res.Passed[sluice.GCRA] {
		if p > 10+10 {
			t.Fatalf("second %d: %d went ahead, more than burst + rate", i, p)
		}
	}
	if _, err := simulate.RunDelay(context.Background(), limit, []sluice.Algorithm{sluice.FixedWindow}, arr, time.Second, time.Second); err == nil {
		t.Fatal("fixed window took delay mode")
	}
	if _, err := simulate.RunDelay(context.Background(), limit, []sluice.Algorithm{sluice.GCRA}, arr, time.Second, -time.Second); err == nil {
		t.Fatal("negative max wait accepted")
	}
}

func equal(a, b []int) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return len(a) == len(b)
}

func sumOf(xs []int) int {
	t := 0
	for _, x := range xs {
		t += x
	}
	return t
}
