package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-io/sluice"
)

// writeError answers with OpenAI's error shape:
// {"error":{"message","type","param","code"}}.
func writeError(w http.ResponseWriter, status int, typ, code, param, msg string) {
	var codeVal, paramVal any
	if code != "" {
		codeVal = code
	}
	if param != "" {
		paramVal = param
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": paramVal, "code": codeVal}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// formatReset writes a duration the way OpenAI's x-ratelimit-reset-*
// headers do ("1s", "6m0s", "250ms"), rounded up to the millisecond;
// time.ParseDuration reads it back.
func formatReset(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	return (time.Duration(sluice.CeilMillis(d)) * time.Millisecond).String()
}

// setLimitHeaders writes OpenAI's x-ratelimit-{limit,remaining,reset}-
// {requests,tokens} and the IETF RateLimit-Policy and RateLimit fields for
// every limit of the request.
func (g *Gateway) setLimitHeaders(h http.Header, c *call, ds []sluice.Decision) {
	var reqDs, tokDs []sluice.Decision
	var policies, states []string
	for i, d := range ds {
		s := c.specs[i]
		if s.kind == kindReservation {
			continue // not a limit: nothing to publish
		}
		switch s.kind {
		case kindRequests:
			reqDs = append(reqDs, d)
		case kindTokens:
			tokDs = append(tokDs, d)
		}
		name := `"` + s.policy() + `"` // names are [A-Za-z0-9_.:/-]
		policy := name + ";q=" + strconv.FormatInt(d.Limit.Capacity(), 10)
		if s.kind != kindConcurrency {
			policy += ";w=" + strconv.FormatInt(sluice.CeilSeconds(d.Limit.Period), 10)
		}
		policies = append(policies, policy)
		states = append(states, name+";r="+strconv.FormatInt(max(d.Remaining, 0), 10)+";t="+strconv.FormatInt(d.ResetAfterSeconds(), 10))
	}
	for _, grp := range []struct {
		suffix string
		ds     []sluice.Decision
	}{{"requests", reqDs}, {"tokens", tokDs}} {
		if len(grp.ds) == 0 {
			continue
		}
		d := sluice.Combine(grp.ds)
		h.Set("x-ratelimit-limit-"+grp.suffix, strconv.FormatInt(d.Limit.Capacity(), 10))
		h.Set("x-ratelimit-remaining-"+grp.suffix, strconv.FormatInt(max(d.Remaining, 0), 10))
		h.Set("x-ratelimit-reset-"+grp.suffix, formatReset(d.ResetAfter))
	}
	if len(policies) > 0 {
		h.Set("RateLimit-Policy", strings.Join(policies, ", "))
		h.Set("RateLimit", strings.Join(states, ", "))
	}
}

// retryAfter is how long a denial asks the client to wait. A concurrency
// slot usually frees long before its lease lapses, so its wait is capped.
func retryAfter(s *spec, d sluice.Decision) time.Duration {
	if s.kind == kindConcurrency {
		return min(d.RetryAfter, time.Second)
	}
	return d.RetryAfter
}

// reject answers 429 for a batch that a limit denied, naming the limit,
// the amount used and the amount requested.
func (g *Gateway) reject(w http.ResponseWriter, c *call, ds []sluice.Decision) {
	worst := -1
	var wait time.Duration
	for i, d := range ds {
		if d.Allowed {
			continue
		}
		if ra := retryAfter(c.specs[i], d); worst < 0 || ra > wait {
			worst, wait = i, ra
		}
	}
	s, d := c.specs[worst], ds[worst]
	g.metrics.rejections.WithLabelValues(c.client.tier.name, c.model, s.name).Inc()
	capacity := d.Limit.Capacity()
	used := capacity - max(d.Remaining, 0)
	msg := fmt.Sprintf("Rate limit reached for %s on tier %s: limit %d, used %d, requested %d. Please try again in %s.",
		s.describe(), c.client.tier.name, capacity, used, c.reqs[worst].Cost, formatReset(wait))
	h := w.Header()
	h.Set("Retry-After", strconv.FormatInt(max(sluice.CeilSeconds(wait), 1), 10))
	h.Set("retry-after-ms", strconv.FormatInt(max(sluice.CeilMillis(wait), 1), 10))
	typ := "requests"
	if s.kind == kindTokens {
		typ = "tokens"
	}
	writeError(w, http.StatusTooManyRequests, typ, "rate_limit_exceeded", "", msg)
}

// tooLarge answers 429 for a request whose reservation exceeds a token
// limit's burst: it can never succeed, so clients are told not to retry.
func (g *Gateway) tooLarge(w http.ResponseWriter, c *call, s *spec) {
	g.metrics.rejections.WithLabelValues(c.client.tier.name, c.model, "too_large").Inc()
	msg := fmt.Sprintf("Request too large for %s on tier %s: limit %d, requested %d (estimated prompt %d plus max_tokens). Reduce the prompt or max_tokens.",
		s.describe(), c.client.tier.name, s.limit.Capacity(), c.reserved, c.promptEst)
	w.Header().Set("x-should-retry", "false")
	writeError(w, http.StatusTooManyRequests, "tokens", "request_too_large", "max_tokens", msg)
}
