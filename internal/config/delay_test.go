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
		"nginx":  {sluice.Limit{Rate: 10, Period: time.Second, Burst: 6}, time.Second},
		"both":   {sluice.Limit{Rate: 10, Period: time.Second, Burst: 6}, 500 * time.Millisecond},
		"zero":   {sluice.Limit{Rate: 10, Period: time.Second, Burst: 1}, 300 * time.Millisecond},
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
	// An override keeps the policy's delay threshold: NGINX's burst=25
	// delay=5 at 20r/s.
	l, wait := cfg.Policies["nginx"].Reservation(sluice.Limit{Rate: 20, Period: time.Second, Burst: 25})
	if l.Burst != 6 || wait != time.Second {
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
  long: {limit: 10/min burst 5, delay: 1}
  ngxrate: {nginx: {rate: 10r/h}}
  ngxboth: {nginx: {rate: 10r/s, burst: 5, delay: 2, nodelay: true}}
  ngxzero: {nginx: {rate: 10r/s, burst: 0}}
  ngxdelay0: {nginx: {rate: 10r/s, burst: 5, delay: 0}}
  ngxlimit: {limit: 10/s, nginx: {rate: 10r/s}}
  ngxlong: {nginx: {rate: 1r/s, burst: 20}}
  ngxshadow: {shadow: true, nginx: {rate: 1r/s, burst: 2}}
  ngxlease: {lease: true, nginx: {rate: 1r/s, burst: 2}}
  ngxunknown: {nginx: {rate: 1r/s, zone: one}}
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
		"bad.yaml:12: policies.long.delay: NGINX's burst=5 delay=1 would hold a request up to 24s; sluice holds at most 10s",
		`bad.yaml:13: policies.ngxrate.nginx.rate: "10r/h" must be NGINX's rate`,
		"bad.yaml:14: policies.ngxboth.nginx.delay: delay and nodelay exclude each other",
		"bad.yaml:15: policies.ngxzero.nginx.burst: 0 must be between 1 and",
		"bad.yaml:16: policies.ngxdelay0.nginx.delay: 0 must be positive",
		"bad.yaml:17: policies.ngxlimit.nginx: limit cannot be set beside nginx",
		"bad.yaml:18: policies.ngxlong.nginx: NGINX would hold a request up to 20s",
		"bad.yaml:19: policies.ngxshadow.nginx: a shadow policy never holds a request",
		"bad.yaml:20: policies.ngxlease.lease: a delay-mode policy is decided by the store",
		"bad.yaml:21: policies.ngxunknown.nginx.zone: unknown field",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%v", want, err)
		}
	}
}

// TestDelayWaitWithinReserveBound: with delay the wait is the time the
// burst takes to refill past the threshold, which a slow limit (or an
// override scaling it down) makes days long; a policy that would hold
// that long is refused at load unless max_wait caps it
// (TestDelayPoliciesRefused), and an override's wait is capped at
// MaxMaxWait: the request is one the stores take, holding a request for
// at most that and denying beyond, with Retry-After.
func TestDelayWaitWithinReserveBound(t *testing.T) {
	doc := `policies:
  slow: {limit: 100/day burst 1000, delay: 1, max_wait: 10s}
  fast: {limit: 10/s burst 20, delay: 1}
`
	cfg, err := Parse("d.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"slow", "fast"} {
		p := cfg.Policies[name]
		for _, l := range []sluice.Limit{p.Limit, {Rate: 1, Period: 366 * 24 * time.Hour, Burst: 16}} {
			l, wait := p.Reservation(l)
			req := sluice.Request{Key: "k", Algorithm: p.Algorithm, Limit: l, Cost: 1, MaxWait: wait}
			want := MaxMaxWait
			if name == "fast" && l.Rate == 10 {
				want = 1900 * time.Millisecond
			}
			if err := req.Validate(sluice.OpAllow); err != nil || wait != want {
				t.Errorf("%s: %s: max wait %s: %v, want %s and a valid request", name, l, wait, err, want)
			}
		}
	}
}
