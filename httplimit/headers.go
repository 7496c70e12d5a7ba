package httplimit

import (
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-io/sluice"
)

// SetHeaders writes a decision's rate-limit headers onto h:
//
//   - RateLimit-Policy and RateLimit, the IETF draft's structured fields
//     (draft-ietf-httpapi-ratelimit-headers): `"name";q=10;w=1` and
//     `"name";r=3;t=1`, where q is the quota, w its window in seconds, r the
//     remaining quota and t the seconds until it is fully available again;
//   - X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset (seconds);
//   - Retry-After, in whole seconds rounded up, when the decision denies.
//
// policy names the limit in the IETF fields; empty means "default". Every
// duration is rounded up, so a client that obeys the headers never comes
// back too early.
func SetHeaders(h http.Header, policy string, d sluice.Decision) {
	if policy == "" {
		policy = "default"
	}
	quota := d.Limit.Capacity()
	window := sluice.CeilSeconds(d.Limit.Period)
	remaining := max(d.Remaining, 0)
	reset := d.ResetAfterSeconds()
	name := strconv.Quote(policy)
	// The names are already canonical, so assign without Header.Set's
	// canonicalisation: this runs on every decision.
	h["Ratelimit-Policy"] = []string{name + ";q=" + strconv.FormatInt(quota, 10) + ";w=" + strconv.FormatInt(window, 10)}
	h["Ratelimit"] = []string{name + ";r=" + strconv.FormatInt(remaining, 10) + ";t=" + strconv.FormatInt(reset, 10)}
	h["X-Ratelimit-Limit"] = []string{strconv.FormatInt(quota, 10)}
	h["X-Ratelimit-Remaining"] = []string{strconv.FormatInt(remaining, 10)}
	h["X-Ratelimit-Reset"] = []string{strconv.FormatInt(reset, 10)}
	if !d.Allowed {
		h["Retry-After"] = []string{strconv.FormatInt(max(d.RetryAfterSeconds(), 1), 10)}
	}
}

// RetryAfterMillis formats d rounded up to whole milliseconds, for headers
// such as retry-after-ms.
func RetryAfterMillis(d time.Duration) string {
	return strconv.FormatInt(sluice.CeilMillis(d), 10)
}
