package gateway

// The identity stage: a client key authenticated by its hash, and its
// tier's limits turned into the specs the limits stage reserves (admit.go).

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-io/sluice"
)

// client is what a key resolves to.
type client struct {
	id     string
	name   string
	shown  string // how the console names it (consoleIdentity)
	tier   *tier
	prefix string // "{gw:<id>}:", one Redis Cluster slot per client
	// specKeys[i] is the store key of tier.specs[i]: prefix + suffix.
	specKeys []string
	// levels are the client's budgets and its team's and org's limits
	// (levels.go); nil when it has none.
	levels *levels
	// status is the client's last GET /v1/status answer (status.go).
	status statusMemo
	// resv holds reservations taken ahead for a leased tier (lease.go).
	resv resvPool
}

type kind uint8

const (
	kindRequests kind = iota + 1
	kindTokens
	kindConcurrency
	// kindReservation is a lease keyed by request id with no limit of its
	// own, for tiers without a concurrency limit: it makes settlement
	// idempotent across gateway instances and lapses if a gateway crashes.
	kindReservation
)

// spec is one limit of a tier.
type spec struct {
	kind   kind
	name   string // rpm, rpd, tpm, concurrency
	model  string // "" for the whole tier
	suffix string // key suffix
	alg    sluice.Algorithm
	limit  sluice.Limit
	// level is "" for a limit of the key's own, else "team" or "org",
	// and levelName the team's or org's name (levels.go).
	level, levelName string
	// window is a budget's window, such as "month" (budget.go).
	window, zone string
	// sel is the kinds of token a token limit counts (tokenkinds.go).
	sel tokenSel
	// mark starts the store key of a global limit or budget (regions.go);
	// "" for a regional one.
	mark string
}

func (s *spec) describe() string {
	names := map[string]string{"rpm": "requests per minute", "rpd": "requests per day", "tpm": "tokens per minute", "concurrency": "concurrent requests",
		"itpm": "input tokens per minute", "otpm": "output tokens per minute"}
	d := names[s.name] + " (" + s.name + ")"
	if s.model != "" {
		d += " on model " + s.model
	}
	if s.level != "" {
		d += " of " + s.level + " " + s.levelName
	}
	return d
}

type tier struct {
	name  string
	lease bool // rpm, rpd and tpm are leased (Config.Lease, TierConfig.Lease)
	specs []spec
	// policies is the RateLimit-Policy field for a request on each model
	// that has limits of its own; policies[""] for every other model.
	policies map[string]string
	// session are the budgets of each session of the tier's keys
	// (session.go); sessionRequired refuses requests that name none.
	session         []spec
	sessionRequired bool
}

func appendSpecs(specs []spec, l Limits, model string, leaseTTL time.Duration) []spec {
	add := func(k kind, name string, alg sluice.Algorithm, lim sluice.Limit) {
		if lim.Rate == 0 {
			return
		}
		suffix := name
		if model != "" {
			suffix += ":m:" + model
		}
		specs = append(specs, spec{kind: k, name: name, model: model, suffix: suffix, alg: alg, limit: lim})
	}
	add(kindRequests, "rpm", sluice.GCRA, sluice.Limit{Rate: l.RPM, Period: time.Minute, Burst: l.RPMBurst})
	rpdAlg, rpd := l.rpd() // calendar.go
	add(kindRequests, "rpd", rpdAlg, rpd)
	add(kindTokens, "tpm", sluice.GCRA, sluice.Limit{Rate: l.TPM, Period: time.Minute, Burst: l.TPMBurst})
	if n := len(specs); l.ITPM > 0 { // tokenkinds.go
		add(kindTokens, "itpm", sluice.GCRA, sluice.Limit{Rate: l.ITPM, Period: time.Minute, Burst: l.ITPMBurst})
		specs[n].sel = selInput
	}
	if n := len(specs); l.OTPM > 0 {
		add(kindTokens, "otpm", sluice.GCRA, sluice.Limit{Rate: l.OTPM, Period: time.Minute, Burst: l.OTPMBurst})
		specs[n].sel = selOutput
	}
	add(kindConcurrency, "concurrency", sluice.Concurrency, sluice.Limit{Rate: l.Concurrency, Period: leaseTTL})
	return specs
}

// authenticate maps the bearer key to its client, by hash. The scheme is
// case-insensitive (RFC 9110, 11.1). The first Authorization line decides,
// else the first x-api-key; a wrong key there is not rescued by a valid one
// elsewhere. A request that also carries a different valid key (in another
// Authorization or x-api-key line) is refused (two is true): which of two
// clients it is would depend on which header was read.
func (g *Gateway) authenticate(r *http.Request) (cl *client, two bool) {
	var kbuf [2]string // on the stack: one key, or two to refuse
	keys := kbuf[:0]
	for _, v := range r.Header.Values("Authorization") {
		if strings.TrimSpace(v) == "" {
			continue
		}
		scheme, key, ok := strings.Cut(strings.TrimSpace(v), " ")
		if key = strings.TrimSpace(key); ok && strings.EqualFold(scheme, "Bearer") && key != "" {
			keys = append(keys, key)
		} else if len(keys) == 0 {
			keys = append(keys, "") // the first line decides: no key
		}
	}
	for _, v := range r.Header.Values("X-Api-Key") {
		if key := strings.TrimSpace(v); key != "" {
			keys = append(keys, key)
		}
	}
	if len(keys) == 0 || keys[0] == "" {
		return nil, false
	}
	cl = g.keyClient(keys[0])
	if cl == nil {
		return nil, false
	}
	for _, k := range keys[1:] {
		if k != keys[0] && g.keyClient(k) != nil {
			return nil, true
		}
	}
	return cl, false
}

// keyClient is the client of the key whose sluice.HashKey is in g.keys, or
// nil. It hashes on the stack: sluice.HashKey's string and its key's
// bytes (past 32, as API keys are) were allocations per request.
func (g *Gateway) keyClient(key string) *client {
	var kb [128]byte
	sum := sha256.Sum256(append(kb[:0], key...)) // a longer key allocates, as before
	var hexed [2 * sha256.Size]byte
	hex.Encode(hexed[:], sum[:])
	return g.keys[string(hexed[:])] // no string is made for a map index
}
