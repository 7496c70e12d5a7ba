package fakeopenai

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Window is how the Server counts its own limits.
type Window int

const (
	// Bucket is OpenAI's: a bucket of each limit, holding the limit and
	// refilling continuously over the period.
	Bucket Window = iota
	// Sliding counts what arrived in the last period.
	Sliding
	// Fixed counts what arrived since the period-long window, aligned to
	// the Unix epoch, began.
	Fixed
)

// limiter is the Server's own RPM and TPM.
type limiter struct {
	mu       sync.Mutex
	now      func() time.Time
	period   time.Duration
	window   Window
	rpm, tpm float64
	reqs     float64 // requests left
	toks     float64 // tokens left
	at       time.Time
	recent   []arrival // Sliding and Fixed: what counts, oldest first
	limited  []time.Time
	accepted []time.Time
	tokens   []int // of each accepted request, as counted
}

type arrival struct {
	at     time.Time
	tokens int
}

// refill brings reqs and toks to now.
func (l *limiter) refill(now time.Time) {
	if l.window == Bucket {
		if !l.at.IsZero() {
			dt := float64(now.Sub(l.at)) / float64(l.period)
			l.reqs = math.Min(l.rpm, l.reqs+dt*l.rpm)
			l.toks = math.Min(l.tpm, l.toks+dt*l.tpm)
		}
		l.at = now
		return
	}
	from := now.Add(-l.period)
	if l.window == Fixed {
		from = now.Truncate(l.period)
	}
	i := 0
	for i < len(l.recent) && !l.recent[i].at.After(from) && (l.window == Sliding || l.recent[i].at.Before(from)) {
		i++
	}
	l.recent = l.recent[i:]
	l.reqs, l.toks = l.rpm-float64(len(l.recent)), l.tpm
	for _, a := range l.recent {
		l.toks -= float64(a.tokens)
	}
}

// wait is how long until one more request of tokens fits, zero if now.
func (l *limiter) wait(now time.Time, tokens int) time.Duration {
	var wait time.Duration
	if l.window == Bucket {
		if l.rpm > 0 && l.reqs < 1 {
			wait = max(wait, time.Duration((1-l.reqs)/l.rpm*float64(l.period)))
		}
		if l.tpm > 0 && l.toks < float64(tokens) {
			wait = max(wait, time.Duration((float64(tokens)-l.toks)/l.tpm*float64(l.period)))
		}
		return wait
	}
	if (l.rpm <= 0 || l.reqs >= 1) && (l.tpm <= 0 || l.toks >= float64(tokens)) {
		return 0
	}
	if l.window == Fixed {
		return now.Truncate(l.period).Add(l.period).Sub(now)
	}
	// Sliding: until enough of the oldest arrivals slide out.
	reqs, toks := l.reqs, l.toks
	for _, a := range l.recent {
		reqs++
		toks += float64(a.tokens)
		if (l.rpm <= 0 || reqs >= 1) && (l.tpm <= 0 || toks >= float64(tokens)) {
			return a.at.Add(l.period).Sub(now)
		}
	}
	return l.period
}

func (l *limiter) init(o Options) {
	l.rpm, l.tpm, l.period, l.now, l.window = float64(o.RPM), float64(o.TPM), o.Period, o.Now, o.Window
	if l.period <= 0 {
		l.period = time.Minute
	}
	if l.now == nil {
		l.now = time.Now
	}
	l.reqs, l.toks = l.rpm, l.tpm
}

