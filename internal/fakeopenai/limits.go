package fakeopenai

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// limiter is the Server's own RPM and TPM: OpenAI's buckets, each holding
// its limit and refilling continuously over the period.
type limiter struct {
	mu       sync.Mutex
	now      func() time.Time
	period   time.Duration
	rpm, tpm float64
	reqs     float64 // requests left
	toks     float64 // tokens left
	at       time.Time
	limited  []time.Time
	accepted []time.Time
}

func (l *limiter) init(o Options) {
	l.rpm, l.tpm, l.period, l.now = float64(o.RPM), float64(o.TPM), o.Period, o.Now
	if l.period <= 0 {
		l.period = time.Minute
	}
	if l.now == nil {
		l.now = time.Now
	}
	l.reqs, l.toks = l.rpm, l.tpm
}

// take takes one request of tokens, or answers 429 itself and reports
// false. It sets the x-ratelimit-* headers either way.
func (l *limiter) take(w http.ResponseWriter, tokens int) bool {
	if l.rpm <= 0 && l.tpm <= 0 {
		return true
	}
	l.mu.Lock()
	now := l.now()
	if !l.at.IsZero() {
		dt := float64(now.Sub(l.at)) / float64(l.period)
		l.reqs = math.Min(l.rpm, l.reqs+dt*l.rpm)
		l.toks = math.Min(l.tpm, l.toks+dt*l.tpm)
	}
	l.at = now
	var wait time.Duration
	if l.rpm > 0 && l.reqs < 1 {
		wait = max(wait, time.Duration((1-l.reqs)/l.rpm*float64(l.period)))
	}
	if l.tpm > 0 && l.toks < float64(tokens) {
		wait = max(wait, time.Duration((float64(tokens)-l.toks)/l.tpm*float64(l.period)))
	}
	ok := wait == 0
	if ok {
		l.reqs--
		l.toks -= float64(tokens)
		l.accepted = append(l.accepted, now)
	} else {
		l.limited = append(l.limited, now)
	}
	h := w.Header()
	if l.rpm > 0 {
		h.Set("x-ratelimit-limit-requests", strconv.Itoa(int(l.rpm)))
		h.Set("x-ratelimit-remaining-requests", strconv.Itoa(int(math.Max(l.reqs, 0))))
		h.Set("x-ratelimit-reset-requests", time.Duration((l.rpm-l.reqs)/l.rpm*float64(l.period)).Round(time.Millisecond).String())
	}
	if l.tpm > 0 {
		h.Set("x-ratelimit-limit-tokens", strconv.Itoa(int(l.tpm)))
		h.Set("x-ratelimit-remaining-tokens", strconv.Itoa(int(math.Max(l.toks, 0))))
		h.Set("x-ratelimit-reset-tokens", time.Duration((l.tpm-l.toks)/l.tpm*float64(l.period)).Round(time.Millisecond).String())
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
		"message": "fakeopenai: rate limit reached for requests", "type": "requests", "param": nil, "code": "rate_limit_exceeded",
	}})
	return false
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
