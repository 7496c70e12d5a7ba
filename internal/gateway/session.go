package gateway

// Session budgets: what one agent run (a session, named by the client in
// X-Sluice-Session) may spend in dollars, tokens and requests, on top of
// its key's, team's and org's limits. A session's counters are reserved in
// the same ApplyAll as every other limit of the request and settled with
// them, so a session stops hard across gateway replicas; MCP tool calls of
// the session count against it too (mcpgate's Charges).
//
// A session budget holds over the session's time to live: each counter is
// a sliding window log whose period is the TTL (slots of TTL/200), so the
// session never spends more than its budget within any TTL-long span,
// wherever its requests fall, and a session older than its TTL is fresh.
// The keys share the client's hash tag: a session is one Cluster slot with
// its client.

import (
	"fmt"
	"net/http"
	"regexp"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/yamlconf"
)

// SessionHeader names the session a request belongs to.
const SessionHeader = "X-Sluice-Session"

// Bounds of a session's configuration.
const (
	DefaultSessionTTL = 24 * time.Hour
	minSessionTTL     = time.Second
	maxSessionTTL     = 90 * 24 * time.Hour
	sessionSlots      = 200
)

var sessionRE = regexp.MustCompile(`^[A-Za-z0-9._:~-]{1,128}$`)

// SessionConfig is a tier's `session:` section: each session (agent run)
// of a key of the tier may spend at most USD, Tokens and Requests within
// TTL. Zero leaves a dimension unlimited.
type SessionConfig struct {
	// USD is the session's dollar budget, such as 1.00; MCP tool calls
	// with a cost_usd count against it too.
	USD USD `yaml:"usd"`
	// Tokens bounds the LLM tokens (input and output) of the session.
	Tokens int64 `yaml:"tokens"`
	// Requests bounds the LLM requests and MCP tool calls of the session.
	Requests int64 `yaml:"requests"`
	// TTL is the span the budget holds over; default 24h, 1s to 90 days.
	TTL time.Duration `yaml:"ttl"`
	// Required refuses (400 session_required) a request of the tier that
	// names no session.
	Required bool `yaml:"required"`
}

func (c *Config) checkSessions(doc *yamlconf.Doc) {
	for name, t := range c.Tiers {
		s := t.Session
		if s == nil {
			continue
		}
		field := "tiers." + name + ".session"
		usd, err := s.USD.Micros()
		if err != nil || usd < 0 {
			doc.Addf(field+".usd", "%q is not a dollar amount, such as 1.50", redactSecret(string(s.USD)))
		}
		if s.Tokens < 0 || s.Requests < 0 {
			doc.Addf(field, "tokens and requests must not be negative")
		}
		if usd <= 0 && s.Tokens <= 0 && s.Requests <= 0 {
			doc.Addf(field, "sets no budget: usd, tokens or requests")
		}
		if s.TTL != 0 && (s.TTL < minSessionTTL || s.TTL > maxSessionTTL) {
			doc.Addf(field+".ttl", "%s: between %s and %s", s.TTL, minSessionTTL, maxSessionTTL)
		}
	}
}

// sessionSpecs are a tier's session budgets, or nil.
func sessionSpecs(s *SessionConfig) []spec {
	if s == nil {
		return nil
	}
	ttl := s.TTL
	if ttl == 0 {
		ttl = DefaultSessionTTL
	}
	gran := (ttl / sessionSlots).Truncate(time.Millisecond)
	if gran <= 0 {
		gran = time.Millisecond
	}
	lim := func(n int64) sluice.Limit { return sluice.Limit{Rate: n, Period: ttl, Granularity: gran} }
	var specs []spec
	if usd, _ := s.USD.Micros(); usd > 0 {
		specs = append(specs, spec{kind: kindBudget, name: "usd_per_session", suffix: "usd", alg: sluice.SlidingWindowLog, limit: lim(int64(usd)),
			level: "session", window: "session"})
	}
	if s.Tokens > 0 {
		specs = append(specs, spec{kind: kindTokens, name: "tokens", suffix: "tok", alg: sluice.SlidingWindowLog, limit: lim(s.Tokens), level: "session"})
	}
	if s.Requests > 0 {
		specs = append(specs, spec{kind: kindRequests, name: "requests", suffix: "req", alg: sluice.SlidingWindowLog, limit: lim(s.Requests), level: "session"})
	}
	return specs
}

