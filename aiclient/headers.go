package aiclient

// Header parsing. Servers tell a client how to pace itself in several
// dialects, and every one of them is read here, defensively: a malformed
// value is ignored, never an error and never a panic, and every duration is
// clamped to [0, maxHint].
//
//   - Retry hints: retry-after-ms (OpenAI, milliseconds), Retry-After
//     (RFC 9110: delay-seconds or an HTTP-date) and x-should-retry
//     ("true"/"false", OpenAI's and Anthropic's servers).
//   - OpenAI: x-ratelimit-{limit,remaining,reset}-{requests,tokens}, where
//     reset is a Go-like duration such as "6m0s", "1s" or "20ms".
//   - Anthropic: anthropic-ratelimit-{requests,tokens,input-tokens}-
//     {limit,remaining,reset}, where reset is an RFC 3339 time.
//   - IETF draft-ietf-httpapi-ratelimit-headers: the structured fields
//     RateLimit: "p";r=3;t=10 and RateLimit-Policy: "p";q=100;w=60, one
//     item per limit, with sluice's sluice-burst and sluice-qu="tokens";
//     and the older RateLimit-Limit / RateLimit-Remaining / RateLimit-Reset.
//   - The common X-RateLimit-Limit / X-RateLimit-Remaining /
//     X-RateLimit-Reset, where reset is seconds, or a Unix time when large.

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxHint bounds every duration read from a header, so that arithmetic on
// it cannot overflow. A server asking for more than a day is taken as
// asking for a day.
const maxHint = 24 * time.Hour

// Window is what a server reported about one of its limits.
type Window struct {
	// Known reports whether the server sent a remaining count.
	Known bool
	// Limit is the limit's size, or 0 when not reported.
	Limit int64
	// Remaining is how much of the limit is left.
	Remaining int64
	// Reset is the time until the limit is fully available again, or 0
	// when not reported.
	Reset time.Duration
	// Linear reports that the limit refills continuously (OpenAI's and
	// Anthropic's token buckets), so one unit comes back after
	// Reset/(Limit-Remaining). Otherwise the limit is a window that
	// refills all at once after Reset.
	Linear bool
	// Interval is the time one unit takes to come back, when the server
	// stated its sustained rate (the IETF RateLimit-Policy's w seconds per
	// q units); 0 when it did not. It is exact where Linear guesses.
	Interval time.Duration
}

// WaitFor returns how long to wait, from the time the headers were read,
// before cost units of this limit are available; zero when they are, or
// when too little is known to tell.
func (w Window) WaitFor(cost int64) time.Duration {
	if !w.Known || w.Remaining >= cost {
		return 0
	}
	if w.Interval > 0 {
		need := float64(cost - w.Remaining)
		return clampSeconds(need * w.Interval.Seconds())
	}
	if w.Reset <= 0 {
		return 0
	}
	if w.Linear && w.Limit > w.Remaining && w.Limit >= cost {
		need := float64(cost - w.Remaining)
		d := time.Duration(float64(w.Reset) * need / float64(w.Limit-w.Remaining))
		return min(d, w.Reset)
	}
	return w.Reset
}

// RateLimitInfo is what a response's headers say about the server's limits.
type RateLimitInfo struct {
	// Requests is the request-count limit: the provider's own (OpenAI's,
	// Anthropic's), else the most constrained request policy of the IETF
	// fields, else the X-RateLimit triple.
	Requests Window
	// Tokens is the token limit: the provider's own, else the most
	// constrained token policy of the IETF fields.
	Tokens Window
	// Policies are the limits of the IETF RateLimit field, one per limit
	// the server enforces, with what RateLimit-Policy says of each.
	Policies []Policy
}

// Policy is one limit of the IETF RateLimit field.
type Policy struct {
	// Name is the policy's name.
	Name string
	// Unit is what it counts: "requests" (the draft's default), "tokens"
	// (sluice-qu), "concurrent-requests", or another unit the server
	// named.
	Unit string
	// Window is its state: Remaining from r, Reset from t, Limit from q,
	// and Interval from w/q.
	Window
}

// ParseRateLimit reads the rate-limit headers of every dialect this package
// knows from h. now resolves the absolute times of Anthropic's headers and
// of a Unix-time X-RateLimit-Reset. When several dialects are present the
// provider-specific ones win.
func ParseRateLimit(h http.Header, now time.Time) RateLimitInfo {
	var info RateLimitInfo
	info.Requests, info.Tokens, info.Policies = parseIETF(h, now)
	if w := parseTriple(h, "X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests", now, resetDuration); w.Known {
		w.Linear = true
		info.Requests = w
	}
	if w := parseTriple(h, "X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens", now, resetDuration); w.Known {
		w.Linear = true
		info.Tokens = w
	}
	if w := parseTriple(h, "Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset", now, resetRFC3339); w.Known {
		w.Linear = true
		info.Requests = w
	}
	for _, dim := range []string{"Input-Tokens", "Tokens"} {
		if w := parseTriple(h, "Anthropic-Ratelimit-"+dim+"-Limit", "Anthropic-Ratelimit-"+dim+"-Remaining", "Anthropic-Ratelimit-"+dim+"-Reset", now, resetRFC3339); w.Known {
			w.Linear = true
			info.Tokens = w
		}
	}
	return info
}

