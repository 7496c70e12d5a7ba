package aiclient

import (
	"errors"
	"net/http"
	"time"
)

// attemptError is one failed attempt, with what the retry policy needs.
type attemptError struct {
	err         error       // *APIError, or a transport or decoding error
	header      http.Header // response headers, nil without a response
	hint        time.Duration
	hasHint     bool
	status      int
	transport   bool // no complete response: connection error or timeout
	unreadable  bool // a 2xx whose body did not decode
	tooBigReply bool
}

// retryable decides whether the attempt may be repeated. The order matters:
// a request that cannot succeed is never retried, whatever the server says
// in x-should-retry; then x-should-retry decides; then the status.
func (a *attemptError) retryable() bool {
	var apiErr *APIError
	if errors.As(a.err, &apiErr) && apiErr.Permanent() {
		return false
	}
	if a.tooBigReply {
		return false
	}
	if a.header != nil {
		if retry, ok := ParseShouldRetry(a.header); ok {
			return retry
		}
	}
	if a.transport || a.unreadable {
		return true
	}
	switch {
	case a.status == http.StatusRequestTimeout, a.status == http.StatusConflict,
		a.status == http.StatusTooManyRequests, a.status >= 500:
		return true
	}
	return false
}

// backoff returns the wait before retry number n (1 for the first retry).
// With a server hint it waits the hint plus up to half of BaseDelay of
// jitter, never less than the hint. Without one it waits a uniformly random
// time in [0, min(MaxDelay, BaseDelay·2^(n-1))): exponential backoff with
// full jitter.
func (c *Client) backoff(n int, hint time.Duration, hasHint bool) time.Duration {
	r := c.rand()
	if r < 0 || r >= 1 {
		r = 0
	}
	if hasHint {
		return hint + time.Duration(r*float64(c.opts.BaseDelay)/2)
	}
	ceiling := c.opts.BaseDelay
	for i := 1; i < n && ceiling < c.opts.MaxDelay; i++ {
		ceiling *= 2
	}
	ceiling = min(ceiling, c.opts.MaxDelay)
	return time.Duration(r * float64(ceiling))
}
