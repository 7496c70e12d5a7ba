package httplimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

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
	// MaxWait turns on delay mode: a request that would be admitted within
	// it is charged now (Limiter.Reserve), held for its delay and then
	// passed on with DelayHeader, instead of getting 429. A caller that
	// hangs up meanwhile gets its reservation refunded. The Limiter's
	// algorithm must be GCRA or TokenBucket. Zero: no delay mode.
	MaxWait time.Duration
	// MaxWaiting bounds the requests held at once; past it a request is
	// decided without MaxWait (admitted at once within the burst, 429
	// beyond). Zero means DefaultMaxWaiting.
	MaxWaiting int
}

// DelayHeader carries how long a request was held by delay mode, in
// milliseconds rounded up, such as "Sluice-Delay-Ms: 300". `sluice serve`
// sends it too.
const DelayHeader = "Sluice-Delay-Ms"

// DefaultMaxWaiting is the default of Options.MaxWaiting.
const DefaultMaxWaiting = 10000

// New returns middleware that limits requests to next. Admitted requests
// carry the rate-limit headers; denied ones get 429 with Retry-After, the
// headers and a JSON body:
//
//	{"error":"rate_limited","message":"...","retry_after_ms":1234}
//
// A request whose Cost is zero or negative, or whose key is empty, gets
// 400 (a cost above the burst 413), FailOpen or not.
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
	if opts.MaxWait < 0 || opts.MaxWait > sluice.MaxReserveWait || opts.MaxWaiting < 0 {
		return nil, fmt.Errorf("httplimit: MaxWait %s must be between 0 and %s, MaxWaiting %d not negative", opts.MaxWait, sluice.MaxReserveWait, opts.MaxWaiting)
	}
	if opts.MaxWait > 0 && !sluice.Reserves(opts.Limiter.Algorithm()) {
		return nil, fmt.Errorf("httplimit: MaxWait needs a gcra or token_bucket Limiter, not %s", opts.Limiter.Algorithm())
	}
	if opts.MaxWaiting == 0 {
		opts.MaxWaiting = DefaultMaxWaiting
	}
	var waiting atomic.Int64
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
			var d sluice.Decision
			var rv *sluice.Reservation
			if opts.MaxWait > 0 && waiting.Add(1) <= int64(opts.MaxWaiting) {
				defer waiting.Add(-1)
				rv, err = opts.Limiter.Reserve(r.Context(), key, cost, opts.MaxWait)
				if err == nil {
					d = rv.Decision
				}
			} else {
				if opts.MaxWait > 0 {
					waiting.Add(-1)
				}
				d, err = opts.Limiter.AllowN(r.Context(), key, cost)
			}
			switch {
			case errors.Is(err, sluice.ErrCostExceedsBurst):
				writeError(w, http.StatusRequestEntityTooLarge, "cost_exceeds_limit", fmt.Sprintf("request cost %d exceeds the limit %s", cost, opts.Limiter.Limit()), 0)
				return
			// The request's own cost (zero, negative) or key (empty) is
			// bad: the caller's error, not the limiter failing, so
			// FailOpen does not pass it on.
			case errors.Is(err, sluice.ErrInvalidCost):
				writeError(w, http.StatusBadRequest, "invalid_cost", fmt.Sprintf("request cost %d is not a positive whole number", cost), 0)
				return
			case errors.Is(err, sluice.ErrInvalidRequest):
				writeError(w, http.StatusBadRequest, "invalid_request", "the request has no rate-limit key the limiter takes", 0)
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
			qs := [1]Quota{{Name: opts.Policy, Algorithm: opts.Limiter.Algorithm(), Decision: d}}
			SetHeaders(w.Header(), qs[:])
			if !d.Allowed {
				writeError(w, http.StatusTooManyRequests, "rate_limited",
					fmt.Sprintf("rate limit %s exceeded; retry in %s", d.Limit, RetryAfterMillis(d.RetryAfter)+"ms"), sluice.CeilMillis(d.RetryAfter))
				return
			}
			if d.Delay > 0 {
				if err := rv.Wait(r.Context()); err != nil {
					// The caller went away; its reservation is refunded.
					opts.Logger.DebugContext(r.Context(), "delayed request abandoned", "err", err)
					return
				}
				w.Header()[DelayHeader] = []string{strconv.FormatInt(sluice.CeilMillis(d.Delay), 10)}
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
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // "<key>" as written, not \u003ckey\u003e
	_ = enc.Encode(errorBody{Error: code, Message: msg, RetryAfterMS: retryMS})
}

// ByHeader keys requests on a header such as X-API-Key, hashed with
// sluice.HashKey so that raw keys never reach the store, logs or metrics.
// A request without the header, or with only a scheme ("Bearer"), fails
// with ErrNoKey. "Authorization: Bearer <key>" is read without its scheme,
// whose name is case-insensitive (RFC 9110). The key is hashed byte for
// byte: keys that differ in any byte, valid UTF-8 or not, never share a
// limit. Every distinct value gets a limit of its own, so a client that can
// send any value can invent as many limits as it likes: key on a header
// only after the request is authenticated, or limit by ByClientIP too.
func ByHeader(name string) KeyFunc {
	return func(r *http.Request) (string, error) {
		v := strings.Trim(r.Header.Get(name), " \t")
		if len(v) >= len("Bearer") && strings.EqualFold(v[:len("Bearer")], "Bearer") {
			if rest := v[len("Bearer"):]; rest == "" || rest[0] == ' ' || rest[0] == '\t' {
				v = strings.Trim(rest, " \t")
			}
		}
		if v == "" {
			return "", fmt.Errorf("%w: header %s is missing", ErrNoKey, name)
		}
		return "key:" + sluice.HashKey(v), nil
	}
}

// ByClientIP keys requests on the client's IP address (see IPKey).
// X-Forwarded-For is believed only as far as it was written by the trusted
// proxies: see ClientIP.
func ByClientIP(trusted ...netip.Prefix) KeyFunc {
	return func(r *http.Request) (string, error) {
		ip, err := ClientIP(r, trusted)
		if err != nil {
			return "", err
		}
		return "ip:" + IPKey(ip), nil
	}
}

// IPKey is the part of a rate-limit key that names the client at a: an
// IPv4 address whole, an IPv6 address by its /64, the block one subscriber
// usually holds (keying each IPv6 address apart would give a client 2^64
// limits).
func IPKey(a netip.Addr) string { return IPBlockKey(a, 64) }

// IPBlockKey is IPKey with the IPv6 block's length, v6bits (clamped to
// 0..128), chosen by the caller: 48 counts a site's whole block as one
// client, where 64 lets a client that holds a /48 be 65,536 clients.
func IPBlockKey(a netip.Addr, v6bits int) string {
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.Prefix(min(max(v6bits, 0), 128))
		return p.String()
	}
	return a.String()
}

