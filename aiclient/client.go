// Package aiclient is an OpenAI-compatible chat completion client that
// keeps to a rate limit shared by every process that uses the same sluice
// store.
//
// Before each attempt a Client waits, rather than fails: for the server's
// own limits as its rate-limit headers describe them (every limit the
// server reports, the one that binds decides; a Retry-After or
// retry-after-ms wins over anything inferred, so headers that disagree
// never make it wait longer than the server asked), then for a request on
// the Requests limiter and for the estimated tokens on the Tokens limiter. After a response it settles the tokens actually used with
// Limiter.Charge or Limiter.Refund. With the limiters on a Redis store,
// every process and machine draws on one budget.
//
// Failed attempts are retried with exponential backoff and full jitter, or
// after the server's retry-after-ms / Retry-After, for 408, 409, 429, 5xx
// and connection errors, up to MaxRetries; x-should-retry overrides the
// status. A 429 that cannot succeed (insufficient_quota, or a request too
// large for the limit) is never retried.
package aiclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
)

// Options configure a Client. BaseURL is required.
type Options struct {
	// BaseURL is the API root that "/chat/completions" is appended to,
	// such as "https://api.openai.com/v1" ("/messages" for API
	// "anthropic", such as "https://api.anthropic.com/v1").
	BaseURL string
	// API is the wire format: APIOpenAI (the default) or APIAnthropic,
	// whose requests carry max_tokens always (MaxTokens, else
	// DefaultCompletionTokens) and the system messages as "system".
	API string
	// APIKey is sent as a bearer token (x-api-key for API "anthropic"). It
	// is never logged.
	APIKey string
	// HTTPClient sends the requests; nil means a client without a timeout
	// of its own (see AttemptTimeout). The Client uses a copy whose
	// redirects stay within the origin of BaseURL (see ErrRedirect).
	HTTPClient *http.Client
	// Header holds extra request headers.
	Header http.Header

	// Requests, when set, is waited on for one unit before every attempt.
	Requests *sluice.Limiter
	// Tokens, when set, is waited on for the estimated tokens before every
	// attempt and settled with the usage after the response. An estimate
	// above its burst waits for the burst and charges the rest afterwards.
	// A reported usage above the estimate plus one burst is settled as
	// that bound.
	Tokens *sluice.Limiter
	// LimitKey is the key used in both limiters. Clients that share it
	// share the budget. It defaults to sluice.HashKey(APIKey).
	LimitKey string
	// DefaultCompletionTokens is the completion size assumed when a request
	// sets no MaxTokens. It defaults to 256.
	DefaultCompletionTokens int64

	// MaxRetries is the number of retries after the first attempt. It
	// defaults to 5; set NoRetries for none.
	MaxRetries int
	// BaseDelay is the first backoff ceiling; it doubles per retry. It
	// defaults to 500ms.
	BaseDelay time.Duration
	// MaxDelay caps the backoff ceiling. It defaults to 30s.
	MaxDelay time.Duration
	// MaxRetryAfter is the longest server-requested wait that is honoured,
	// whether a Retry-After asks for it or the rate-limit headers imply it
	// before the next attempt; a longer one ends the call with
	// ErrRetryTooLong. It defaults to 5m.
	MaxRetryAfter time.Duration
	// AttemptTimeout bounds each attempt; a timed-out attempt is retried.
	// Zero means no bound beyond the context's.
	AttemptTimeout time.Duration
	// MaxResponseBytes bounds a response body. It defaults to 16 MiB.
	MaxResponseBytes int64

	// Clock reads the time for the server's rate-limit headers. It
	// defaults to the system clock.
	Clock clock.Clock
	// Sleep waits for d or until ctx is done; it defaults to a timer.
	// Tests pass one that advances a fake clock.
	Sleep func(ctx context.Context, d time.Duration) error
	// Rand returns a number in [0, 1) for the jitter; it defaults to
	// math/rand/v2.
	Rand func() float64
	// Logger receives a debug line per retry; nil discards.
	Logger *slog.Logger
}

// NoRetries, as Options.MaxRetries, disables retries.
const NoRetries = -1

// Client calls a chat completion API at the pace its limiters allow. It is
// safe for concurrent use.
type Client struct {
	opts     Options
	endpoint string
	http     *http.Client
	clock    clock.Clock
	sleep    func(context.Context, time.Duration) error
	rand     func() float64
	log      *slog.Logger
	pace     pacer
}

