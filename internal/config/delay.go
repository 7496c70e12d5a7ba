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
// admitted within max_wait is held until then. With delay D, l's burst B
// is NGINX's, and the outcome NGINX's `burst=B delay=D` (nginx.go): D+1
// requests pass at once (the burst becomes D+1), B+1 in all, the rest
// held, paced at the rate, up to the time B−D requests take to refill;
// max_wait, if set too, caps that wait, and MaxMaxWait always does (the
// policy's own limit is refused at load when it would hold longer; an
// override may: a request due later is denied, with its Retry-After,
// rather than held past the server's write timeout).
func (p *Policy) Reservation(l sluice.Limit) (sluice.Limit, time.Duration) {
	if !p.HasDelay {
		return l, p.MaxWait
	}
	burst := l.Capacity()
	at := min(p.Delay, burst)
	wait := min(time.Duration(l.CostInterval(burst-at)), MaxMaxWait)
	if p.MaxWait > 0 {
		wait = min(wait, p.MaxWait)
	}
	l.Burst = at + 1
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
	switch {
	case p.NGINX != nil:
		field = path + ".nginx"
	case p.MaxWait == 0:
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
		case pol.Limit.Rate > 0 && p.MaxWait == 0 && pol.Limit.CostInterval(pol.Limit.Capacity()-*p.Delay) > int64(MaxMaxWait):
			// NGINX would hold the last of the burst this long; a shorter
			// hold would deny what NGINX holds, and a longer one outlive
			// the server's write timeout.
			v.addf(path+".delay", "NGINX's burst=%d delay=%d would hold a request up to %s; sluice holds at most %s: lower the burst, raise delay, or set max_wait to cap the hold (then requests NGINX would hold longer are denied)", pol.Limit.Capacity(), *p.Delay, time.Duration(pol.Limit.CostInterval(pol.Limit.Capacity()-*p.Delay)), MaxMaxWait)
			ok = false
		case pol.Limit.Capacity() >= 1<<40:
			v.addf(path+".delay", "the burst %d is too large for NGINX's form (it passes burst+1)", pol.Limit.Capacity())
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
