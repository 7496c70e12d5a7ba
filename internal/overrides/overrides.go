// Package overrides holds the runtime overrides of `sluice serve`: limits
// that an operator sets for one identity, or for a pattern of identities
// such as "*@example.com", through PUT /v1/overrides, without a config
// deploy and optionally until a time.
//
// # Design
//
// An Override names an identity pattern, optionally a policy, and either a
// new limit or a scale of the limit the configuration gives. A Manager
// keeps the compiled overrides (a Set) in an atomic.Pointer, so a decision
// reads them with one load and, when there are none, does nothing else.
//
// The overrides live in a Backend. On the Redis store they live in Redis, in
// a hash beside a version counter that every change increments in the same
// script; each replica polls the counter (PollInterval, 250 ms by default)
// and reloads the hash when it moved, so a change applies on every replica
// within the interval plus one round trip. Every 40 polls it reloads the
// hash anyway, in case Redis lost its data and the counter came back to a
// version seen before. On the memory store they live in
// the instance and apply to it alone.
//
// # Precedence
//
// For one identity and policy the first of these that matches wins: an
// exact pattern for the policy, an exact pattern for every policy, then the
// wildcard patterns, most literal characters first, each for the policy
// before every policy. A runtime override beats the configuration's own
// overrides (a key's `overrides:` and the top-level `overrides:`), which beat
// the tier's policy limit. Expired overrides are ignored.
//
// # Matching
//
// A pattern's only metacharacter is '*', any run of bytes. Matching splits
// the pattern at its stars and finds each literal part leftmost-first
// (strings.Index): linear in the identity per part, with no backtracking,
// so a caller cannot make a pattern slow. Patterns are bounded in length
// and stars, and wildcard patterns in number.
package overrides

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluice-io/sluice"
)

// Bounds on what a caller can set.
const (
	// MaxOverrides bounds the overrides kept in the store.
	MaxOverrides = 10_000
	// MaxWildcards bounds the overrides whose pattern has a '*': each
	// decision may try all of them.
	MaxWildcards = 256
	// MaxPatternLen bounds a pattern with a '*', in bytes: each decision
	// may try every such pattern.
	MaxPatternLen = 256
	// MaxIdentityLen bounds a pattern without a '*', which names one
	// identity (looked up in a map, at no cost per decision): as long as
	// any identity, config.MaxKeyLen, so that every caller can be given
	// an override by name.
	MaxIdentityLen = 512
	// MaxStars bounds the '*' of one pattern.
	MaxStars = 4
	// MaxScale bounds a scale; MinScale is its least value.
	MaxScale = 1000.0
	// MinScale is the smallest scale: a thousandth of the limit.
	MinScale = 0.001
	// MaxReasonLen bounds the free-text reason.
	MaxReasonLen = 200
	// MaxDuration bounds how far in the future Until may be.
	MaxDuration = 366 * 24 * time.Hour
	// KeyNamePrefix starts a pattern matched against an API key's
	// configured name rather than against the identity, such as
	// "key_name:acme-*". An API key is never matched by its value.
	KeyNamePrefix = "key_name:"
)

// ErrInvalid means an override was rejected; the error says why.
var ErrInvalid = errors.New("overrides: invalid override")

// ErrFull means the store holds MaxOverrides (or MaxWildcards) already.
var ErrFull = errors.New("overrides: too many overrides")

// ErrNotFound means no override has that identity and policy.
var ErrNotFound = errors.New("overrides: no such override")

// ErrUnavailable means the backend could not be reached.
var ErrUnavailable = errors.New("overrides: store unavailable")

// Override is one runtime override, as the API and the store carry it.
type Override struct {
	// Identity is the pattern of identities it applies to: the key of a
	// check ("tenant:acme", "alice@example.com"), "user:ID" from forward
	// auth, "key_name:NAME" for an API key by its configured name, with
	// '*' for any run of characters ("*@example.com").
	Identity string `json:"identity"`
	// Policy restricts it to one policy; empty means every policy.
	Policy string `json:"policy,omitempty"`
	// Limit replaces the limit, such as "500/min burst 50"; it needs a
	// Policy, since policies differ in period.
	Limit string `json:"limit,omitempty"`
	// Scale multiplies the configured limit's rate and burst instead.
	Scale float64 `json:"scale,omitempty"`
	// Until, when set, is when it stops applying.
	Until time.Time `json:"until,omitzero"`
	// Reason is free text for the audit trail.
	Reason string `json:"reason,omitempty"`
	// By names the admin token that set it.
	By string `json:"by,omitempty"`
	// At is when it was set.
	At time.Time `json:"at,omitzero"`

	limit sluice.Limit // parsed Limit
}

// ID identifies an override in the store: its policy and pattern.
func (o *Override) ID() string { return ID(o.Identity, o.Policy) }

// ID is the store field of the override of identity for policy. Policy
// names cannot hold '|'.
func ID(identity, policy string) string { return policy + "|" + identity }

// Wildcard reports whether the pattern has a '*'.
func (o *Override) Wildcard() bool { return strings.Contains(o.Identity, "*") }

// Active reports whether o applies at now (Unix ns).
func (o *Override) Active(now int64) bool { return o.Until.IsZero() || now < o.Until.UnixNano() }

