package config

import (
	"time"

	"github.com/sluice-io/sluice"
)

// Delay mode: a policy with max_wait (or NGINX's delay) holds a request
// that would be admitted soon instead of answering 429.
const (
	// MaxMaxWait bounds a policy's max_wait: a request held longer ties
	// up a connection for little gain (a 429 with Retry-After serves it
	// better), and the held answer must fit in the server's 30s write
	// timeout and its shutdown drain.
	MaxMaxWait = 10 * time.Second
	// DefaultMaxWaiting is the default bound of the requests one instance
	// holds at once.
	DefaultMaxWaiting = 10000
	// maxMaxWaiting bounds max_waiting.
	maxMaxWaiting = 1_000_000
)

// Delayed reports whether the policy is in delay mode.
func (p *Policy) Delayed() bool { return p.MaxWait > 0 || p.HasDelay }

// Reservation returns the limit a request of p is checked against and
// its max wait (sluice.Request.MaxWait), for l, the policy's limit or an
// identity's override of it. Without delay mode it is l and 0. With
// max_wait alone, l's burst passes at once and a request that would be
// admitted within max_wait is held until then. With delay N, l's burst is
// NGINX's: its first N requests pass at once (the burst becomes N; 0 means
// that only a request on an idle key does) and the rest are held, paced at
// the rate, up to the time the burst takes to refill past N; max_wait, if
// set too, caps that wait, and sluice.MaxReserveWait always does (a slow
// limit's burst takes days to refill: a request due later is denied, with
// its Retry-After, rather than held).
func (p *Policy) Reservation(l sluice.Limit) (sluice.Limit, time.Duration) {
	if !p.HasDelay {
		return l, p.MaxWait
	}
	burst := l.Capacity()
	at := min(max(p.Delay, 1), burst)
	wait := min(time.Duration(l.CostInterval(burst-at)), sluice.MaxReserveWait)
	if p.MaxWait > 0 {
		wait = min(wait, p.MaxWait)
	}
	l.Burst = at
	return l, wait
}

// compileDelay validates a policy's max_wait and delay into pol.
func (v *validator) compileDelay(path string, p *PolicySection, pol *Policy) {
	if p.MaxWait == 0 && p.Delay == nil {
		return
	}
	ok := true
	if p.MaxWait < 0 || p.MaxWait > MaxMaxWait {
		v.addf(path+".max_wait", "%s must be between 1ms and %s (a longer wait is better answered with 429 and Retry-After)", p.MaxWait, MaxMaxWait)
		ok = false
	} else if p.MaxWait > 0 && p.MaxWait < time.Millisecond {
		v.addf(path+".max_wait", "%s must be at least 1ms", p.MaxWait)
		ok = false
	}
	field := path + ".max_wait"
	if p.MaxWait == 0 {
		field = path + ".delay"
	}
	if p.Delay != nil {
		switch {
		case *p.Delay < 0:
			v.addf(path+".delay", "%d must not be negative", *p.Delay)
			ok = false
		case pol.Limit.Rate > 0 && *p.Delay > pol.Limit.Capacity():
			v.addf(path+".delay", "%d exceeds the burst %d: the requests past the burst are held (max_wait) or refused, never passed at once", *p.Delay, pol.Limit.Capacity())
			ok = false
		}
	}
	if !sluice.Reserves(pol.Algorithm) {
		v.addf(field, "delay mode needs gcra or token_bucket, not %s: a reservation moves their refill time into the future exactly, while a window would have to count future windows", pol.Algorithm)
		ok = false
	}
	if pol.Shadow {
		v.addf(field, "a shadow policy never holds a request; drop max_wait and delay, or shadow")
		ok = false
	}
	if p.Lease != nil && *p.Lease {
		v.addf(path+".lease", "a delay-mode policy is decided by the store, not from leases (a lease holds capacity for now, not for the future); drop lease or max_wait/delay")
		ok = false
	}
	if !ok {
		return
	}
	pol.Lease = false // store.lease's default does not apply: see above
	pol.MaxWait = p.MaxWait
	if p.Delay != nil {
		pol.Delay, pol.HasDelay = *p.Delay, true
	}
}

// compileMaxWaiting applies max_waiting's default and bounds.
func (v *validator) compileMaxWaiting(cfg *Config) {
	switch {
	case cfg.MaxWaiting == 0:
		cfg.MaxWaiting = DefaultMaxWaiting
	case cfg.MaxWaiting < 0 || cfg.MaxWaiting > maxMaxWaiting:
		v.addf("max_waiting", "%d must be between 1 and %d", cfg.MaxWaiting, maxMaxWaiting)
	}
}
