package config

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
)

func TestDelayPolicies(t *testing.T) {
	doc := `store: {lease: true}
policies:
  smooth: {limit: 10/s burst 5, max_wait: 1s}
  nginx: {limit: 10/s burst 15, delay: 5}
  both: {limit: 10/s burst 15, delay: 5, max_wait: 500ms}
  zero: {limit: 10/s burst 3, delay: 0}
  plain: {limit: 10/s}
`
	cfg, err := Parse("d.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		limit sluice.Limit
		wait  time.Duration
	}
	for name, w := range map[string]want{
		"smooth": {sluice.Limit{Rate: 10, Period: time.Second, Burst: 5}, time.Second},
		"nginx":  {sluice.Limit{Rate: 10, Period: time.Second, Burst: 5}, time.Second},
		"both":   {sluice.Limit{Rate: 10, Period: time.Second, Burst: 5}, 500 * time.Millisecond},
		"zero":   {sluice.Limit{Rate: 10, Period: time.Second, Burst: 1}, 200 * time.Millisecond},
		"plain":  {sluice.Limit{Rate: 10, Period: time.Second}, 0},
	} {
		p := cfg.Policies[name]
		l, wait := p.Reservation(p.Limit)
		if l != w.limit || wait != w.wait || p.Delayed() != (w.wait > 0) {
			t.Errorf("%s: %s max wait %s (delayed %v), want %s and %s", name, l, wait, p.Delayed(), w.limit, w.wait)
		}
		if p.Delayed() && p.Lease {
			t.Errorf("%s: a delay-mode policy took store.lease", name)
		}
	}
	if !cfg.Policies["plain"].Lease {
		t.Error("plain policy lost store.lease")
	}
	if cfg.MaxWaiting != DefaultMaxWaiting {
		t.Errorf("max_waiting default %d", cfg.MaxWaiting)
	}
	// An override keeps the policy's delay threshold.
	l, wait := cfg.Policies["nginx"].Reservation(sluice.Limit{Rate: 20, Period: time.Second, Burst: 25})
	if l.Burst != 5 || wait != time.Second {
		t.Errorf("override of nginx: %s %s", l, wait)
	}
}

// Hostile or meaningless delay settings are refused at load, each at its
// file and line.
func TestDelayPoliciesRefused(t *testing.T) {
	doc := `max_waiting: -1
policies:
  neg: {limit: 10/s, max_wait: -1s}
  huge: {limit: 10/s, max_wait: 11s}
  tiny: {limit: 10/s, max_wait: 1ns}
  window: {limit: 10/s, algorithm: fixed_window, max_wait: 1s}
  log: {limit: 10/s, algorithm: sliding_window_log, delay: 2}
  over: {limit: 10/s burst 5, delay: 6}
  negdelay: {limit: 10/s, delay: -1}
  shadowed: {limit: 10/s, shadow: true, max_wait: 1s}
  leased: {limit: 10/s, lease: true, max_wait: 1s}
`
	_, err := Parse("bad.yaml", []byte(doc))
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{
		"bad.yaml:1: max_waiting: -1 must be between 1 and",
		"bad.yaml:3: policies.neg.max_wait: -1s must be between 1ms and 10s",
		"bad.yaml:4: policies.huge.max_wait: 11s must be between",
		"bad.yaml:5: policies.tiny.max_wait: 1ns must be at least 1ms",
		"bad.yaml:6: policies.window.max_wait: delay mode needs gcra or token_bucket, not fixed_window",
		"bad.yaml:7: policies.log.delay: delay mode needs gcra or token_bucket, not sliding_window_log",
		"bad.yaml:8: policies.over.delay: 6 exceeds the burst 5",
		"bad.yaml:9: policies.negdelay.delay: -1 must not be negative",
		"bad.yaml:10: policies.shadowed.max_wait: a shadow policy never holds a request",
		"bad.yaml:11: policies.leased.lease: a delay-mode policy is decided by the store",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%v", want, err)
		}
	}
}

// TestDelayWaitWithinReserveBound: with delay alone the wait is the time
// the burst takes to refill past the threshold, which a slow limit (or an
// override scaling it down) makes days long; the request a policy makes
// must still be one the stores take, holding a request for at most
// sluice.MaxReserveWait and denying beyond, with Retry-After.
func TestDelayWaitWithinReserveBound(t *testing.T) {
	doc := `policies:
  slow: {limit: 100/day burst 1000, delay: 1}
`
	cfg, err := Parse("d.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Policies["slow"]
	for _, l := range []sluice.Limit{p.Limit, {Rate: 1, Period: 366 * 24 * time.Hour, Burst: 16}} {
		l, wait := p.Reservation(l)
		req := sluice.Request{Key: "k", Algorithm: p.Algorithm, Limit: l, Cost: 1, MaxWait: wait}
		if err := req.Validate(sluice.OpAllow); err != nil || wait != sluice.MaxReserveWait {
			t.Errorf("%s: max wait %s: %v, want %s and a valid request", l, wait, err, sluice.MaxReserveWait)
		}
	}
}