// maxForwardedHops bounds the X-Forwarded-For hops ClientIP steps through.
const maxForwardedHops = 64

// ClientIP returns the address of the client that sent r. It starts from
// the connection's peer and, while that peer is a trusted proxy, steps one
// hop back through X-Forwarded-For (right to left, across all its lines),
// so a client cannot spoof its address by sending the header itself. A hop
// may carry a port or brackets (parseHop). It stops at a malformed hop,
// and after maxForwardedHops trusted ones, at the last address it could
// read.
func ClientIP(r *http.Request, trusted []netip.Prefix) (netip.Addr, error) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: remote address %q", ErrNoKey, r.RemoteAddr)
	}
	ip = ip.Unmap().WithZone("") // a zoned address is in no prefix
	lines := r.Header.Values("X-Forwarded-For")
	for hops := 0; isTrusted(ip, trusted) && hops < maxForwardedHops; hops++ {
		var hop string
		for hop == "" {
			if len(lines) == 0 {
				return ip, nil
			}
			last := lines[len(lines)-1]
			i := strings.LastIndexByte(last, ',')
			hop = strings.TrimSpace(last[i+1:])
			if i < 0 {
				lines = lines[:len(lines)-1]
			} else {
				lines = append(lines[:len(lines)-1:len(lines)-1], last[:i])
			}
		}
		next, ok := parseHop(hop)
		if !ok {
			return ip, nil // a malformed hop: stop at the last good one
		}
		ip = next
	}
	return ip, nil
}

// parseHop reads an address of X-Forwarded-For as proxies write it: bare,
// or with a port ("203.0.113.7:4711", "[2001:db8::1]:443", as Azure
// Application Gateway appends them), or bracketed ("[2001:db8::1]").
// Read as malformed, each of those would key every client behind such a
// proxy as the proxy itself, one limit for all. A zone is dropped, and an
// IPv4-mapped IPv6 address is the IPv4 one.
func parseHop(hop string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(hop)
	if err != nil {
		ap, perr := netip.ParseAddrPort(hop)
		switch {
		case perr == nil:
			a, err = ap.Addr(), nil
		case len(hop) > 2 && hop[0] == '[' && hop[len(hop)-1] == ']':
			a, err = netip.ParseAddr(hop[1 : len(hop)-1])
		}
		if err != nil || (a.Is4() && hop[0] == '[') {
			return netip.Addr{}, false
		}
	}
	return a.Unmap().WithZone(""), true
}

func isTrusted(ip netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