// parseIETF reads the IETF structured fields, then the older IETF fields,
// then X-RateLimit-*, and returns the most constrained request and token
// limits and, from the structured fields, every policy.
func parseIETF(h http.Header, now time.Time) (req, tok Window, policies []Policy) {
	if v := h.Values("Ratelimit"); len(v) > 0 {
		policies = parseStructuredRateLimit(strings.Join(v, ","), strings.Join(h.Values("Ratelimit-Policy"), ","))
		for i := range policies {
			p := &policies[i]
			switch p.Unit {
			case "requests":
				req = moreConstrained(req, p.Window)
			case "tokens":
				tok = moreConstrained(tok, p.Window)
			}
		}
		if req.Known || tok.Known {
			return req, tok, policies
		}
	}
	if w := parseTriple(h, "Ratelimit-Limit", "Ratelimit-Remaining", "Ratelimit-Reset", now, resetSeconds); w.Known {
		return w, tok, policies
	}
	return parseTriple(h, "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", now, resetSeconds), tok, policies
}

// moreConstrained returns the window with less remaining, then the longer
// reset.
func moreConstrained(a, b Window) Window {
	if !a.Known || b.Remaining < a.Remaining || (b.Remaining == a.Remaining && b.Reset > a.Reset) {
		return b
	}
	return a
}

// parseTriple reads a limit/remaining/reset header triple.
func parseTriple(h http.Header, limitKey, remainingKey, resetKey string, now time.Time, reset func(string, time.Time) (time.Duration, bool)) Window {
	rem, ok := parseCount(h.Get(remainingKey))
	if !ok {
		return Window{}
	}
	w := Window{Known: true, Remaining: rem}
	if l, ok := parseCount(h.Get(limitKey)); ok {
		w.Limit = l
	}
	if d, ok := reset(h.Get(resetKey), now); ok {
		w.Reset = d
	}
	return w
}

// parseCount reads a non-negative integer, tolerating a ";w=60" suffix as
// some servers send in RateLimit-Limit, and a fraction, which it truncates.
func parseCount(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	if i := strings.IndexAny(s, ",;"); i >= 0 {
		s = strings.TrimSpace(s[:i])
	}
	if s == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return max(n, 0), true
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	switch {
	case f <= 0:
		return 0, true
	case f >= math.MaxInt64/2:
		return math.MaxInt64 / 2, true
	}
	return int64(f), true
}

// maxPolicies bounds the policies read from one response.
const maxPolicies = 32

