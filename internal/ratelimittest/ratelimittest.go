// Package ratelimittest reads rate-limit header fields the way a strict
// client would, for tests: RateLimit-Policy and RateLimit are parsed with
// an RFC 9651 structured-field parser (github.com/dunglas/httpsfv) and held
// to the grammar of draft-ietf-httpapi-ratelimit-headers, plus sluice's
// vendor parameters (sluice-burst, sluice-qu). It is imported by tests
// only, so the parser stays out of the library's import graph.
package ratelimittest

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/dunglas/httpsfv"
)

// Policy is one RateLimit-Policy item.
type Policy struct {
	Name string
	// Q is the quota, W the window in seconds (0 when absent).
	Q, W int64
	// QU is the draft's quota unit, "" when absent (requests).
	QU string
	// Burst is sluice-burst, 0 when absent.
	Burst int64
	// Unit is sluice-qu, "" when absent.
	Unit string
}

// Limit is one RateLimit item.
type Limit struct {
	Name string
	// R is the remaining quota, T the seconds until more (when HasT).
	R, T int64
	HasT bool
}

// ErrInvalid means a field breaks the draft's grammar.
var ErrInvalid = errors.New("ratelimittest: invalid field")

// units are the quota units the draft registers.
var units = []string{"requests", "content-bytes", "concurrent-requests"}

// Parse reads and validates the RateLimit-Policy and RateLimit fields of
// h. Either may be absent; when both are present they must name the same
// policies. Retry-After, when present, must be delay-seconds.
func Parse(h http.Header) ([]Policy, []Limit, error) {
	var policies []Policy
	var limits []Limit
	if v := h.Values("RateLimit-Policy"); len(v) > 0 {
		list, err := httpsfv.UnmarshalList(v)
		if err != nil || len(list) == 0 {
			return nil, nil, fmt.Errorf("%w: RateLimit-Policy %q: not a non-empty List: %v", ErrInvalid, v, err)
		}
		for _, m := range list {
			name, params, err := item(m)
			if err != nil {
				return nil, nil, fmt.Errorf("RateLimit-Policy %q: %w", v, err)
			}
			p := Policy{Name: name}
			for _, k := range params.Names() {
				val, _ := params.Get(k)
				var ok bool
				switch k {
				case "q":
					p.Q, ok = nonNegative(val)
				case "w":
					p.W, ok = nonNegative(val)
					ok = ok && p.W > 0
				case "qu":
					p.QU, ok = val.(string)
					ok = ok && slices.Contains(units, p.QU)
				case "pk":
					_, ok = val.([]byte)
				case "sluice-burst":
					p.Burst, ok = nonNegative(val)
					ok = ok && p.Burst > 0
				case "sluice-qu":
					p.Unit, ok = val.(string)
				default:
					return nil, nil, fmt.Errorf("%w: RateLimit-Policy %q: parameter %q is neither the draft's nor sluice's", ErrInvalid, v, k)
				}
				if !ok {
					return nil, nil, fmt.Errorf("%w: RateLimit-Policy %q: parameter %s=%v", ErrInvalid, v, k, val)
				}
			}
			if _, ok := params.Get("q"); !ok {
				return nil, nil, fmt.Errorf("%w: RateLimit-Policy %q: item %q has no q", ErrInvalid, v, name)
			}
			if slices.ContainsFunc(policies, func(o Policy) bool { return o.Name == name }) {
				return nil, nil, fmt.Errorf("%w: RateLimit-Policy %q: %q twice", ErrInvalid, v, name)
			}
			policies = append(policies, p)
		}
	}
	if v := h.Values("RateLimit"); len(v) > 0 {
		list, err := httpsfv.UnmarshalList(v)
		if err != nil || len(list) == 0 {
			return nil, nil, fmt.Errorf("%w: RateLimit %q: not a non-empty List: %v", ErrInvalid, v, err)
		}
		for _, m := range list {
			name, params, err := item(m)
			if err != nil {
				return nil, nil, fmt.Errorf("RateLimit %q: %w", v, err)
			}
			l := Limit{Name: name}
			for _, k := range params.Names() {
				val, _ := params.Get(k)
				var ok bool
				switch k {
				case "r":
					l.R, ok = nonNegative(val)
				case "t":
					l.T, ok = nonNegative(val)
					l.HasT = true
				case "pk":
					_, ok = val.([]byte)
				default:
					return nil, nil, fmt.Errorf("%w: RateLimit %q: parameter %q is not the draft's", ErrInvalid, v, k)
				}
				if !ok {
					return nil, nil, fmt.Errorf("%w: RateLimit %q: parameter %s=%v", ErrInvalid, v, k, val)
				}
			}
			if _, ok := params.Get("r"); !ok {
				return nil, nil, fmt.Errorf("%w: RateLimit %q: item %q has no r", ErrInvalid, v, name)
			}
			if slices.ContainsFunc(limits, func(o Limit) bool { return o.Name == name }) {
				return nil, nil, fmt.Errorf("%w: RateLimit %q: %q twice", ErrInvalid, v, name)
			}
			limits = append(limits, l)
		}
	}
	if policies != nil && limits != nil {
		if len(policies) != len(limits) {
			return nil, nil, fmt.Errorf("%w: %d policies, %d limits", ErrInvalid, len(policies), len(limits))
		}
		for _, l := range limits {
			if !slices.ContainsFunc(policies, func(p Policy) bool { return p.Name == l.Name }) {
				return nil, nil, fmt.Errorf("%w: RateLimit names %q, RateLimit-Policy does not", ErrInvalid, l.Name)
			}
		}
	}
	if v := h.Values("Retry-After"); len(v) > 0 {
		n, err := strconv.ParseUint(v[0], 10, 63)
		if len(v) != 1 || err != nil || strconv.FormatUint(n, 10) != v[0] {
			return nil, nil, fmt.Errorf("%w: Retry-After %q is not delay-seconds", ErrInvalid, v)
		}
	}
	return policies, limits, nil
}

// item reads a list member that must be an Item whose value is a String
// (or a Token, which later revisions of the draft allow).
func item(m httpsfv.Member) (string, *httpsfv.Params, error) {
	it, ok := m.(httpsfv.Item)
	if !ok {
		return "", nil, fmt.Errorf("%w: an inner list", ErrInvalid)
	}
	switch v := it.Value.(type) {
	case string:
		return v, it.Params, nil
	case httpsfv.Token:
		return string(v), it.Params, nil
	}
	return "", nil, fmt.Errorf("%w: item value %v is not a String", ErrInvalid, it.Value)
}

func nonNegative(v any) (int64, bool) {
	n, ok := v.(int64)
	return n, ok && n >= 0
}

// TB is the part of testing.TB that Check uses.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Check is Parse for tests: it fails t on an invalid field.
func Check(t TB, h http.Header) ([]Policy, []Limit) {
	t.Helper()
	p, l, err := Parse(h)
	if err != nil {
		t.Fatalf("%v\nheaders: %v", err, h)
	}
	return p, l
}
