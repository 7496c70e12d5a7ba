package upstream

// Reading a provider's headers. Every value comes from a peer that may
// send anything: each is parsed alone and bounded, so that one bad header
// never overflows a conversion, cools nothing, or discards a valid one
// beside it.
//
//   - Retry-After (RFC 9110 §10.2.3: delay-seconds or an HTTP-date; a
//     fraction is accepted) and retry-after-ms (OpenAI's, milliseconds):
//     a finite positive value is a cooldown, capped at MaxCooldown (1e10,
//     9999999999 and a date in year 9999 cool for MaxCooldown); zero,
//     negative, NaN, ±Inf, a date in the past and garbage are no value,
//     and the other header (or the reset headers, or DefaultCooldown)
//     decides. retry-after-ms is preferred when both are valid, being the
//     finer; a value past the cap yields to one within it.
//   - x-ratelimit-reset-requests / -tokens (OpenAI, Azure: a Go-style
//     duration, "1s", "6m0s", "20ms", "1m30.5s", or bare seconds) and
//     anthropic-ratelimit-*-reset (RFC 3339 instants): the same bounds.
//     On a 429 without a valid Retry-After, the longest reset of a limit
//     reported exhausted (remaining 0) is the cooldown.
//   - limits and remainders: decimal integers at most MaxHeaderCount;
//     larger ones are capped, anything else is no value.

