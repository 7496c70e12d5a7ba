package aiclient

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Errors a call can end with. They work with errors.Is.
var (
	// ErrInsufficientQuota means the account is out of credit or over its
	// billing quota: a 429 that no retry can fix.
	ErrInsufficientQuota = errors.New("aiclient: insufficient quota")
	// ErrRequestTooLarge means the request alone exceeds a limit of the
	// server (413, a context-length error, or a 429 "request too large"),
	// so retrying it cannot succeed.
	ErrRequestTooLarge = errors.New("aiclient: request too large")
	// ErrRetriesExhausted means the call failed with a retryable error on
	// every attempt allowed.
	ErrRetriesExhausted = errors.New("aiclient: retries exhausted")
	// ErrStopped means the call was told to stop before an attempt, by
	// CallOptions.Stop; nothing was sent for that attempt.
	ErrStopped = errors.New("aiclient: stopped before the next attempt")
	// ErrRetryTooLong means the server asked for a wait longer than
	// Options.MaxRetryAfter.
	ErrRetryTooLong = errors.New("aiclient: server asked to wait too long")
	// ErrLimiter means a sluice limiter failed, for example because its
	// store could not be reached.
	ErrLimiter = errors.New("aiclient: limiter failed")
	// ErrRedirect means the server redirected a call to another origin
	// (scheme, host or port). The client does not follow: the API key and
	// the prompt would go there. Set BaseURL to the final URL instead.
	ErrRedirect = errors.New("aiclient: redirect to another origin refused")
)

// APIError is a response with a non-2xx status.
type APIError struct {
	// StatusCode is the HTTP status.
	StatusCode int
	// Type, Code, Param and Message are the fields of the OpenAI error
	// body, when the server sent one.
	Type, Code, Param, Message string
	// RetryAfter is the server's retry hint, or 0.
	RetryAfter time.Duration
}

// Error implements error.
func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "aiclient: status %d", e.StatusCode)
	if c := e.Code; c != "" {
		fmt.Fprintf(&b, " (%s)", c)
	} else if e.Type != "" {
		fmt.Fprintf(&b, " (%s)", e.Type)
	}
	if e.Message != "" {
		msg := e.Message
		if len(msg) > 300 {
			msg = msg[:300] + "…"
		}
		b.WriteString(": ")
		b.WriteString(msg)
	}
	return b.String()
}

// Is makes errors.Is match ErrInsufficientQuota and ErrRequestTooLarge.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrInsufficientQuota:
		return e.insufficientQuota()
	case ErrRequestTooLarge:
		return e.tooLarge()
	}
	return false
}

func (e *APIError) insufficientQuota() bool {
	return e.Code == "insufficient_quota" || e.Type == "insufficient_quota" ||
		e.Code == "billing_hard_limit_reached" || e.Type == "billing_error"
}

func (e *APIError) tooLarge() bool {
	if e.StatusCode == http.StatusRequestEntityTooLarge {
		return true
	}
	switch e.Code {
	case "context_length_exceeded", "request_too_large", "string_above_max_length":
		return true
	}
	if e.Type == "request_too_large" {
		return true
	}
	// OpenAI: 429 "Request too large for gpt-4 ... on tokens per min (TPM):
	// Limit 10000, Requested 12000."
	return strings.HasPrefix(strings.ToLower(e.Message), "request too large")
}

// Permanent reports whether retrying the request cannot succeed.
func (e *APIError) Permanent() bool { return e.insufficientQuota() || e.tooLarge() }

// apiErrorFrom builds an APIError from a response and its (bounded) body.
// It reads OpenAI's {"error":{...}} and Anthropic's {"type":"error",
// "error":{"type":..,"message":..}} bodies, and a plain-text body.
func apiErrorFrom(status int, body []byte, retryAfter time.Duration) *APIError {
	e := &APIError{StatusCode: status, RetryAfter: retryAfter}
	var wire struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(body, &wire) == nil && len(wire.Error) > 0 {
		var detail struct {
			Type, Param, Message string
			Code                 json.RawMessage
		}
		if json.Unmarshal(wire.Error, &detail) == nil {
			e.Type, e.Param, e.Message = detail.Type, detail.Param, detail.Message
			var code string
			if json.Unmarshal(detail.Code, &code) == nil {
				e.Code = code
			} else if len(detail.Code) > 0 && string(detail.Code) != "null" {
				e.Code = string(detail.Code)
			}
			return e
		}
		var s string
		if json.Unmarshal(wire.Error, &s) == nil {
			e.Message = s
			return e
		}
	}
	e.Message = strings.TrimSpace(string(body))
	return e
}
