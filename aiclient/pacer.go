package aiclient

import (
	"math"
	"sync"
	"time"
)

// pacer slows a client down before the server rejects it. It keeps the
// limits that the last response's headers described, counts down locally
// the requests and tokens launched since, and asks a caller to wait until
// every limit has room: the binding constraint decides.
//
// Where the headers disagree, they never make a caller wait longer than
// the server asked: a Retry-After (or retry-after-ms) caps, for the
// response that carries it, the wait every other field implies for the
// next request; later requests follow at the limits' own pace from there.
// Per unit (requests, tokens), the IETF fields, which state each limit's
// exact rate, are preferred to the provider's single triple, whose rate is
// inferred. After a 429 the pacer also holds every caller of the client
// back until the retry time. It is shared by all the client's goroutines.
type pacer struct {
	mu     sync.Mutex
	until  int64 // no launch before this time (Unix ns)
	limits []paced
	// seq numbers launches; observed is the launch whose response the
	// limits describe. A response to an earlier launch is stale.
	seq, observed uint64
	// inflight are the launches after observed, which its response could
	// not count: they are counted down from the limits it reported.
	inflight []launch
}

// launch is one request let through by reserve.
type launch struct {
	seq    uint64
	tokens int64
}

// maxInflight bounds the launches remembered; older ones are forgotten,
// which only makes the pacer less cautious.
const maxInflight = 4096

// paced is one limit observed at a time, counted down locally.
type paced struct {
	tokens bool // counts tokens, else requests
	// avail is the units available at seenAt, a fraction once a retry
	// hint has moved it.
	avail float64
	// interval is the ns one unit takes to come back; 0 for a window that
	// refills all at once at resetAt.
	interval float64
	seenAt   int64 // Unix ns
	resetAt  int64 // Unix ns
	launched int64 // units launched since seenAt
}

// at returns when cost more units can be launched, and whether they can
// ever be, by this limit's account.
func (l *paced) at(cost int64) (int64, bool) {
	need := float64(cost) + float64(l.launched) - l.avail
	if need <= 0 {
		return l.seenAt, true
	}
	if l.interval > 0 {
		d := need * l.interval
		if d >= float64(maxHint) {
			return l.seenAt + int64(maxHint), true
		}
		return l.seenAt + int64(math.Ceil(d)), true
	}
	return l.resetAt, false // stale after resetAt: the window is full again
}

// wait returns how long to wait at now before cost units of this limit
// can be launched.
func (l *paced) wait(now, cost int64) time.Duration {
	if cost <= 0 {
		return 0
	}
	t, ok := l.at(cost)
	if !ok && now >= l.resetAt {
		return 0
	}
	return time.Duration(max(t-now, 0))
}

// limitsOf turns a response's rate-limit information into paced limits:
// per unit, the IETF policies when the response has any of that unit, else
// the provider's triple.
func limitsOf(info RateLimitInfo, now int64) []paced {
	var out []paced
	add := func(w Window, tokens bool) {
		if !w.Known {
			return
		}
		l := paced{tokens: tokens, avail: float64(w.Remaining), seenAt: now, resetAt: now + int64(w.Reset)}
		switch {
		case w.Interval > 0:
			l.interval = float64(w.Interval)
		case w.Linear && w.Limit > w.Remaining && w.Reset > 0:
			l.interval = float64(w.Reset) / float64(w.Limit-w.Remaining)
		}
		out = append(out, l)
	}
	var ietf [2]bool
	for _, p := range info.Policies {
		switch p.Unit {
		case "requests":
			add(p.Window, false)
			ietf[0] = true
		case "tokens":
			add(p.Window, true)
			ietf[1] = true
		}
	}
	if !ietf[0] {
		add(info.Requests, false)
	}
	if !ietf[1] {
		add(info.Tokens, true)
	}
	return out
}

// observe records the rate-limit headers of a response read at now, to
// the launch seq (reserve's) of tokens estimated tokens. hint, when
// hasHint, is the server's retry time: no limit of this response may keep
// that request back longer. A response to a launch older than the one the
// pacer follows is stale and ignored; the launches after seq, still in
// flight when the server answered, are counted down from what it reported.
func (p *pacer) observe(info RateLimitInfo, now int64, seq uint64, tokens int64, hint time.Duration, hasHint bool) {
	limits := limitsOf(info, now)
	if hasHint {
		hintAt := now + int64(hint)
		for i := range limits {
			l := &limits[i]
			cost := int64(1)
			if l.tokens {
				cost = tokens
			}
			if cost <= 0 {
				continue
			}
			if t, _ := l.at(cost); t > hintAt {
				if l.interval > 0 {
					// The server says cost units are there at hintAt;
					// the rest come at the limit's rate after it.
					l.avail = float64(cost) - float64(hintAt-now)/l.interval
				} else {
					l.resetAt = hintAt
				}
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(limits) == 0 || seq < p.observed {
		return
	}
	n := 0
	for _, l := range p.inflight {
		if l.seq <= seq {
			continue // answered before, or this one
		}
		p.inflight[n] = l
		n++
		for i := range limits {
			if limits[i].tokens {
				limits[i].launched += l.tokens
			} else {
				limits[i].launched++
			}
		}
	}
	p.inflight = p.inflight[:n]
	p.limits, p.observed = limits, seq
}

// holdUntil keeps every caller from launching before t.
func (p *pacer) holdUntil(t int64) {
	p.mu.Lock()
	p.until = max(p.until, t)
	p.mu.Unlock()
}

// reserve returns how long to wait before launching a request of tokens
// estimated tokens. When it returns zero it has counted the request down,
// and seq numbers the launch for observe. held reports that the wait is
// the hold after a 429 (holdUntil), not what the limits imply.
func (p *pacer) reserve(now, tokens int64) (wait time.Duration, seq uint64, held bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now < p.until {
		return time.Duration(p.until - now), 0, true
	}
	var d time.Duration
	for i := range p.limits {
		l := &p.limits[i]
		cost := int64(1)
		if l.tokens {
			cost = tokens
		}
		d = max(d, l.wait(now, cost))
	}
	if d > 0 {
		return min(d, maxHint), 0, false
	}
	for i := range p.limits {
		l := &p.limits[i]
		if l.tokens {
			l.launched += max(tokens, 0)
		} else {
			l.launched++
		}
	}
	p.seq++
	if len(p.inflight) >= maxInflight {
		p.inflight = append(p.inflight[:0], p.inflight[1:]...)
	}
	p.inflight = append(p.inflight, launch{seq: p.seq, tokens: max(tokens, 0)})
	return 0, p.seq, false
}
