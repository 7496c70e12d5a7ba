package httplimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/sluice-io/sluice"
)

// ErrNoKey means a request carries nothing to key it on, such as a missing
// API-key header.
var ErrNoKey = errors.New("httplimit: no rate-limit key in request")

// KeyFunc derives the rate-limit key of a request.
type KeyFunc func(r *http.Request) (string, error)

// Options configure the middleware. Limiter is required.
type Options struct {
	// Limiter decides per key.
	Limiter *sluice.Limiter
	// Key derives the key. Nil means ByClientIP() with no trusted proxies.
	Key KeyFunc
	// Cost returns a request's cost. Nil means 1.
	Cost func(r *http.Request) int64
	// Policy names the limit in the RateLimit headers. Empty means "default".
	Policy string
	// FailOpen lets requests through when the limiter fails (for example,
	// its store is down and its own failure policy returns an error).
	// By default such requests get 503.
	FailOpen bool
	// Logger receives limiter errors. Nil means slog.Default().
	Logger *slog.Logger
}

// New returns middleware that limits requests to next. Admitted requests
// carry the rate-limit headers; denied ones get 429 with Retry-After, the
// headers and a JSON body:
//
//	{"error":"rate_limited","message":"...","retry_after_ms":1234}
func New(opts Options) (func(http.Handler) http.Handler, error) {
	if opts.Limiter == nil {
		return nil, errors.New("httplimit: Options.Limiter is required")
	}
	if opts.Key == nil {
		opts.Key = ByClientIP()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key, err := opts.Key(r)
			if err != nil {
				writeError(w, http.StatusBadRequest, "no_key", err.Error(), 0)
				return
			}
			cost := int64(1)
			if opts.Cost != nil {
				cost = opts.Cost(r)
			}
			d, err := opts.Limiter.AllowN(r.Context(), key, cost)
			switch {
			case errors.Is(err, sluice.ErrCostExceedsBurst):
				writeError(w, http.StatusRequestEntityTooLarge, "cost_exceeds_limit", fmt.Sprintf("request cost %d exceeds the limit %s", cost, opts.Limiter.Limit()), 0)
				return
			case err != nil:
				opts.Logger.ErrorContext(r.Context(), "rate limiter failed", "err", err)
				if opts.FailOpen {
					next.ServeHTTP(w, r)
					return
				}
				writeError(w, http.StatusServiceUnavailable, "limiter_unavailable", "rate limiter unavailable", 0)
				return
			}
			SetHeaders(w.Header(), opts.Policy, d)
			if !d.Allowed {
				writeError(w, http.StatusTooManyRequests, "rate_limited",
					fmt.Sprintf("rate limit %s exceeded; retry in %s", d.Limit, RetryAfterMillis(d.RetryAfter)+"ms"), sluice.CeilMillis(d.RetryAfter))
				return
			}
			next.ServeHTTP(w, r)
		})
	}, nil
}

type errorBody struct {
	Error        string `json:"error"`
	Message      string `json:"message"`
	RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
}

func writeError(w http.ResponseWriter, status int, code, msg string, retryMS int64) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(errorBody{Error: code, Message: msg, RetryAfterMS: retryMS})
}

// ByHeader keys requests on a header such as X-API-Key, hashed with
// sluice.HashKey so that raw keys never reach the store, logs or metrics.
// A request without the header fails with ErrNoKey. "Authorization: Bearer
// <key>" is read without its scheme.
func ByHeader(name string) KeyFunc {
	return func(r *http.Request) (string, error) {
		v := strings.TrimSpace(r.Header.Get(name))
		if scheme, rest, ok := strings.Cut(v, " "); ok && strings.EqualFold(scheme, "Bearer") {
			v = strings.TrimSpace(rest)
		}
		if v == "" {
			return "", fmt.Errorf("%w: header %s is missing", ErrNoKey, name)
		}
		return "key:" + sluice.HashKey(v), nil
	}
}

// ByClientIP keys requests on the client's IP address. X-Forwarded-For is
// believed only as far as it was written by the trusted proxies: see ClientIP.
func ByClientIP(trusted ...netip.Prefix) KeyFunc {
	return func(r *http.Request) (string, error) {
		ip, err := ClientIP(r, trusted)
		if err != nil {
			return "", err
		}
		return "ip:" + ip.String(), nil
	}
}

// ClientIP returns the address of the client that sent r. It starts from
// the connection's peer and, while that peer is a trusted proxy, steps one
// hop back through X-Forwarded-For (right to left), so a client cannot
// spoof its address by sending the header itself.
func ClientIP(r *http.Request, trusted []netip.Prefix) (netip.Addr, error) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: remote address %q", ErrNoKey, r.RemoteAddr)
	}
	ip = ip.Unmap()
	if !isTrusted(ip, trusted) {
		return ip, nil
	}
	var hops []string
	for _, h := range r.Header.Values("X-Forwarded-For") {
		hops = append(hops, strings.Split(h, ",")...)
	}
	for i := len(hops) - 1; i >= 0; i-- {
		hop, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			return ip, nil // a malformed hop: stop at the last good one
		}
		ip = hop.Unmap()
		if !isTrusted(ip, trusted) {
			return ip, nil
		}
	}
	return ip, nil
}

func isTrusted(ip netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
