package sluice_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
)

func TestParseLimit(t *testing.T) {
	good := []struct {
		in   string
		want sluice.Limit
	}{
		{"10/s", sluice.Limit{Rate: 10, Period: time.Second}},
		{"100/min", sluice.Limit{Rate: 100, Period: time.Minute}},
		{"1000/h", sluice.Limit{Rate: 1000, Period: time.Hour}},
		{"5000/day", sluice.Limit{Rate: 5000, Period: 24 * time.Hour}},
		{"100/10s", sluice.Limit{Rate: 100, Period: 10 * time.Second}},
		{" 10 / second ", sluice.Limit{Rate: 10, Period: time.Second}},
		{"10/s burst 30", sluice.Limit{Rate: 10, Period: time.Second, Burst: 30}},
		{"10/s, burst=30", sluice.Limit{Rate: 10, Period: time.Second, Burst: 30}},
		{"3/500ms", sluice.Limit{Rate: 3, Period: 500 * time.Millisecond}},
	}
	for _, c := range good {
		got, err := sluice.ParseLimit(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseLimit(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
		if back, err := sluice.ParseLimit(got.String()); err != nil || back != got {
			t.Errorf("round trip of %q via %q = %+v, %v", c.in, got.String(), back, err)
		}
	}
	bad := []struct{ in, mention string }{
		{"", "RATE/PERIOD"},
		{"0/s", `"0"`},
		{"-5/s", `"-5"`},
		{"NaN/s", `"NaN"`},
		{"1.5/s", `"1.5"`},
		{"99999999999999999999/s", "overflows"},
		{"10/fortnight", `"fortnight"`},
		{"10/0s", `"0"`},
		{"10/99999999999day", "longer"},
		{"10/s burst", "burst"},
		{"10/s burst -1", `"-1"`},
		{"10/s burst 0", `"0"`},
		{"Inf/s", `"Inf"`},
	}
	for _, c := range bad {
		_, err := sluice.ParseLimit(c.in)
		if !errors.Is(err, sluice.ErrInvalidLimit) {
			t.Errorf("ParseLimit(%q) error %v, want ErrInvalidLimit", c.in, err)
			continue
		}
		if !strings.Contains(err.Error(), c.mention) {
			t.Errorf("ParseLimit(%q) error %q does not mention %s", c.in, err, c.mention)
		}
	}
}

func TestLimitValidate(t *testing.T) {
	for _, l := range []sluice.Limit{
		{Rate: 0, Period: time.Second},
		{Rate: 1, Period: 0},
		{Rate: 1, Period: -time.Second},
		{Rate: 1, Period: time.Second, Burst: -1},
		{Rate: 1 << 50, Period: time.Second},
		{Rate: 1, Period: 1000 * 24 * time.Hour},
		{Rate: 1, Period: 300 * 24 * time.Hour, Burst: 1 << 39},
		{Rate: 1, Period: time.Second, Granularity: -time.Millisecond},
		{Rate: 1, Period: time.Second, Granularity: time.Millisecond + 1},
		{Rate: 1, Period: time.Second, Granularity: 999 * time.Microsecond},
		{Rate: 1, Period: time.Second, Granularity: time.Second + time.Millisecond},
		{Rate: 1, Period: time.Minute, Granularity: 2 * time.Minute},
		{Rate: 1, Period: 24 * time.Hour, Granularity: time.Hour, Calendar: sluice.Calendar{Unit: sluice.Day}},
	} {
		if err := l.Validate(); !errors.Is(err, sluice.ErrInvalidLimit) {
			t.Errorf("%+v.Validate() = %v, want ErrInvalidLimit", l, err)
		}
	}
	for _, l := range []sluice.Limit{
		{Rate: 1, Period: time.Second, Granularity: time.Millisecond},
		{Rate: 1, Period: time.Second, Granularity: time.Second},
		{Rate: 1, Period: time.Second, Granularity: 7 * time.Millisecond},
	} {
		if err := l.Validate(); err != nil {
			t.Errorf("%+v.Validate() = %v, want nil", l, err)
		}
	}
}

// A granularity is for the sliding window log only: a request of another
// algorithm with one is invalid, whatever the op but a reset.
func TestRequestGranularityNeedsLog(t *testing.T) {
	l := sluice.Limit{Rate: 10, Period: time.Second, Granularity: 100 * time.Millisecond}
	for _, a := range sluice.Algorithms() {
		r := sluice.Request{Key: "k", Algorithm: a, Limit: l, Cost: 1, Lease: "x"}
		err := r.Validate(sluice.OpAllow)
		if a == sluice.SlidingWindowLog {
			if err != nil {
				t.Errorf("%s: %v", a, err)
			}
		} else if !errors.Is(err, sluice.ErrInvalidLimit) {
			t.Errorf("%s with a granularity: %v, want ErrInvalidLimit", a, err)
		}
	}
}

func TestCostInterval(t *testing.T) {
	l := sluice.Limit{Rate: 3, Period: time.Second}
	if got := l.Interval(); got != 333333334 {
		t.Errorf("Interval = %d, want 333333334 (rounded up)", got)
	}
	if got := l.CostInterval(3); got != int64(time.Second) {
		t.Errorf("CostInterval(3) = %d, want exactly 1s", got)
	}
	// no overflow for a large cost on a long period
	big := sluice.Limit{Rate: 1 << 40, Period: 366 * 24 * time.Hour}
	if got := big.CostInterval(1 << 40); got != int64(366*24*time.Hour) {
		t.Errorf("CostInterval overflowed: %d", got)
	}
}

func TestCeilSeconds(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{{0, 0}, {-time.Second, 0}, {1, 1}, {time.Second, 1}, {time.Second + 1, 2}, {1500 * time.Millisecond, 2}} {
		if got := sluice.CeilSeconds(c.d); got != c.want {
			t.Errorf("CeilSeconds(%s) = %d, want %d", c.d, got, c.want)
		}
	}
	if got := sluice.CeilMillis(1500*time.Microsecond + 1); got != 2 {
		t.Errorf("CeilMillis = %d, want 2", got)
	}
}

func TestParseAlgorithm(t *testing.T) {
	for _, a := range sluice.Algorithms() {
		got, err := sluice.ParseAlgorithm(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", a, got, err)
		}
	}
	if a, err := sluice.ParseAlgorithm("Sliding-Window"); err != nil || a != sluice.SlidingWindowCounter {
		t.Errorf("sliding-window alias: %v %v", a, err)
	}
	_, err := sluice.ParseAlgorithm("leaky")
	if !errors.Is(err, sluice.ErrUnknownAlgorithm) || !strings.Contains(err.Error(), "token_bucket") {
		t.Errorf("unknown algorithm error %v should list the valid ones", err)
	}
}

func FuzzParseLimit(f *testing.F) {
	for _, s := range []string{"10/s", "100/min burst 5", "1/day", "0/s", "9/9999999999999999d", "1/ms,burst=2",
		"5000/day in Europe/Berlin at 09:00", "1M tokens/month in America/New_York", "3/week in UTC from sun"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := sluice.ParseLimit(s)
		if err != nil {
			if !errors.Is(err, sluice.ErrInvalidLimit) {
				t.Fatalf("ParseLimit(%q): error %v does not wrap ErrInvalidLimit", s, err)
			}
			return
		}
		if err := l.Validate(); err != nil {
			t.Fatalf("ParseLimit(%q) returned invalid %+v: %v", s, l, err)
		}
		if l.Interval() <= 0 || l.CostInterval(l.Capacity()) <= 0 {
			t.Fatalf("ParseLimit(%q) = %+v with non-positive interval", s, l)
		}
		back, err := sluice.ParseLimit(l.String())
		if err != nil || back.String() != l.String() || back.Rate != l.Rate || back.Period != l.Period || back.Burst != l.Burst {
			t.Fatalf("ParseLimit(%q) = %v; reading that back gives %v, %v", s, l, back, err)
		}
		if !l.Calendar.IsZero() {
			start, end := l.Calendar.Window(time.Unix(1_790_000_000, 0))
			if !end.After(start) {
				t.Fatalf("ParseLimit(%q): empty window [%s, %s)", s, start, end)
			}
		}
	})
}

// AdmittedAgo is for a sliding window log's refund only, and not negative.
func TestRequestAdmittedAgo(t *testing.T) {
	l := sluice.Limit{Rate: 10, Period: time.Second}
	for _, a := range sluice.Algorithms() {
		for _, op := range []sluice.Op{sluice.OpAllow, sluice.OpPeek, sluice.OpRefund, sluice.OpCharge} {
			r := sluice.Request{Key: "k", Algorithm: a, Limit: l, Cost: 1, Lease: "x", AdmittedAgo: time.Millisecond}
			err := r.Validate(op)
			if a == sluice.SlidingWindowLog && op == sluice.OpRefund {
				if err != nil {
					t.Errorf("%s %s: %v", a, op, err)
				}
			} else if !errors.Is(err, sluice.ErrInvalidRequest) {
				t.Errorf("%s %s with an age: %v, want ErrInvalidRequest", a, op, err)
			}
		}
	}
	r := sluice.Request{Key: "k", Algorithm: sluice.SlidingWindowLog, Limit: l, Cost: 1, AdmittedAgo: -1}
	if err := r.Validate(sluice.OpRefund); !errors.Is(err, sluice.ErrInvalidRequest) {
		t.Errorf("negative age: %v, want ErrInvalidRequest", err)
	}
}