// take takes one request of tokens for model, or answers 429 itself, as
// OpenAI words it, and reports false. It sets the x-ratelimit-* headers
// either way.
func (l *limiter) take(w http.ResponseWriter, model string, tokens int) bool {
	if l.rpm <= 0 && l.tpm <= 0 {
		return true
	}
	l.mu.Lock()
	now := l.now()
	l.refill(now)
	wait := l.wait(now, tokens)
	ok := wait == 0
	if ok {
		l.reqs--
		l.toks -= float64(tokens)
		l.accepted = append(l.accepted, now)
		l.tokens = append(l.tokens, tokens)
		if l.window != Bucket {
			l.recent = append(l.recent, arrival{now, tokens})
		}
	} else {
		l.limited = append(l.limited, now)
	}
	var msg, typ string
	if !ok {
		msg, typ = refusal(model, l, tokens)
	}
	h := w.Header()
	if l.rpm > 0 {
		h.Set("x-ratelimit-limit-requests", strconv.Itoa(int(l.rpm)))
		h.Set("x-ratelimit-remaining-requests", strconv.Itoa(int(math.Max(l.reqs, 0))))
		h.Set("x-ratelimit-reset-requests", l.reset(now, (l.rpm-l.reqs)/l.rpm).String())
	}
	if l.tpm > 0 {
		h.Set("x-ratelimit-limit-tokens", strconv.Itoa(int(l.tpm)))
		h.Set("x-ratelimit-remaining-tokens", strconv.Itoa(int(math.Max(l.toks, 0))))
		h.Set("x-ratelimit-reset-tokens", l.reset(now, (l.tpm-l.toks)/l.tpm).String())
	}
	l.mu.Unlock()
	if ok {
		return true
	}
	h.Set("Retry-After", strconv.FormatInt(int64(math.Ceil(wait.Seconds())), 10))
	h.Set("retry-after-ms", strconv.FormatInt(int64(math.Ceil(float64(wait)/float64(time.Millisecond))), 10))
	h.Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusTooManyRequests)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"message": msg, "type": typ, "param": nil, "code": "rate_limit_exceeded",
	}})
	return false
}

// refusal is OpenAI's 429 message and error type for a request of tokens
// that l refuses, worded as OpenAI's API words it (its messages quoted in
// many public reports, such as "Rate limit reached for gpt-4o in
// organization org-... on tokens per min (TPM): Limit 30000, Used 14567,
// Requested 24754. Please try again in 18.642s." and "Request too large
// for gpt-4o in organization org-... on tokens per min (TPM): Limit 30000,
// Requested 30601. The input or output tokens must be reduced in order to
// run successfully."): the requests limit when it binds, else the tokens
// one. Called with l.mu held.
func refusal(model string, l *limiter, tokens int) (msg, typ string) {
	const org = "org-fake"
	if l.rpm > 0 && l.reqs < 1 {
		return fmt.Sprintf("Rate limit reached for %s in organization %s on requests per min (RPM): Limit %d, Used %d, Requested 1. Please try again later.",
			model, org, int(l.rpm), int(math.Ceil(l.rpm-math.Max(l.reqs, 0)))), "requests"
	}
	if tokens > int(l.tpm) {
		return fmt.Sprintf("Request too large for %s in organization %s on tokens per min (TPM): Limit %d, Requested %d. The input or output tokens must be reduced in order to run successfully.",
			model, org, int(l.tpm), tokens), "tokens"
	}
	return fmt.Sprintf("Rate limit reached for %s in organization %s on tokens per min (TPM): Limit %d, Used %d, Requested %d. Please try again later.",
		model, org, int(l.tpm), int(math.Ceil(l.tpm-math.Max(l.toks, 0))), tokens), "tokens"
}

// Limited is how many requests the server's own limits refused (429).
func (s *Server) Limited() int {
	s.lim.mu.Lock()
	defer s.lim.mu.Unlock()
	return len(s.lim.limited)
}

// LimitedAt returns when each request the server's limits refused
// arrived, oldest first.
func (s *Server) LimitedAt() []time.Time {
	s.lim.mu.Lock()
	defer s.lim.mu.Unlock()
	return append([]time.Time(nil), s.lim.limited...)
}

// Accepted returns when each request the server's limits admitted
// arrived, oldest first (only when RPM or TPM is set).
func (s *Server) Accepted() []time.Time {
	s.lim.mu.Lock()
	defer s.lim.mu.Unlock()
	return append([]time.Time(nil), s.lim.accepted...)
}

// AcceptedTokens returns the tokens the server's limits counted for each
// request they admitted, in the order of Accepted.
func (s *Server) AcceptedTokens() []int {
	s.lim.mu.Lock()
	defer s.lim.mu.Unlock()
	return append([]int(nil), s.lim.tokens...)
}

// reset is the x-ratelimit-reset-* value: the time until the limit is
// whole again, used being the fraction of it in use.
func (l *limiter) reset(now time.Time, used float64) time.Duration {
	switch {
	case used <= 0:
		return 0
	case l.window == Fixed:
		return now.Truncate(l.period).Add(l.period).Sub(now).Round(time.Millisecond)
	case l.window == Sliding && len(l.recent) > 0:
		return l.recent[len(l.recent)-1].at.Add(l.period).Sub(now).Round(time.Millisecond)
	}
	return time.Duration(used * float64(l.period)).Round(time.Millisecond)
}
