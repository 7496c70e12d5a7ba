package gateway

// The console's hooks: what `sluice serve` shows of the gateway in its
// console (internal/server): each metered request's outcome, admitted or
// limited (Options.OnOutcome, for the charts and the top limited
// identities), and a key's limits looked up by the name the console shows
// (LookUp). A key is named by its configured name, or without one by its
// client id (keys[].client, by default the first 16 hex digits of its
// hash, as the logs name it): never by the key or its whole hash.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluice-io/sluice"
)

// How the console names a gateway key (Outcome.Identity, LookUp).
const (
	// KeyNamePrefix starts the identity of a key with a name:
	// "gw_key:NAME".
	KeyNamePrefix = "gw_key:"
	// ClientPrefix starts the identity of a key without one: "gw_client:"
	// and its client id (keys[].client, by default the first 16 hex
	// digits of its hash).
	ClientPrefix = "gw_client:"
)

// Outcome is the gateway's decision on one metered request.
type Outcome struct {
	// Identity names the key as the console shows it: KeyNamePrefix and
	// its name, or ClientPrefix and its client id.
	Identity string
	// Tier is the key's tier.
	Tier string
	// Limited is set when the gateway answered 429 by one of its limits;
	// else the request was admitted and goes upstream.
	Limited bool
	// Limit is the limit that denied it, as the reason label of
	// sluice_gateway_rejections_total: rpm, tpm, team_rpm, budget,
	// too_large, queue_full, capacity, upstream_capacity...
	Limit string
	// RetryAfter is the wait its answer named (0 for one never to retry).
	RetryAfter time.Duration
}

// consoleIdentity is how the console names k.
func consoleIdentity(k KeyConfig) string {
	if k.Name != "" {
		return KeyNamePrefix + k.Name
	}
	return ClientPrefix + k.Client
}

// limited counts c's rejection by the limit named reason and notes it for
// the console: the gateway answers 429 with a wait of retry.
func (g *Gateway) limited(c *call, reason string, retry time.Duration) {
	g.metrics.rejections.WithLabelValues(c.client.tier.name, c.model, reason).Inc()
	c.limitedBy, c.retry = reason, retry
}

// report tells the console how c was decided: admitted, or limited by one
// of the gateway's limits (c.limitedBy). A request refused for any other
// reason (a store error, a bad request) is no decision and not reported.
func (g *Gateway) report(c *call, admitted bool) {
	if g.onOutcome == nil || (!admitted && c.limitedBy == "") {
		return
	}
	g.onOutcome(Outcome{Identity: c.client.shown, Tier: c.client.tier.name, Limited: !admitted, Limit: c.limitedBy, RetryAfter: c.retry})
}

// reportClient tells the console how a request of cl that has no call
// (a batch's creation, batches.go) was decided: admitted when limit is
// "", else answered 429 by that limit with a wait of retry.
func (g *Gateway) reportClient(cl *client, limit string, retry time.Duration) {
	if g.onOutcome != nil {
		g.onOutcome(Outcome{Identity: cl.shown, Tier: cl.tier.name, Limited: limit != "", Limit: limit, RetryAfter: retry})
	}
}

// ErrNoKey means that no key of the gateway has the identity looked up.
var ErrNoKey = errors.New("gateway: no key has this name")

// LookUp peeks the limits and budgets of the key the console names
// identity (KeyNamePrefix NAME or ClientPrefix ID), changing nothing: the
// answer of the key's GET /v1/status. "IDENTITY session:SID" adds the
// budgets of the key's session SID (session.go), as that status with
// X-Sluice-Session does. With several keys of one name, the first in the
// config's order answers. It returns ErrNoKey when no key has the
// identity, and an error for a session id that is not one.
func (g *Gateway) LookUp(ctx context.Context, identity string) (Status, error) {
	identity, sid, _ := strings.Cut(identity, " session:")
	if sid != "" && !sessionRE.MatchString(sid) {
		return Status{}, fmt.Errorf("%w: session %q is not a session id (1 to 128 of A-Z a-z 0-9 . _ : ~ -)", ErrNoKey, truncateName(sid))
	}
	if !strings.HasPrefix(identity, KeyNamePrefix) && !strings.HasPrefix(identity, ClientPrefix) {
		return Status{}, ErrNoKey
	}
	var cl *client
	for _, k := range g.cfg.Keys {
		if consoleIdentity(k) == identity {
			cl = g.keys[k.Hash]
			break
		}
	}
	if cl == nil {
		return Status{}, ErrNoKey
	}
	if len(cl.tier.session) == 0 {
		sid = ""
	}
	st, err := g.peekClient(ctx, cl, sid)
	if err != nil {
		return Status{}, fmt.Errorf("gateway: look-up: %w", err)
	}
	return st, nil
}

// peekStore peeks reqs, changing nothing, within the store's timeout.
func (g *Gateway) peekStore(ctx context.Context, reqs []sluice.Request) ([]sluice.Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.Store.Timeout)
	defer cancel()
	return g.store.ApplyAll(ctx, sluice.OpPeek, reqs)
}