// Validate checks o against the bounds and parses its limit. now is the
// time (Unix ns) Until is checked against; policyExists, when not nil,
// rejects unknown policies.
func (o *Override) Validate(now int64, policyExists func(string) bool) error {
	if err := ValidatePattern(o.Identity); err != nil {
		return err
	}
	if o.Policy != "" && policyExists != nil && !policyExists(o.Policy) {
		return fmt.Errorf("%w: unknown policy %q", ErrInvalid, o.Policy)
	}
	if strings.Contains(o.Policy, "|") || len(o.Policy) > 64 {
		return fmt.Errorf("%w: bad policy name", ErrInvalid)
	}
	switch {
	case o.Limit != "" && o.Scale != 0:
		return fmt.Errorf("%w: give limit or scale, not both", ErrInvalid)
	case o.Limit != "":
		if o.Policy == "" {
			return fmt.Errorf("%w: a limit needs a policy (policies differ in period); use scale for every policy", ErrInvalid)
		}
		if len(o.Limit) > 64 {
			return fmt.Errorf("%w: limit longer than 64 bytes", ErrInvalid)
		}
		l, err := sluice.ParseLimit(o.Limit)
		if err != nil {
			return fmt.Errorf("%w: %s", ErrInvalid, strings.TrimPrefix(err.Error(), "sluice: "))
		}
		o.limit = l
	case o.Scale != 0:
		if math.IsNaN(o.Scale) || o.Scale < MinScale || o.Scale > MaxScale {
			return fmt.Errorf("%w: scale %v must be between %v and %v", ErrInvalid, o.Scale, MinScale, MaxScale)
		}
	default:
		return fmt.Errorf("%w: give a limit (\"500/min\") or a scale (5 for 5x)", ErrInvalid)
	}
	if !o.Until.IsZero() {
		switch u := o.Until.UnixNano(); {
		case u <= now:
			return fmt.Errorf("%w: until %s is in the past", ErrInvalid, o.Until.UTC().Format(time.RFC3339))
		case u-now > int64(MaxDuration):
			return fmt.Errorf("%w: until is more than %s away", ErrInvalid, MaxDuration)
		}
	}
	if len(o.Reason) > MaxReasonLen || !utf8.ValidString(o.Reason) || strings.ContainsFunc(o.Reason, isControl) {
		return fmt.Errorf("%w: reason must be printable UTF-8 of at most %d bytes", ErrInvalid, MaxReasonLen)
	}
	return nil
}

// ValidatePattern checks an identity pattern against the bounds: UTF-8 of
// at most MaxIdentityLen bytes, printable and at most MaxPatternLen with a
// '*', at most MaxStars stars, and a "key:" pattern only of hash digits
// (an API key is named by its hash or its key_name, never by itself).
func ValidatePattern(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("%w: identity is required", ErrInvalid)
	case len(p) > MaxIdentityLen:
		return fmt.Errorf("%w: identity longer than %d bytes", ErrInvalid, MaxIdentityLen)
	case len(p) > MaxPatternLen && strings.Contains(p, "*"):
		return fmt.Errorf("%w: identity with '*' longer than %d bytes", ErrInvalid, MaxPatternLen)
	case !utf8.ValidString(p):
		return fmt.Errorf("%w: identity must be UTF-8", ErrInvalid)
	case strings.ContainsFunc(p, isControl) && strings.Contains(p, "*"):
		// An exact pattern names one identity as it is, control
		// characters included (a check's key may hold them).
		return fmt.Errorf("%w: identity with '*' must be printable", ErrInvalid)
	case strings.Count(p, "*") > MaxStars:
		return fmt.Errorf("%w: identity has more than %d '*'", ErrInvalid, MaxStars)
	}
	if h, ok := strings.CutPrefix(p, "key:"); ok && strings.Trim(h, "0123456789abcdef*") != "" {
		return fmt.Errorf("%w: a key: identity holds the key's SHA-256 in hex (sluice keys hash); name API keys by key_name:NAME", ErrInvalid)
	}
	if n, ok := strings.CutPrefix(p, KeyNamePrefix); ok && n == "" {
		return fmt.Errorf("%w: key_name: needs a name", ErrInvalid)
	}
	return nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f || r == 0x2028 || r == 0x2029 }

// Apply returns the limit o makes of l, the limit the configuration gives.
func (o *Override) Apply(l sluice.Limit) sluice.Limit {
	if o.Limit != "" {
		return o.limit
	}
	l.Rate = scale(l.Rate, o.Scale)
	if l.Burst > 0 {
		l.Burst = scale(l.Burst, o.Scale)
	}
	return l
}

// scale is n·f rounded, within [1, 2^40].
func scale(n int64, f float64) int64 {
	v := math.Round(float64(n) * f)
	switch {
	case v < 1:
		return 1
	case v > 1<<40:
		return 1 << 40
	}
	return int64(v)
}

// Summary describes o in one short line for the audit log.
func (o *Override) Summary() string {
	if o == nil {
		return "none"
	}
	var b strings.Builder
	if o.Limit != "" {
		b.WriteString("limit " + o.Limit)
	} else {
		fmt.Fprintf(&b, "scale %vx", o.Scale)
	}
	if !o.Until.IsZero() {
		b.WriteString(" until " + o.Until.UTC().Format(time.RFC3339))
	}
	return b.String()
}

// LogPattern shortens a "key:" pattern's hash for logs.
func LogPattern(p string) string {
	if h, ok := strings.CutPrefix(p, "key:"); ok && len(h) > 16 {
		return "key:" + h[:16] + "…"
	}
	return p
}