// parseStructuredRateLimit reads the IETF RateLimit field, a list of
// `"policy";r=remaining;t=reset` items, and RateLimit-Policy for each
// one's quota q per w seconds, unit (qu, or sluice-qu) and burst. An item
// without r is ignored, as the draft asks of malformed ones.
func parseStructuredRateLimit(rl, policy string) []Policy {
	type quota struct {
		q, w int64
		unit string
	}
	quotas := map[string]quota{}
	for _, item := range splitList(policy) {
		name, params := splitItem(item)
		q, ok := parseCount(params["q"])
		if !ok || len(quotas) >= maxPolicies {
			continue
		}
		qt := quota{q: q, unit: "requests"}
		if w, ok := parseCount(params["w"]); ok {
			qt.w = w
		}
		if u := params["qu"]; u != "" {
			qt.unit = u
		}
		if u := params["sluice-qu"]; u != "" {
			qt.unit = u
		}
		quotas[name] = qt
	}
	var out []Policy
	for _, item := range splitList(rl) {
		name, params := splitItem(item)
		r, ok := parseCount(params["r"])
		if !ok || len(out) >= maxPolicies {
			continue
		}
		qt, hasQuota := quotas[name]
		p := Policy{Name: name, Unit: "requests", Window: Window{Known: true, Remaining: r}}
		if hasQuota {
			p.Unit, p.Limit = qt.unit, qt.q
			if qt.q > 0 && qt.w > 0 {
				p.Interval = clampSeconds(float64(qt.w) / float64(qt.q))
			}
		}
		if t, ok := parseSeconds(params["t"]); ok {
			p.Reset = t
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		// Draft 3's "limit=10, remaining=3, reset=4" splits into three items.
		params := map[string]string{}
		for _, item := range splitList(rl) {
			_, p := splitItem(item)
			for k, v := range p {
				params[k] = v
			}
		}
		if r, ok := parseCount(params["remaining"]); ok {
			p := Policy{Unit: "requests", Window: Window{Known: true, Remaining: r}}
			if l, ok := parseCount(params["limit"]); ok {
				p.Limit = l
			}
			if t, ok := parseSeconds(params["reset"]); ok {
				p.Reset = t
			}
			out = append(out, p)
		}
	}
	return out
}

// maxListItems bounds the items read from one structured-field list: past
// maxPolicies kept, a server sending more (net/http allows 10 MB of
// headers, a million items) would only cost a map each.
const maxListItems = 4 * maxPolicies

// splitList splits a structured-field list on commas outside quotes, and
// returns its first maxListItems items.
func splitList(s string) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(s) && len(out) < maxListItems; i++ {
		switch s[i] {
		case '"':
			quoted = !quoted
		case '\\':
			if quoted {
				i++
			}
		case ',':
			if !quoted {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	if start <= len(s) && len(out) < maxListItems {
		if last := strings.TrimSpace(s[start:]); last != "" {
			out = append(out, last)
		}
	}
	return out
}

// splitItem splits `"name";k=v;k2=v2` into the name and its parameters. A
// bare `k=v` item is all parameters.
func splitItem(item string) (string, map[string]string) {
	params := map[string]string{}
	parts := strings.Split(item, ";")
	name := strings.TrimSpace(parts[0])
	if k, v, ok := strings.Cut(name, "="); ok && !strings.HasPrefix(name, `"`) {
		params[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
		name = ""
	}
	name = strings.Trim(name, `"`)
	for _, p := range parts[1:] {
		if k, v, ok := strings.Cut(p, "="); ok {
			params[strings.ToLower(strings.TrimSpace(k))] = strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	return name, params
}

// parseSeconds reads a non-negative number of seconds, possibly fractional.
func parseSeconds(s string) (time.Duration, bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) {
		return 0, false
	}
	return clampSeconds(f), true
}

func clampSeconds(f float64) time.Duration {
	if f <= 0 {
		return 0
	}
	if f >= maxHint.Seconds() {
		return maxHint
	}
	return time.Duration(f * float64(time.Second))
}

func clampDuration(d time.Duration) time.Duration {
	return min(max(d, 0), maxHint)
}

// resetSeconds reads X-RateLimit-Reset and RateLimit-Reset: seconds from
// now, or, when the value is too large to be a delay, Unix seconds.
func resetSeconds(s string, now time.Time) (time.Duration, bool) {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(f) {
		return 0, false
	}
	if f > 1e9 && f < 1e11 { // a Unix time, between 2001 and 5138
		return clampDuration(time.Unix(int64(f), 0).Sub(now)), true
	}
	return clampSeconds(f), true
}

// resetDuration reads OpenAI's reset values ("6m0s", "1s", "20ms", "1h2m3.5s").
func resetDuration(s string, _ time.Time) (time.Duration, bool) {
	return ParseResetDuration(s)
}

// resetRFC3339 reads Anthropic's reset times.
func resetRFC3339(s string, now time.Time) (time.Duration, bool) {
	t, err := time.Parse(time.RFC3339, strings.TrimSpace(s))
	if err != nil {
		return 0, false
	}
	return clampDuration(t.Sub(now)), true
}

// ParseResetDuration reads a duration as OpenAI's x-ratelimit-reset-*
// headers carry it, such as "6m0s", "1s", "20ms" or "1h2m3.5s"; a bare
// number is seconds. The result is clamped to [0, 24h].
func ParseResetDuration(s string) (time.Duration, bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, false
	}
	if d, ok := parseSeconds(s); ok {
		return d, true
	}
	// A sequence of number-unit pairs, such as "6m0s" or "1d2h"; summed in
	// float seconds so that no value overflows.
	units := []struct {
		name string
		sec  float64
	}{{"ms", 1e-3}, {"us", 1e-6}, {"µs", 1e-6}, {"ns", 1e-9}, {"d", 86400}, {"h", 3600}, {"m", 60}, {"s", 1}}
	total := 0.0
	rest, negative := strings.CutPrefix(s, "-")
	if rest == "" {
		return 0, false
	}
	for rest != "" {
		i := 0
		for i < len(rest) && (rest[i] >= '0' && rest[i] <= '9' || rest[i] == '.') {
			i++
		}
		if i == 0 {
			return 0, false
		}
		n, err := strconv.ParseFloat(rest[:i], 64)
		if err != nil {
			return 0, false
		}
		rest = rest[i:]
		matched := false
		for _, u := range units {
			if strings.HasPrefix(rest, u.name) {
				total += n * u.sec
				rest = rest[len(u.name):]
				matched = true
				break
			}
		}
		if !matched {
			return 0, false
		}
	}
	if negative {
		return 0, true
	}
	return clampSeconds(total), true
}

// ParseRetryAfter reads the server's retry hint from h: retry-after-ms
// first, then Retry-After as delay-seconds or an HTTP-date (resolved against
// now). ok is false when neither is present and valid.
func ParseRetryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if f, err := strconv.ParseFloat(v, 64); err == nil && !math.IsNaN(f) {
			return clampSeconds(f / 1000), true
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if d, ok := parseSeconds(v); ok {
		return d, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return clampDuration(t.Sub(now)), true
	}
	return 0, false
}

// ParseShouldRetry reads x-should-retry: retry is the server's advice, and
// ok is false when the header is absent or neither "true" nor "false".
func ParseShouldRetry(h http.Header) (retry, ok bool) {
	switch strings.ToLower(strings.TrimSpace(h.Get("X-Should-Retry"))) {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}
