package httplimit

// The rate-limit header model, written once for every door of sluice (the
// middleware, serve's /v1/check, /v1/status and /v1/authz, the AI gateway
// and the Envoy rate limit service) and described in docs/API.md:
//
//   - RateLimit-Policy and RateLimit, the structured fields of
//     draft-ietf-httpapi-ratelimit-headers: one item per enforced limit. q
//     and w give the sustained rate (q units every w seconds), never the
//     burst; the burst of a bucket is the vendor parameter sluice-burst, and
//     a unit the draft has not registered (tokens) is sluice-qu. r is what
//     is left now, t the seconds until more is made available.
//   - X-RateLimit-Limit, -Remaining and -Reset: the most constraining limit
//     alone (its rate, or its burst when that is larger, so that Remaining
//     never exceeds Limit; what is left; the seconds until it is full).
//   - OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens}: per
//     unit, the one limit that binds first, every value from that limit,
//     its limit as X-RateLimit-Limit's.
//   - Retry-After when a limit denies: the longest wait of the denying
//     limits, in whole seconds rounded up.

import (
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-io/sluice"
)

// Unit is what a limit counts, as the IETF fields name it.
type Unit uint8

// The units of a Quota.
const (
	// Requests counts requests (or whatever a cost counts, when the limit
	// has no more specific unit). It is the zero value and the draft's
	// default quota unit.
	Requests Unit = iota
	// Tokens counts LLM tokens. The draft registers no such unit, so the
	// fields carry it as the vendor parameter sluice-qu="tokens".
	Tokens
	// ConcurrentRequests counts requests in flight: the draft's
	// "concurrent-requests".
	ConcurrentRequests
)

// Quota is one enforced limit and its decision for the request being
// answered: the input of every rate-limit header sluice writes.
type Quota struct {
	// Name names the limit in the IETF fields; empty means "default".
	Name string
	// Unit is what the limit counts.
	Unit Unit
	// Algorithm enforces the limit; zero means GCRA. It decides whether
	// the limit has a burst of its own and when more becomes available.
	Algorithm sluice.Algorithm
	// Decision is the limit's decision for the request.
	Decision sluice.Decision
}

// maxSFInteger is the largest Integer a structured field can carry
// (RFC 9651, Section 3.3.1).
const maxSFInteger = 999_999_999_999_999

// hasBurst reports whether the algorithm admits a burst of its own, the
// limit's Capacity, rather than Rate per window.
func (q *Quota) hasBurst() bool {
	return q.Algorithm == 0 || q.Algorithm == sluice.GCRA || q.Algorithm == sluice.TokenBucket
}

// capacity is the most the limit can admit at once.
func (q *Quota) capacity() int64 {
	if q.hasBurst() {
		return q.Decision.Limit.Capacity()
	}
	return q.Decision.Limit.Rate
}

// headerLimit is the limit X-RateLimit-Limit and OpenAI's
// x-ratelimit-limit-* report: the rate per period, or the burst when that
// is larger (10/s burst 30: 30), so that Remaining never exceeds Limit.
func (q *Quota) headerLimit() int64 { return max(q.Decision.Limit.Rate, q.capacity()) }

// remaining is the decision's Remaining, never negative.
func (q *Quota) remaining() int64 { return max(q.Decision.Remaining, 0) }

// UntilMore returns the time until more than the decision's Remaining is
// available, at least one more unit: zero when the limit is full. ok is
// false when the algorithm does not let a decision tell, Concurrency (a
// slot frees when its holder releases it) and the sliding windows while
// they admit, and for a limit of rate 0, which never gives more.
func (q *Quota) UntilMore() (d time.Duration, ok bool) {
	dec := &q.Decision
	switch {
	case q.Algorithm == sluice.Concurrency || dec.Limit.Rate <= 0:
		return 0, false // no time brings a slot back, or nothing ever comes
	case q.hasBurst():
		// The bucket is full after ResetAfter and fills at one unit per
		// Interval, so it holds Remaining+1 units that many intervals
		// before it is full.
		c := dec.Limit.Capacity()
		if dec.Remaining >= c {
			return 0, true
		}
		gap := dec.Limit.CostInterval(c - dec.Remaining - 1)
		return max(dec.ResetAfter-time.Duration(gap), 0), true
	case dec.Remaining >= dec.Limit.Rate:
		return 0, true
	case q.Algorithm == sluice.FixedWindow:
		return max(dec.ResetAfter, 0), true // everything comes back when the window ends
	case !dec.Allowed:
		return max(dec.RetryAfter, 0), true
	}
	return 0, false
}

