package config

import (
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-io/sluice"
)

// NGINX's limit_req in its own words. NGINX keeps, per key, the excess
// in 1/1000 requests: a request finds excess = max(0, excess − rate·ms +
// 1000) (0 on a key's first request), is rejected when that exceeds
// burst·1000 (the state unchanged), passes at once when it is at most
// delay·1000 and is otherwise held (excess − delay·1000)/rate ms. That is
// GCRA: NGINX's excess after a request is the GCRA state's lead over now
// minus one interval. So `rate=R burst=B delay=D` is GCRA at R with burst
// D+1 whose requests may be held up to (B−D)/R: D+1 pass at once, B+1 in
// all, the rest held at the rate, exactly (Policy.Reservation;
// TestNGINXDifferential replays random arrivals against a model of
// ngx_http_limit_req_module.c).

// NGINXSection is a policy's `nginx:`: limit_req's zone rate and its
// burst, delay and nodelay, as nginx.conf writes them.
type NGINXSection struct {
	// Rate is limit_req_zone's rate: "10r/s" or "30r/m".
	Rate string `yaml:"rate"`
	// Burst is limit_req's burst; omitted means 0, as in NGINX.
	Burst *int64 `yaml:"burst"`
	// Delay is limit_req's delay; omitted means 0, as in NGINX.
	Delay *int64 `yaml:"delay"`
	// NoDelay is limit_req's nodelay: the whole burst passes at once.
	NoDelay bool `yaml:"nodelay"`
}

// nginxRateRE is NGINX's rate: a whole number of requests per second or
// per minute.
var nginxRateRE = regexp.MustCompile(`^([1-9][0-9]{0,11})r/([sm])$`)

// NGINXLimit is the sluice limit of NGINX's rate as NGINX keeps it, in
// 1/1000 requests per second, rounded down: "10r/s" is 10/s, "30r/m"
// 30/min. Its burst is zero. A rate whose interval is not a whole number
// of nanoseconds ("3r/s"; "10r/m", which NGINX keeps as 166/1000 per
// second) is one request per its interval rounded down (333333333ns;
// 6024096385ns): sluice rounds each request's interval up and a burst's
// refill once, so B such requests at once would overrun a burst of B by
// nanoseconds and the last be denied where NGINX admits it; rounded down,
// a burst fits exactly, and ties land as NGINX's (admitted at equality),
// at a rate higher by under a nanosecond per interval.
func NGINXLimit(rate string) (sluice.Limit, bool) {
	m := nginxRateRE.FindStringSubmatch(rate)
	if m == nil {
		return sluice.Limit{}, false
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil || n > 1<<30 {
		return sluice.Limit{}, false
	}
	milli := n * 1000 // ctx->rate: 1/1000 requests per second
	l := sluice.Limit{Rate: n, Period: time.Second}
	if m[2] == "m" {
		milli /= 60
		l = sluice.Limit{Rate: milli, Period: 1000 * time.Second}
		if n*1000%60 == 0 {
			l = sluice.Limit{Rate: n, Period: time.Minute}
		}
	}
	if int64(time.Second)*1000%milli != 0 {
		l = sluice.Limit{Rate: 1, Period: time.Duration(int64(time.Second) * 1000 / milli)}
	}
	return l, true
}

// compileNGINX validates a policy's nginx: section into pol's limit and
// into p's delay, which compileDelay then takes as the delay form's.
func (v *validator) compileNGINX(path string, p *PolicySection, pol *Policy) {
	n := p.NGINX
	path += ".nginx"
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"limit", p.Limit != ""}, {"burst", p.Burst != 0}, {"algorithm", p.Algorithm != ""},
		{"max_wait", p.MaxWait != 0}, {"delay", p.Delay != nil},
		{"timezone", p.Timezone != ""}, {"reset_at", p.ResetAt != ""}, {"week_starts", p.WeekStarts != ""},
	} {
		if f.set {
			v.addf(path, "%s cannot be set beside nginx: nginx gives the rate, burst and delay as NGINX's limit_req does", f.name)
		}
	}
	p.Limit, p.Burst, p.Algorithm, p.MaxWait, p.Timezone, p.ResetAt, p.WeekStarts = "", 0, "", 0, "", "", ""
	l, ok := NGINXLimit(n.Rate)
	if !ok {
		v.addf(path+".rate", "%q must be NGINX's rate, a whole number of requests per second or minute such as 10r/s or 30r/m", n.Rate)
		return
	}
	var burst, delay int64
	if n.Burst != nil {
		burst = *n.Burst
		if burst <= 0 || burst >= 1<<30 {
			v.addf(path+".burst", "%d must be between 1 and %d (NGINX's default, 0, is written by leaving burst out)", burst, 1<<30-1)
			return
		}
	}
	if n.Delay != nil {
		delay = *n.Delay
		switch {
		case n.NoDelay:
			v.addf(path+".delay", "delay and nodelay exclude each other")
			return
		case delay <= 0:
			v.addf(path+".delay", "%d must be positive (NGINX's default, 0, is written by leaving delay out)", delay)
			return
		}
	}
	if n.NoDelay {
		delay = burst
	}
	delay = min(delay, burst) // NGINX passes at once what is within its burst
	if burst == 0 {
		// Only a request that finds no excess passes: GCRA with burst 1,
		// never held.
		l.Burst = 1
		pol.Limit = l
		return
	}
	l.Burst = burst
	if hold := time.Duration(l.CostInterval(burst - delay)); hold > MaxMaxWait {
		v.addf(path, "NGINX would hold a request up to %s (burst %d − delay %d at %s); sluice holds at most %s (its answer must fit the write timeout): lower burst, or raise delay", hold, burst, delay, strings.TrimSpace(n.Rate), MaxMaxWait)
		return
	}
	if err := l.Validate(); err != nil {
		v.addf(path+".burst", "%s", strings.TrimPrefix(err.Error(), "sluice: "))
		return
	}
	pol.Limit = l
	p.Delay = &delay
}
