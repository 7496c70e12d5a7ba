package gateway

import (
	"bytes"
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
	if _, ok := w.(*anthropicWriter); ok {
		writeAnthropicError(w, status, code, msg)
		return
	}
	var codeVal, paramVal any
	if code != "" {
		codeVal = code
	}
	if param != "" {
		paramVal = param
	}
	b := marshalJSON(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": paramVal, "code": codeVal}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// marshalJSON encodes v as JSON without encoding/json's HTML escapes, so
// that a message's "<key>" reads as written rather than "\u003ckey\u003e"
// (the bodies go as application/json with nosniff: no browser renders them
// as HTML). v must be encodable: the gateway's bodies are maps, strings and
// numbers.
func marshalJSON(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// formatReset writes a duration the way OpenAI's x-ratelimit-reset-*
// headers do ("1s", "6m0s", "250ms"), rounded up to the millisecond;
// time.ParseDuration reads it back.
func formatReset(d time.Duration) string {
	return string(httplimit.AppendResetDuration(nil, d))
}

// unit is what s counts, in the header model; ok is false for the
// reservation lease, which is not a limit.
func (s *spec) unit() (httplimit.Unit, bool) {
	switch s.kind {
	case kindRequests:
		return httplimit.Requests, true
	case kindTokens:
		return httplimit.Tokens, true
	case kindConcurrency:
		return httplimit.ConcurrentRequests, true
	}
	return 0, false
}

// quota is s with decision d, as the header model takes it.
func (s *spec) quota(d sluice.Decision) httplimit.Quota {
	u, _ := s.unit()
	name := s.name
	if s.model != "" {
		name += ":" + s.model
	}
	if s.level != "" {
		name = s.level + "." + name // "team.rpm"
	}
	return httplimit.Quota{Name: name, Unit: u, Algorithm: s.alg, Decision: d}
}

// rateLimitPolicy is the RateLimit-Policy field of a request on model
// ("" for a model without limits of its own): one item per limit that
// applies, in the order of specs, which is that of the request's
// decisions. It is the same for every response on the model, as the draft
// asks, so it is computed once.
func rateLimitPolicy(specs []spec, model string) string {
	var b []byte
	for i := range specs {
		s := &specs[i]
		if _, ok := s.unit(); !ok || !s.applies(model) {
			continue
		}
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		q := s.quota(sluice.Decision{Limit: s.limit})
		b = httplimit.AppendPolicyItem(b, &q)
	}
	return string(b)
}

// setLimitHeaders writes the header model of docs/API.md for the limits
// of the request: OpenAI's x-ratelimit-{limit,remaining,reset}-
// {requests,tokens}, each triple from the one limit of its unit that binds
// first, and the IETF RateLimit-Policy (the tier's, computed once) and
// RateLimit, most constraining first. The values are formatted into one
// string and share one slice: two allocations.
func (g *Gateway) setLimitHeaders(h http.Header, c *call, ds []sluice.Decision) {
	var qbuf [8]httplimit.Quota
	qs := qbuf[:0]
	for i, d := range ds {
		if _, ok := c.specs[i].unit(); ok {
			qs = append(qs, c.specs[i].quota(d))
		}
	}
	if len(qs) == 0 {
		return
	}
	var scratch [512]byte
	var obuf [8]int
	b, ends := httplimit.AppendOpenAIValues(scratch[:0], qs)
	b = httplimit.AppendRateLimit(b, qs, httplimit.Order(qs, obuf[:]))
	all := string(b)
	n := len(httplimit.OpenAIFields)
	vals := make([]string, n+2)
	from := 0
	for i, end := range ends {
		if vals[i] = all[from:end]; vals[i] != "" {
			h[httplimit.OpenAIFields[i]] = vals[i : i+1 : i+1]
		}
		from = end
	}
	vals[n] = all[from:]
	policies := c.client.tier.policies
	if c.client.levels != nil {
		policies = c.client.levels.policies
	}
	policy, ok := policies[c.rawModel]
	if !ok {
		policy, ok = policies[modelBase(c.rawModel)] // a snapshot's limits are its model's
	}
	if !ok {
		policy = policies[""]
	}
	vals[n+1] = policy
	h["Ratelimit"] = vals[n : n+1 : n+1]
	h["Ratelimit-Policy"] = vals[n+1 : n+2 : n+2]
}

// retryAfter is how long a denial asks the client to wait. A concurrency
// slot usually frees long before its lease lapses, so its wait is capped.
func retryAfter(s *spec, d sluice.Decision) time.Duration {
	if s.kind == kindConcurrency {
		return min(d.RetryAfter, time.Second)
	}
	return d.RetryAfter
}

// reject answers 429 for a batch that a limit denied, naming the limit
// (rate, period and burst), what is left of it and the amount requested.
func (g *Gateway) reject(w http.ResponseWriter, c *call, ds []sluice.Decision) {
	if g.rejectBudget(w, c, ds) {
		return
	}
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
	g.limited(c, s.reason(), wait)
	// The limit as rate, period and burst, and what is left of the burst:
	// "limit 500/min burst 50" never passes the burst off as the rate.
	msg := fmt.Sprintf("Rate limit reached for %s on tier %s: limit %s, %d left, requested %d. Please try again in %s.",
		s.describe(), c.client.tier.name, limitText(s.alg, d.Limit), max(d.Remaining, 0), c.reqs[worst].Cost, formatReset(wait))
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
	g.limited(c, "too_large", 0)
	msg := fmt.Sprintf("Request too large for %s on tier %s: at most %d at once (limit %s), requested %d (estimated prompt %d plus max_tokens times n). Reduce the prompt, max_tokens or n.",
		s.describe(), c.client.tier.name, s.limit.Capacity(), s.limit, c.reserved, c.promptEst)
	w.Header().Set("x-should-retry", "false")
	writeError(w, http.StatusTooManyRequests, "tokens", "request_too_large", "max_tokens", msg)
}