// QuotaWindow returns the sustained rate of l as the IETF q and w: q units
// every w whole seconds, exactly Rate per Period when a whole number of
// seconds allows it (3 per 2.5s is q=6, w=5), else w rounded up and q
// rounded down, so that q/w never overstates the rate.
func QuotaWindow(l sluice.Limit) (q, w int64) {
	if l.Rate <= 0 || l.Period <= 0 {
		return 0, 1
	}
	p := int64(l.Period)
	k := int64(time.Second) / gcd(p, int64(time.Second)) // smallest k with k·Period whole seconds
	if k > 1000 {
		k = 0 // finer than milliseconds: no exact form worth reading
	}
	qhi, qlo := bits.Mul64(uint64(l.Rate), uint64(k))
	whi, wlo := bits.Mul64(uint64(p), uint64(k)) // a whole number of seconds, in ns
	if k > 0 && qhi == 0 && qlo <= maxSFInteger && whi == 0 && wlo/uint64(time.Second) <= maxSFInteger {
		return int64(qlo), int64(wlo / uint64(time.Second))
	}
	w = sluice.CeilSeconds(l.Period)
	hi, lo := bits.Mul64(uint64(l.Rate), uint64(w)*uint64(time.Second))
	if hi >= uint64(p) {
		return maxSFInteger, w
	}
	n, _ := bits.Div64(hi, lo, uint64(p))
	return int64(min(n, maxSFInteger)), w
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// MoreConstraining reports whether a should be listed before b, the most
// constraining limit first: a denial before an admission; of two denials
// the longer wait; of two admissions the smaller share of capacity left
// (the fewer units left, for limits of one unit); then the longer wait for
// more, then the longer time to full.
func MoreConstraining(a, b *Quota) bool {
	da, db := &a.Decision, &b.Decision
	if da.Allowed != db.Allowed {
		return !da.Allowed
	}
	if !da.Allowed && da.RetryAfter != db.RetryAfter {
		return da.RetryAfter > db.RetryAfter
	}
	if da.Allowed {
		ra, rb := a.remaining(), b.remaining()
		if a.Unit == b.Unit {
			if ra != rb {
				return ra < rb
			}
		} else {
			// ra/ca < rb/cb, in floating point: the counts reach 2^40.
			fa := float64(ra) / float64(max(a.capacity(), 1))
			fb := float64(rb) / float64(max(b.capacity(), 1))
			if fa != fb {
				return fa < fb
			}
		}
	}
	ma, _ := a.UntilMore()
	mb, _ := b.UntilMore()
	if ma != mb {
		return ma > mb
	}
	return da.ResetAfter > db.ResetAfter
}

// Order returns the indexes of qs, most constraining first (see
// MoreConstraining); equals keep their order. buf, when large enough, holds
// the result.
func Order(qs []Quota, buf []int) []int {
	idx := buf[:0]
	for i := range qs {
		// Insertion sort: a request has a handful of limits, and it is
		// stable and allocation-free.
		j := len(idx)
		idx = append(idx, i)
		for j > 0 && MoreConstraining(&qs[i], &qs[idx[j-1]]) {
			idx[j] = idx[j-1]
			j--
		}
		idx[j] = i
	}
	return idx
}

// Binding returns the index of the limit of unit u that binds first, or
// -1 when qs has none: the denying one with the longest wait, else the
// one with the fewest units left (then the longest wait for more, then the
// longest time to full).
func Binding(qs []Quota, u Unit) int {
	best := -1
	for i := range qs {
		if qs[i].Unit != u {
			continue
		}
		if best < 0 || MoreConstraining(&qs[i], &qs[best]) {
			best = i
		}
	}
	return best
}

// AppendString appends s as a structured-field String: printable ASCII,
// with `"` and `\` escaped; any other byte becomes %XX, so that every name
// stays distinct and the field stays valid.
func AppendString(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '%', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

func (q *Quota) appendName(b []byte) []byte {
	if q.Name == "" {
		return append(b, `"default"`...)
	}
	return AppendString(b, q.Name)
}

func appendInt(b []byte, n int64) []byte {
	return strconv.AppendInt(b, min(max(n, 0), maxSFInteger), 10)
}

// AppendPolicyItem appends q's RateLimit-Policy item, such as
// `"api";q=10;w=1;sluice-burst=30`.
func AppendPolicyItem(b []byte, q *Quota) []byte {
	b = q.appendName(b)
	l := q.Decision.Limit
	if q.Algorithm == sluice.Concurrency {
		b = append(b, ";q="...)
		b = appendInt(b, l.Rate)
		return append(b, `;qu="concurrent-requests"`...)
	}
	quota, window := QuotaWindow(l)
	b = append(b, ";q="...)
	b = appendInt(b, quota)
	if q.Unit == Tokens {
		b = append(b, `;sluice-qu="tokens"`...)
	}
	b = append(b, ";w="...)
	b = appendInt(b, window)
	if q.hasBurst() && l.Capacity() > 0 {
		b = append(b, ";sluice-burst="...)
		b = appendInt(b, l.Capacity())
	}
	return b
}

// AppendRateLimitItem appends q's RateLimit item, such as `"api";r=3;t=1`;
// t is left out when the algorithm cannot tell it (see UntilMore).
func AppendRateLimitItem(b []byte, q *Quota) []byte {
	b = q.appendName(b)
	b = append(b, ";r="...)
	b = appendInt(b, q.remaining())
	if d, ok := q.UntilMore(); ok {
		b = append(b, ";t="...)
		b = appendInt(b, sluice.CeilSeconds(d))
	}
	return b
}

// AppendPolicy appends the RateLimit-Policy field value of qs, in the order
// given: a fixed order keeps the field the same across responses, as the
// draft asks.
func AppendPolicy(b []byte, qs []Quota) []byte {
	for i := range qs {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = AppendPolicyItem(b, &qs[i])
	}
	return b
}

// AppendRateLimit appends the RateLimit field value of qs in order, the
// indexes of qs (see Order).
func AppendRateLimit(b []byte, qs []Quota, order []int) []byte {
	for n, i := range order {
		if n > 0 {
			b = append(b, ", "...)
		}
		b = AppendRateLimitItem(b, &qs[i])
	}
	return b
}

// RetryAfter returns how long the denying limits of qs ask the client to
// wait, the longest of their RetryAfter, and whether any denies.
func RetryAfter(qs []Quota) (time.Duration, bool) {
	var wait time.Duration
	denied := false
	for i := range qs {
		if d := &qs[i].Decision; !d.Allowed {
			denied = true
			wait = max(wait, d.RetryAfter)
		}
	}
	return wait, denied
}

// Fields are the header fields SetHeaders writes, in the order of the
// values AppendFieldValues formats. The names are canonical.
var Fields = [...]string{"Ratelimit-Policy", "Ratelimit", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Retry-After"}

// AppendFieldValues appends the values of Fields for qs to b, one after
// the other, and returns where each ends. A value is empty when its field
// is not to be written: Retry-After of an admission, or all of them when
// qs is empty. Callers that need no allocation tricks use SetHeaders.
func AppendFieldValues(b []byte, qs []Quota) ([]byte, [len(Fields)]int) {
	var ends [len(Fields)]int
	if len(qs) == 0 {
		for i := range ends {
			ends[i] = len(b)
		}
		return b, ends
	}
	var buf [8]int
	order := Order(qs, buf[:])
	b = AppendPolicy(b, qs)
	ends[0] = len(b)
	b = AppendRateLimit(b, qs, order)
	ends[1] = len(b)
	top := &qs[order[0]]
	b = appendInt(b, top.headerLimit())
	ends[2] = len(b)
	b = appendInt(b, top.remaining())
	ends[3] = len(b)
	b = appendInt(b, top.Decision.ResetAfterSeconds())
	ends[4] = len(b)
	if wait, denied := RetryAfter(qs); denied {
		b = appendInt(b, max(sluice.CeilSeconds(wait), 1))
	}
	ends[5] = len(b)
	return b, ends
}

// SetHeaders writes the rate-limit fields of a response checked against
// qs onto h: RateLimit-Policy (qs in the order given), RateLimit (most
// constraining first), X-RateLimit-Limit, -Remaining and -Reset (the most
// constraining limit alone) and, when a limit denies, Retry-After. Every
// duration is rounded up, so a client that obeys never comes back early.
// docs/API.md describes the fields.
func SetHeaders(h http.Header, qs []Quota) {
	b, ends := AppendFieldValues(make([]byte, 0, 128), qs)
	setValues(h, string(b), ends[:], Fields[:])
}

// setValues assigns the values all[ends[i-1]:ends[i]] to names[i], skipping
// empty ones, sharing one slice. The names are canonical, so they are
// assigned without Header.Set's canonicalisation.
func setValues(h http.Header, all string, ends []int, names []string) {
	vals := make([]string, len(ends))
	from := 0
	for i, end := range ends {
		vals[i] = all[from:end]
		from = end
		if vals[i] != "" {
			h[names[i]] = vals[i : i+1 : i+1]
		}
	}
}

// OpenAIFields are the header fields SetOpenAIHeaders writes.
var OpenAIFields = [...]string{
	"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests",
	"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens",
}

// SetOpenAIHeaders writes OpenAI's x-ratelimit-{limit,remaining,reset}-
// {requests,tokens} onto h. Each triple describes one limit, the one of its
// unit that binds first (Binding): its rate per period, what is left, and
// the time until it is full again, as OpenAI formats it ("6m0s", "250ms").
// A unit without limits gets no triple.
func SetOpenAIHeaders(h http.Header, qs []Quota) {
	var scratch [128]byte
	b, ends := AppendOpenAIValues(scratch[:0], qs)
	setValues(h, string(b), ends[:], OpenAIFields[:])
}

// AppendOpenAIValues appends the values of OpenAIFields for qs to b, one
// after the other, and returns where each ends; the values of a unit
// without limits are empty. Callers that need no allocation tricks use
// SetOpenAIHeaders.
func AppendOpenAIValues(b []byte, qs []Quota) ([]byte, [len(OpenAIFields)]int) {
	var ends [len(OpenAIFields)]int
	for u, unit := range [2]Unit{Requests, Tokens} {
		at := 3 * u
		if i := Binding(qs, unit); i >= 0 {
			d := &qs[i].Decision
			b = appendInt(b, qs[i].headerLimit())
			ends[at] = len(b)
			b = appendInt(b, qs[i].remaining())
			ends[at+1] = len(b)
			b = AppendResetDuration(b, d.ResetAfter)
		} else {
			ends[at], ends[at+1] = len(b), len(b)
		}
		ends[at+2] = len(b)
	}
	return b, ends
}

// AppendResetDuration appends d the way OpenAI's x-ratelimit-reset-*
// headers carry it ("1s", "6m0s", "250ms"), rounded up to the millisecond;
// time.ParseDuration reads it back.
func AppendResetDuration(b []byte, d time.Duration) []byte {
	if d <= 0 {
		return append(b, "0s"...)
	}
	ms := sluice.CeilMillis(d)
	if ms > math.MaxInt64/int64(time.Millisecond) {
		ms = math.MaxInt64 / int64(time.Millisecond)
	}
	return append(b, (time.Duration(ms) * time.Millisecond).String()...)
}

// RetryAfterMillis formats d rounded up to whole milliseconds, for headers
// such as retry-after-ms.
func RetryAfterMillis(d time.Duration) string {
	return strconv.FormatInt(sluice.CeilMillis(d), 10)
}