// New validates opts and returns a Client.
func New(opts Options) (*Client, error) {
	u, err := url.Parse(opts.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("aiclient: base url %q must be an absolute http(s) url", opts.BaseURL)
	}
	switch opts.API {
	case "":
		opts.API = APIOpenAI
	case APIOpenAI, APIAnthropic:
	default:
		return nil, fmt.Errorf("aiclient: unknown API %q; valid: openai, anthropic", opts.API)
	}
	switch {
	case opts.MaxRetries == 0:
		opts.MaxRetries = 5
	case opts.MaxRetries < 0:
		opts.MaxRetries = 0
	}
	if opts.BaseDelay <= 0 {
		opts.BaseDelay = 500 * time.Millisecond
	}
	if opts.MaxDelay <= 0 {
		opts.MaxDelay = 30 * time.Second
	}
	opts.MaxDelay = max(opts.MaxDelay, opts.BaseDelay)
	if opts.MaxRetryAfter <= 0 {
		opts.MaxRetryAfter = 5 * time.Minute
	}
	if opts.MaxResponseBytes <= 0 {
		opts.MaxResponseBytes = 16 << 20
	}
	if opts.DefaultCompletionTokens <= 0 {
		opts.DefaultCompletionTokens = 256
	}
	if opts.LimitKey == "" {
		opts.LimitKey = sluice.HashKey(opts.APIKey)
	}
	path := "/chat/completions"
	if opts.API == APIAnthropic {
		path = "/messages"
	}
	c := &Client{
		opts:     opts,
		endpoint: strings.TrimRight(opts.BaseURL, "/") + path,
		http:     sameOriginOnly(opts.HTTPClient),
		clock:    opts.Clock,
		sleep:    opts.Sleep,
		rand:     opts.Rand,
		log:      opts.Logger,
	}
	if c.clock == nil {
		c.clock = clock.NewSystem()
	}
	if c.sleep == nil {
		c.sleep = sleepTimer
	}
	if c.rand == nil {
		c.rand = rand.Float64
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// CallOptions adjust one call.
type CallOptions struct {
	// Stop, when closed, keeps the call from starting another attempt: a
	// wait for a limiter or a backoff ends with ErrStopped. An attempt
	// already sent runs to completion, bounded by the call's context.
	Stop <-chan struct{}
	// OnRetry is called before each backoff with the retry about to be
	// made (1 for the first), the error that caused it and the wait.
	OnRetry func(retry int, err error, wait time.Duration)
}

// Result describes a call, failed or not.
type Result struct {
	// Response is the completion; nil when the call failed.
	Response *ChatResponse
	// Attempts is the number of requests sent.
	Attempts int
	// EstimatedTokens is the estimate the token limiter was charged with
	// before each attempt.
	EstimatedTokens int64
}

// Chat sends req and returns the completion. See ChatWith.
func (c *Client) Chat(ctx context.Context, req *ChatRequest) (*Result, error) {
	return c.ChatWith(ctx, req, CallOptions{})
}

// ChatWith sends req, waiting for the limiters and retrying as the package
// documentation describes, and returns the completion. The Result is never
// nil. Cancelling ctx stops the call at once, also mid-request.
func (c *Client) ChatWith(ctx context.Context, req *ChatRequest, co CallOptions) (*Result, error) {
	res := &Result{EstimatedTokens: EstimateTokens(req, c.opts.DefaultCompletionTokens)}
	if req.Model == "" {
		return res, errors.New("aiclient: request has no model")
	}
	body, err := c.marshal(req)
	if err != nil {
		return res, fmt.Errorf("aiclient: encode request: %w", err)
	}
	// waitCtx ends the waits between attempts when Stop is closed.
	waitCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if co.Stop != nil {
		go func() {
			select {
			case <-co.Stop:
				cancel(ErrStopped)
			case <-waitCtx.Done():
			}
		}()
	}
	for retry := 0; ; retry++ {
		if stopped(co.Stop) {
			return res, ErrStopped
		}
		charged, seq, err := c.admit(waitCtx, res.EstimatedTokens)
		if err != nil {
			return res, c.stopErr(ctx, waitCtx, err)
		}
		if stopped(co.Stop) {
			c.refundRequest()
			c.settle(ctx, charged, 0)
			return res, ErrStopped
		}
		res.Attempts++
		resp, aerr := c.attempt(ctx, body, res.EstimatedTokens, seq)
		if aerr == nil {
			if used := resp.Usage.Total(); used > 0 { // without usage, the estimate is the best bound known
				c.settle(ctx, charged, c.boundUsage(used, res.EstimatedTokens))
			}
			res.Response = resp
			return res, nil
		}
		if ctx.Err() != nil {
			c.settle(ctx, charged, charged)
			return res, fmt.Errorf("aiclient: %w", context.Cause(ctx))
		}
		var apiErr *APIError
		if errors.As(aerr.err, &apiErr) {
			// The server answered, so it spent no tokens on the request.
			c.settle(ctx, charged, 0)
		}
		if !aerr.retryable() {
			return res, aerr.err
		}
		if retry >= c.opts.MaxRetries {
			return res, fmt.Errorf("%w after %d attempts: %w", ErrRetriesExhausted, res.Attempts, aerr.err)
		}
		if aerr.hasHint && aerr.hint > c.opts.MaxRetryAfter {
			if aerr.status == http.StatusTooManyRequests {
				// Every call is held, and fails unsent until then.
				c.pace.holdUntil(c.clock.Now() + int64(aerr.hint))
			}
			return res, fmt.Errorf("%w: %s > %s: %w", ErrRetryTooLong, aerr.hint, c.opts.MaxRetryAfter, aerr.err)
		}
		wait := c.backoff(retry+1, aerr.hint, aerr.hasHint)
		if aerr.status == http.StatusTooManyRequests {
			c.pace.holdUntil(c.clock.Now() + int64(wait))
		}
		c.log.Debug("aiclient: retrying", "status", aerr.status, "retry", retry+1, "wait", wait, "err", aerr.err)
		if co.OnRetry != nil {
			co.OnRetry(retry+1, aerr.err, wait)
		}
		if err := c.sleep(waitCtx, wait); err != nil {
			return res, c.stopErr(ctx, waitCtx, err)
		}
	}
}

// stopped reports whether stop is closed.
func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// stopErr names why a wait ended: the caller's context or Stop.
func (c *Client) stopErr(ctx, waitCtx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("aiclient: %w", context.Cause(ctx))
	}
	if errors.Is(context.Cause(waitCtx), ErrStopped) {
		return ErrStopped
	}
	return err
}

// admit waits for the server's pace and the limiters, and returns the
// tokens charged to the token limiter and the pacer's launch number.
func (c *Client) admit(ctx context.Context, estimate int64) (int64, uint64, error) {
	var seq uint64
	for {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		d, n, held := c.pace.reserve(c.clock.Now(), estimate)
		if d <= 0 {
			seq = n
			break
		}
		// As for a Retry-After this long: a limit spent for hours (or
		// headers that only claim so) fails the call, nothing sent,
		// rather than sleeping silently. A hold after a 429 that was
		// waited adds at most backoff's jitter to MaxRetryAfter.
		switch {
		case !held && d > c.opts.MaxRetryAfter:
			return 0, 0, fmt.Errorf("%w: the server's rate-limit headers imply a wait of %s > %s", ErrRetryTooLong, d, c.opts.MaxRetryAfter)
		case held && d > c.opts.MaxRetryAfter+c.opts.BaseDelay/2:
			return 0, 0, fmt.Errorf("%w: the server's 429 asked every call to wait %s > %s", ErrRetryTooLong, d, c.opts.MaxRetryAfter)
		}
		if err := c.sleep(ctx, d); err != nil {
			return 0, 0, err
		}
	}
	if l := c.opts.Requests; l != nil {
		if _, err := l.Wait(ctx, c.opts.LimitKey, 1); err != nil {
			return 0, 0, c.limiterErr(ctx, "requests", err)
		}
	}
	var charged int64
	if l := c.opts.Tokens; l != nil && estimate > 0 {
		r := l.Request(c.opts.LimitKey, estimate)
		charged = min(estimate, r.Capacity())
		if _, err := l.Wait(ctx, c.opts.LimitKey, charged); err != nil {
			c.refundRequest()
			return 0, 0, c.limiterErr(ctx, "tokens", err)
		}
	}
	if err := ctx.Err(); err != nil {
		c.refundRequest()
		c.settle(ctx, charged, 0)
		return 0, 0, err
	}
	return charged, seq, nil
}

func (c *Client) limiterErr(ctx context.Context, which string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w: %s: %w", ErrLimiter, which, err)
}

// refundRequest gives back a request unit taken for an attempt not sent.
func (c *Client) refundRequest() {
	if l := c.opts.Requests; l != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := l.Refund(ctx, c.opts.LimitKey, 1); err != nil {
			c.log.Warn("aiclient: refund request", "err", err)
		}
	}
}

