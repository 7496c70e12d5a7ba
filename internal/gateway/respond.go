package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/httplimit"
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

// rateLimitPolicy is the RateLimit-Policy field of a request on model
// ("" for a model without limits of its own): one item per limit that
// applies, in the order of specs, which is that of the request's decisions.
func rateLimitPolicy(specs []spec, model string) string {
	var b []byte
	for i := range specs {
		s := &specs[i]
		if !s.applies(model) || s.kind == kindReservation {
			continue
		}
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = appendPolicyName(b, s)
		b = append(b, ";q="...)
		b = strconv.AppendInt(b, s.limit.Capacity(), 10)
		if s.kind != kindConcurrency {
			b = append(b, ";w="...)
			b = strconv.AppendInt(b, sluice.CeilSeconds(s.limit.Period), 10)
		}
	}
	return string(b)
}

// appendPolicyName appends the quoted name of s's limit; names are
// [A-Za-z0-9_.:/-].
func appendPolicyName(b []byte, s *spec) []byte {
	b = append(append(b, '"'), s.name...)
	if s.model != "" {
		b = append(append(b, ':'), s.model...)
	}
	return append(b, '"')
}

// setLimitHeaders writes OpenAI's x-ratelimit-{limit,remaining,reset}-
// {requests,tokens} and the IETF RateLimit-Policy and RateLimit fields for
// every limit of the request. The policy is the tier's, computed once; the
// values are built in one buffer and share one string.
func (g *Gateway) setLimitHeaders(h http.Header, c *call, ds []sluice.Decision) {
	var reqBuf, tokBuf [8]sluice.Decision
	reqDs, tokDs := reqBuf[:0], tokBuf[:0]
	b := make([]byte, 0, 256)
	// ends[i] is where value i ends in b: RateLimit, then limit, remaining
	// and reset for requests, then for tokens.
	var ends [7]int
	for i, d := range ds {
		s := c.specs[i]
		switch s.kind {
		case kindReservation:
			continue // not a limit: nothing to publish
		case kindRequests:
			reqDs = append(reqDs, d)
		case kindTokens:
			tokDs = append(tokDs, d)
		}
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = appendPolicyName(b, s)
		b = append(b, ";r="...)
		b = strconv.AppendInt(b, max(d.Remaining, 0), 10)
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, d.ResetAfterSeconds(), 10)
	}
	ends[0] = len(b)
	for gi, grp := range [2][]sluice.Decision{reqDs, tokDs} {
		at := 1 + 3*gi
		if len(grp) > 0 {
			d := sluice.Combine(grp)
			b = strconv.AppendInt(b, d.Limit.Capacity(), 10)
			ends[at] = len(b)
			b = strconv.AppendInt(b, max(d.Remaining, 0), 10)
			ends[at+1] = len(b)
			b = append(b, formatReset(d.ResetAfter)...)
		} else {
			ends[at], ends[at+1] = len(b), len(b)
		}
		ends[at+2] = len(b)
	}
	all := string(b)
	vals := make([]string, 7)
	for i := range vals {
		from := 0
		if i > 0 {
			from = ends[i-1]
		}
		vals[i] = all[from:ends[i]]
	}
	set := func(key string, i int) { h[key] = vals[i : i+1 : i+1] }
	if len(reqDs) > 0 {
		set("X-Ratelimit-Limit-Requests", 1)
		set("X-Ratelimit-Remaining-Requests", 2)
		set("X-Ratelimit-Reset-Requests", 3)
	}
	if len(tokDs) > 0 {
		set("X-Ratelimit-Limit-Tokens", 4)
		set("X-Ratelimit-Remaining-Tokens", 5)
		set("X-Ratelimit-Reset-Tokens", 6)
	}
	if ends[0] > 0 {
		policy, ok := c.client.tier.policies[c.rawModel]
		if !ok {
			policy = c.client.tier.policies[""]
		}
		h["Ratelimit-Policy"] = []string{policy}
		set("Ratelimit", 0)
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
	h.Set("retry-after-ms", httplimit.RetryAfterMillis(max(wait, time.Millisecond)))
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
