package guard

import (
	"fmt"
	"strings"
)

// Policy decides what a call answers when the store cannot: it failed, it
// missed the deadline, its node's circuit is open, or the key already has
// MaxInFlightPerKey calls in flight. Every such answer has
// Decision.Degraded set, Decision.Fallback naming the policy, and is
// counted in Stats.Degraded. Refund, charge and reset are never answered by
// a policy: they return an error wrapping ErrUnavailable.
type Policy uint8

// The failure policies. The bound each keeps is in docs/redis.md.
const (
	// Local enforces, in memory, the limit ÷ the number of live instances
	// (learned from the store, or Options.Instances), starting from the last
	// state the store reported for the key, and charges the store with what
	// it admitted once the store answers again. A call that fails alone
	// while its node's circuit is closed (late, or its key busy) is denied
	// instead, since the store is handing out the same capacity meanwhile.
	// It is the default: the only policy that keeps a limit while the store
	// is away.
	Local Policy = iota + 1
	// FailOpen admits every request: availability over enforcement. While
	// the store is away the fleet admits without bound.
	FailOpen
	// FailClosed denies every request, with RetryAfter the probe interval.
	FailClosed
	// ReturnError returns an error wrapping ErrUnavailable, for callers
	// that decide themselves (the service answers 503 or UNAVAILABLE).
	ReturnError
)

const numPolicies = int(ReturnError) + 1

var policyNames = [numPolicies]string{Local: "local", FailOpen: "fail_open", FailClosed: "fail_closed", ReturnError: "error"}

// Valid reports whether p is one of the policies.
func (p Policy) Valid() bool { return p >= Local && p <= ReturnError }

// String returns the policy's configuration name, such as "fail_open".
func (p Policy) String() string {
	if p.Valid() {
		return policyNames[p]
	}
	return fmt.Sprintf("policy(%d)", p)
}

// ParsePolicy reads a policy name as String writes it ("local",
// "fail_open", "fail_closed", "error"); dashes work too.
func ParsePolicy(s string) (Policy, error) {
	name := strings.ReplaceAll(strings.ToLower(strings.TrimSpace(s)), "-", "_")
	for p := Local; p <= ReturnError; p++ {
		if policyNames[p] == name {
			return p, nil
		}
	}
	return 0, fmt.Errorf("guard: unknown failure policy %q; valid: local, fail_open, fail_closed, error", s)
}