// boundUsage returns the usage a response reported, bounded by what one
// request can plausibly use: its estimate plus one burst of the token
// limiter. A server's figure beyond it (a broken proxy, a unit mix-up) is
// not charged in full, so one response puts the shared key at most a
// burst's refill time beyond its estimate into debt, rather than for
// centuries, or past the limiter's arithmetic, which would wipe the key.
func (c *Client) boundUsage(used, estimate int64) int64 {
	l := c.opts.Tokens
	if l == nil {
		return used
	}
	bound := max(estimate, 0) + l.Limit().Capacity()
	if bound < 0 { // overflow: no real bound
		return used
	}
	if used > bound {
		c.log.Warn("aiclient: the server reported more tokens than a request can use; charging the bound", "used", used, "estimate", estimate, "bound", bound)
		return bound
	}
	return used
}

// settle corrects the token limiter from the charged estimate to the
// tokens used. It runs even when ctx is cancelled: the charge was made.
func (c *Client) settle(ctx context.Context, charged, used int64) {
	l := c.opts.Tokens
	if l == nil || charged == used || used < 0 {
		return
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var err error
	if used > charged {
		_, err = l.Charge(sctx, c.opts.LimitKey, used-charged)
	} else {
		_, err = l.Refund(sctx, c.opts.LimitKey, charged-used)
	}
	if err != nil {
		c.log.Warn("aiclient: settle tokens", "charged", charged, "used", used, "err", err)
	}
}

// attempt sends one request, of estimate tokens and the pacer's launch
// seq, and reads its response.
func (c *Client) attempt(ctx context.Context, body []byte, estimate int64, seq uint64) (*ChatResponse, *attemptError) {
	actx := ctx
	if c.opts.AttemptTimeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, c.opts.AttemptTimeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(actx, http.MethodPost, c.endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, &attemptError{err: fmt.Errorf("aiclient: build request: %w", err)}
	}
	for k, vs := range c.opts.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if c.opts.API == APIAnthropic {
		c.setAnthropicHeaders(req.Header)
	} else if c.opts.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.APIKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, &attemptError{err: fmt.Errorf("aiclient: send: %w", err), transport: !errors.Is(err, ErrRedirect)}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, c.opts.MaxResponseBytes+1))
	now := c.clock.Now()
	hint, hasHint := ParseRetryAfter(resp.Header, time.Unix(0, now))
	c.pace.observe(ParseRateLimit(resp.Header, time.Unix(0, now)), now, seq, estimate, hint, hasHint)
	if err != nil {
		return nil, &attemptError{err: fmt.Errorf("aiclient: read response: %w", err), header: resp.Header, status: resp.StatusCode, transport: true}
	}
	if int64(len(data)) > c.opts.MaxResponseBytes {
		return nil, &attemptError{err: fmt.Errorf("aiclient: response exceeds %d bytes", c.opts.MaxResponseBytes), status: resp.StatusCode, tooBigReply: true}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, &attemptError{
			err:    apiErrorFrom(resp.StatusCode, data, hint),
			header: resp.Header, hint: hint, hasHint: hasHint, status: resp.StatusCode,
		}
	}
	out, err := c.decode(data)
	var apiErr *APIError
	if errors.As(err, &apiErr) {
		return nil, &attemptError{err: apiErr, header: resp.Header, status: resp.StatusCode}
	}
	if err != nil {
		return nil, &attemptError{err: fmt.Errorf("aiclient: decode response: %w", err), header: resp.Header, status: resp.StatusCode, unreadable: true}
	}
	return out, nil
}