import (
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// DefaultCooldown is how long a provider 429 without a valid Retry-After
// or reset cools its upstream's model.
const DefaultCooldown = time.Second

// MaxCooldown bounds the cooldown any provider header can ask for: a
// provider sending Retry-After: 1e10 cools its model for this long, not
// for 317 years, nor (by an overflowed conversion) for nothing.
const MaxCooldown = 10 * time.Minute

// MaxHeaderCount bounds a limit or remainder a provider reports; larger
// values are read as this.
const MaxHeaderCount = 1 << 40

// maxHeaderLen bounds the length of a header value parsed; longer ones
// are no value.
const maxHeaderLen = 64

// retryHeaders are the cooldowns a 429's headers ask for, each 0 when
// absent or invalid.
type retryHeaders struct {
	ms, seconds time.Duration
}

// readRetry reads Retry-After and retry-after-ms of h at now.
func readRetry(h http.Header, now time.Time) retryHeaders {
	var r retryHeaders
	if v, ok := header(h, "Retry-After-Ms"); ok {
		r.ms = boundedNumber(v, float64(time.Millisecond))
	}
	if v, ok := header(h, "Retry-After"); ok {
		if d := boundedNumber(v, float64(time.Second)); d > 0 {
			r.seconds = d
		} else if at, err := http.ParseTime(v); err == nil {
			r.seconds = until(at, now)
		}
	}
	return r
}

// cooldownOf is the cooldown a 429 with headers h, whose rate-limit
// headers read rl, asks for at now: its retry-after-ms or Retry-After
// (one within MaxCooldown preferred to one capped), else the longest
// reset of a limit reported exhausted, else DefaultCooldown; always in
// (0, MaxCooldown].
func cooldownOf(h http.Header, rl rateHeaders, now time.Time) time.Duration {
	r := readRetry(h, now)
	switch {
	case r.ms > 0 && (r.ms < MaxCooldown || r.seconds == 0 || r.seconds >= MaxCooldown):
		return r.ms
	case r.seconds > 0:
		return r.seconds
	}
	var reset time.Duration
	for i := range 4 {
		if rl.remaining[i] == 0 {
			reset = max(reset, rl.reset[i])
		}
	}
	if reset > 0 {
		return reset
	}
	return DefaultCooldown
}

// header returns h's first value of the canonical name, trimmed; false
// when absent, empty or longer than maxHeaderLen.
func header(h http.Header, name string) (string, bool) {
	vs := h[name]
	if len(vs) == 0 {
		return "", false
	}
	v := strings.TrimSpace(vs[0])
	if v == "" || len(v) > maxHeaderLen {
		return "", false
	}
	return v, true
}

// boundedNumber reads v, a decimal number of units of unit nanoseconds,
// as a duration in (0, MaxCooldown]; 0 when it is not a finite positive
// number.
func boundedNumber(v string, unit float64) time.Duration {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil && !isRange(err) {
		return 0
	}
	if math.IsNaN(f) || math.IsInf(f, 0) || f <= 0 {
		// ParseFloat reads "1e400" as +Inf with a range error: huge,
		// but a number; "Inf" and "infinity" are words, not numbers.
		if isRange(err) && f > 0 {
			return MaxCooldown
		}
		return 0
	}
	// Compared in floating point: f × unit may not fit a Duration.
	if f*unit >= float64(MaxCooldown) {
		return MaxCooldown
	}
	return max(time.Duration(f*unit), 1)
}

func isRange(err error) bool {
	ne, ok := err.(*strconv.NumError)
	return ok && ne.Err == strconv.ErrRange
}

// until is at less now, in (0, MaxCooldown]; 0 when at is not after now.
func until(at, now time.Time) time.Duration {
	if !at.After(now) {
		return 0
	}
	return min(at.Sub(now), MaxCooldown) // Sub saturates, never wraps
}

// resetOf reads a reset header: a duration ("6m0s", "20ms", bare seconds)
// or an RFC 3339 instant, in (0, MaxCooldown]; 0 when none or invalid.
func resetOf(v string, now time.Time) time.Duration {
	if d := boundedNumber(v, float64(time.Second)); d > 0 {
		return d
	}
	if durationRE.MatchString(v) {
		d, err := time.ParseDuration(v)
		if err != nil {
			return MaxCooldown // well formed: too long for a Duration
		}
		if d <= 0 {
			return 0
		}
		return min(d, MaxCooldown)
	}
	if at, err := time.Parse(time.RFC3339, v); err == nil {
		return until(at, now)
	}
	return 0
}

// durationRE is a positive Go-style duration, as OpenAI writes resets.
var durationRE = regexp.MustCompile(`^([0-9]+(\.[0-9]*)?(ns|us|µs|ms|s|m|h))+$`)

// rateHeaders are the limits and remainders a provider reported, -1 where
// it reported none, and when each limit resets (0: none), indexed as
// Limits' kinds.
type rateHeaders struct {
	limit, remaining [4]int64
	reset            [4]time.Duration
}

func (r rateHeaders) any() bool {
	for _, v := range r.remaining {
		if v >= 0 {
			return true
		}
	}
	return false
}

// Provider rate-limit headers, by Limits' kinds: OpenAI's and Azure's
// x-ratelimit-* (https://platform.openai.com/docs/guides/rate-limits),
// Anthropic's anthropic-ratelimit-*
// (https://docs.anthropic.com/en/api/rate-limits#response-headers).
var (
	limitHeaders = [4][]string{
		{"X-Ratelimit-Limit-Requests", "Anthropic-Ratelimit-Requests-Limit"},
		{"X-Ratelimit-Limit-Tokens", "Anthropic-Ratelimit-Tokens-Limit"},
		{"Anthropic-Ratelimit-Input-Tokens-Limit"},
		{"Anthropic-Ratelimit-Output-Tokens-Limit"},
	}
	remainingHeaders = [4][]string{
		{"X-Ratelimit-Remaining-Requests", "Anthropic-Ratelimit-Requests-Remaining"},
		{"X-Ratelimit-Remaining-Tokens", "Anthropic-Ratelimit-Tokens-Remaining"},
		{"Anthropic-Ratelimit-Input-Tokens-Remaining"},
		{"Anthropic-Ratelimit-Output-Tokens-Remaining"},
	}
	resetHeaders = [4][]string{
		{"X-Ratelimit-Reset-Requests", "Anthropic-Ratelimit-Requests-Reset"},
		{"X-Ratelimit-Reset-Tokens", "Anthropic-Ratelimit-Tokens-Reset"},
		{"Anthropic-Ratelimit-Input-Tokens-Reset"},
		{"Anthropic-Ratelimit-Output-Tokens-Reset"},
	}
)

// readHeaders reads the rate-limit headers of h at now; of a kind's
// headers, the last valid one wins.
func readHeaders(h http.Header, now time.Time) rateHeaders {
	r := rateHeaders{limit: [4]int64{-1, -1, -1, -1}, remaining: [4]int64{-1, -1, -1, -1}}
	for i := range 4 {
		for _, name := range limitHeaders[i] {
			if v := count(h, name); v >= 0 {
				r.limit[i] = v
			}
		}
		for _, name := range remainingHeaders[i] {
			if v := count(h, name); v >= 0 {
				r.remaining[i] = v
			}
		}
		for _, name := range resetHeaders[i] {
			if v, ok := header(h, name); ok {
				if d := resetOf(v, now); d > 0 {
					r.reset[i] = d
				}
			}
		}
	}
	return r
}

// count reads a count header: a decimal integer, capped at
// MaxHeaderCount; -1 when absent or not one.
func count(h http.Header, name string) int64 {
	v, ok := header(h, name)
	if !ok {
		return -1
	}
	n, err := strconv.ParseInt(v, 10, 64)
	switch {
	case err == nil && n >= 0:
		return min(n, MaxHeaderCount)
	case isRange(err) && !strings.HasPrefix(v, "-"):
		return MaxHeaderCount
	}
	return -1
}