// sessionOf reads the request's session id: X-Sluice-Session, else empty.
// (An MCP tool call without it counts against its MCP session: toolCharges.)
func sessionOf(r *http.Request) (string, error) {
	vs := r.Header.Values(SessionHeader)
	switch {
	case len(vs) == 0:
		return "", nil
	case len(vs) > 1:
		return "", fmt.Errorf("%s given %d times: send one", SessionHeader, len(vs))
	case !sessionRE.MatchString(vs[0]):
		return "", fmt.Errorf("%s must be 1 to 128 of A-Z a-z 0-9 . _ : ~ -", SessionHeader)
	}
	return vs[0], nil
}

// sessionPrefix is the store key prefix of a client's session: under the
// client's own hash tag, the id length-prefixed so that no session id can
// spell another key.
func sessionPrefix(cl *client, sid string) string {
	return cl.prefix + "s:" + lengthPrefixed(sid) + ":"
}

// admitSession adds the request's session budgets to c's batch. It answers
// the client itself and reports false when the request may not proceed.
func (g *Gateway) admitSession(w http.ResponseWriter, c *call, r *http.Request) bool {
	t := c.client.tier
	if len(t.session) == 0 {
		return true
	}
	sid, err := sessionOf(r)
	if err != nil {
		g.metrics.rejections.WithLabelValues(t.name, c.model, "bad_session").Inc()
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_session", "", err.Error())
		return false
	}
	if sid == "" {
		if t.sessionRequired {
			g.metrics.rejections.WithLabelValues(t.name, c.model, "session_required").Inc()
			writeError(w, http.StatusBadRequest, "invalid_request_error", "session_required", "",
				"This key's tier has a budget per session: name the session (agent run) in the "+SessionHeader+" header.")
			return false
		}
		return true
	}
	prefix := sessionPrefix(c.client, sid)
	for i := range t.session {
		s := &t.session[i]
		req := sluice.Request{Key: prefix + s.suffix, Algorithm: s.alg, Limit: s.limit, Cost: 1}
		var ok bool
		switch s.kind {
		case kindTokens:
			if c.ep == epCountTokens {
				continue
			}
			if req.Cost, ok = g.tokenReservation(w, r, c, s); !ok {
				return false
			}
		case kindBudget:
			if req.Cost, ok = g.budgetReservation(w, c, s); !ok {
				return false
			}
		}
		c.specs = append(c.specs, s)
		c.reqs = append(c.reqs, req)
	}
	return true
}

// sessionCharges are the requests an MCP tool call batch of the session
// named by r adds: one request per call, and cost micro-dollars, on the
// session's counters and on the key's, team's and org's dollar budgets
// that cover every model. They join the tool calls' own limits in one
// ApplyAll; a tool call's cost is charged at admission and not settled.
func (g *Gateway) toolCharges(r *http.Request, cl *client, calls int, cost int64) ([]sluice.Request, error) {
	var reqs []sluice.Request
	if lv := cl.levels; lv != nil && cost > 0 {
		for i := range lv.specs {
			if s := &lv.specs[i]; s.kind == kindBudget && s.model == "" {
				reqs = append(reqs, sluice.Request{Key: lv.keys[i], Algorithm: s.alg, Limit: s.limit, Cost: cost})
			}
		}
	}
	t := cl.tier
	if len(t.session) == 0 {
		return reqs, nil
	}
	sid, err := sessionOf(r)
	if err != nil {
		return nil, err
	}
	if v := r.Header.Get("Mcp-Session-Id"); sid == "" && sessionRE.MatchString(v) {
		sid = v // the MCP session is the agent's run
	}
	if sid == "" {
		if t.sessionRequired {
			return nil, fmt.Errorf("this key's tier has a budget per session: name the session in the %s header", SessionHeader)
		}
		return reqs, nil
	}
	prefix := sessionPrefix(cl, sid)
	for i := range t.session {
		s := &t.session[i]
		req := sluice.Request{Key: prefix + s.suffix, Algorithm: s.alg, Limit: s.limit}
		switch s.kind {
		case kindRequests:
			req.Cost = int64(calls)
		case kindBudget:
			req.Cost = cost
		}
		if req.Cost > 0 {
			reqs = append(reqs, req)
		}
	}
	return reqs, nil
}

// mcpClient is a client as the MCP ingress sees it (package mcpgate).
type mcpClient struct {
	g  *Gateway
	cl *client
}

func (m mcpClient) ID() string     { return m.cl.id }
func (m mcpClient) Prefix() string { return m.cl.prefix }
func (m mcpClient) Decided(limit string, retry time.Duration) {
	m.g.reportClient(m.cl, limit, retry)
}
func (m mcpClient) Charges(r *http.Request, calls int, cost int64) ([]sluice.Request, error) {
	return m.g.toolCharges(r, m.cl, calls, cost)
}