// marshal writes req in the client's wire format.
func (c *Client) marshal(req *ChatRequest) ([]byte, error) {
	if c.opts.API == APIAnthropic {
		return marshalAnthropic(req, c.opts.DefaultCompletionTokens)
	}
	return req.MarshalJSON()
}

// decode reads a 2xx response body in the client's wire format.
func (c *Client) decode(data []byte) (*ChatResponse, error) {
	if c.opts.API == APIAnthropic {
		return decodeAnthropic(data)
	}
	return decodeResponse(data)
}

// sameOriginOnly returns a copy of hc (a new client when nil) that follows
// a redirect only within the origin of the request: net/http would send
// the request's headers on to another host, x-api-key and any
// Options.Header included, and Authorization too to another port or scheme
// of the same host name, and a 307 or 308 the prompt with them.
func sameOriginOnly(hc *http.Client) *http.Client {
	var cp http.Client
	if hc != nil {
		cp = *hc
	}
	next := cp.CheckRedirect
	cp.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if from := via[0].URL; req.URL.Scheme != from.Scheme || !strings.EqualFold(req.URL.Host, from.Host) {
			return fmt.Errorf("%w: from %s://%s to %s://%s", ErrRedirect, from.Scheme, from.Host, req.URL.Scheme, req.URL.Host)
		}
		if next != nil {
			return next(req, via)
		}
		if len(via) >= 10 {
			return errors.New("aiclient: stopped after 10 redirects")
		}
		return nil
	}
	return &cp
}

func sleepTimer(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
