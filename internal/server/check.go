package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/httplimit"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/metrics"
	"github.com/sluice-io/sluice/internal/overrides"
	"github.com/sluice-io/sluice/internal/tracing"
)

// checkItem is one check: a policy or a tier, a key or an API key, a cost.
type checkItem struct {
	Policy string `json:"policy"`
	Tier   string `json:"tier"`
	Key    string `json:"key"`
	APIKey string `json:"api_key"`
	Cost   *int64 `json:"cost"`
}

// checkBody is the body of /v1/check and /v1/reset: one check, or several
// in "checks" charged all or nothing.
type checkBody struct {
	checkItem
	Checks []checkItem `json:"checks"`
	// cost holds the cost that decodeCheckFast points checkItem.Cost at,
	// saving an allocation.
	cost int64
}

// target is one resolved policy for one identity.
type target struct {
	policy   *config.Policy
	tier     string
	identity string
	req      sluice.Request
	// base is the limit before delay mode's conversion (delay.go).
	base sluice.Limit
}

// isKeyIdentity reports whether k has the form of an API key's identity,
// "key:" and the key's hash.
func isKeyIdentity(k string) bool {
	h, ok := strings.CutPrefix(k, "key:")
	return ok && config.IsKeyHash(h)
}

// storeKey names a policy's state for an identity. The identity is the
// Redis Cluster hash tag (tagIdentity), so a tier's policies for one
// caller share a cluster slot whatever its bytes; the algorithm is part of
// the key, so changing a policy's algorithm on reload starts afresh
// instead of misreading the old state.
func storeKey(identity string, p *config.Policy) string {
	return "sluice:{" + tagIdentity(identity) + "}:" + p.Name + ":" + p.Algorithm.String()
}

// tagIdentity writes an identity as a whole, non-empty hash tag. Written
// as it is, an identity holding '}' ended the tag early, and one starting
// with '}' (or empty) made it empty: Redis then hashes the whole key, so
// the caller's policies landed in different slots (a cross-slot error on
// Cluster). An identity that is non-empty, holds no '{' or '}' and does not
// start with '%' (every common one) stays as it is, so its keys did not
// change; any other is '%' followed by it with '%', '{' and '}'
// percent-escaped. The two forms cannot meet (only the second starts with
// '%'), so distinct identities keep distinct keys
// (TestClusterHashTagHoldsAnyIdentity).
func tagIdentity(id string) string {
	if id != "" && id[0] != '%' && !strings.ContainsAny(id, "{}") {
		return id
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 1, len(id)+8)
	b[0] = '%'
	for i := 0; i < len(id); i++ {
		switch c := id[i]; c {
		case '%', '{', '}':
			b = append(b, '%', hex[c>>4], hex[c&15])
		default:
			b = append(b, c)
		}
	}
	return string(b)
}

// resolveMode says what a policy or tier named beside an api_key means.
type resolveMode int

const (
	// addToKey charges the named policy or tier on top of the key's tier,
	// so that a check can never loosen the limit bound to its API key
	// (/v1/check, /v1/status).
	addToKey resolveMode = iota
	// exactly selects the named policy or tier alone (/v1/reset, where the
	// admin picks what to forget).
	exactly
)

// resolve turns a check into targets. A check with an api_key is always
// charged the key's tier (the default tier for an unknown key under
// unknown_keys: default_tier); a policy or tier it names is added on top,
// unless mode is exactly. A check with a key has no tier of its own and
// is charged the policy or tier it names.
func resolve(cfg *config.Config, c *checkItem, mode resolveMode) ([]target, int, error) {
	cost := int64(1)
	if c.Cost != nil {
		cost = *c.Cost
	}
	if cost < 0 {
		return nil, http.StatusBadRequest, fmt.Errorf("cost %d must not be negative", cost)
	}
	identity := c.Key
	var keyTier *config.Tier
	var apiKey *config.Key
	if c.APIKey != "" {
		if c.Key != "" {
			return nil, http.StatusBadRequest, errors.New("give key or api_key, not both")
		}
		hash := sluice.HashKey(c.APIKey)
		identity = "key:" + hash
		apiKey = cfg.Keys[hash]
		if apiKey == nil {
			if cfg.Authz.RejectUnknownKeys || cfg.Authz.DefaultTier == nil {
				return nil, http.StatusUnauthorized, errors.New("unknown api key")
			}
			keyTier = cfg.Authz.DefaultTier
		} else {
			keyTier = apiKey.Tier
		}
	}
	if identity == "" {
		return nil, http.StatusBadRequest, errors.New(`missing "key" (or "api_key")`)
	}
	if strings.HasPrefix(c.Key, overrides.KeyNamePrefix) {
		// The console and the overrides name a configured API key so: a
		// caller keyed so would show in the top list as that key, and the
		// operator acting on the entry would act on the key.
		return nil, http.StatusBadRequest, fmt.Errorf("key %q: the prefix %s names API keys (send api_key); use another key", c.Key[:min(len(c.Key), 64)], overrides.KeyNamePrefix)
	}
	if c.APIKey == "" && isKeyIdentity(c.Key) {
		// An API key's own identity: a caller keyed so would spend that
		// key's limits, and another caller's spending would show as it.
		return nil, http.StatusBadRequest, fmt.Errorf("key %q: key:<sha-256> names an API key (send api_key); use another key", c.Key[:min(len(c.Key), 80)])
	}
	if len(identity) > config.MaxKeyLen {
		return nil, http.StatusBadRequest, fmt.Errorf("key longer than %d bytes", config.MaxKeyLen)
	}
	var named []*config.Policy
	namedTier := metrics.NoTier
	switch {
	case c.Policy != "" && c.Tier != "":
		return nil, http.StatusBadRequest, errors.New(`give "policy" or "tier", not both`)
	case c.Policy != "":
		p := cfg.Policies[c.Policy]
		if p == nil {
			return nil, http.StatusBadRequest, fmt.Errorf("unknown policy %q; valid: %s", c.Policy, strings.Join(cfg.PolicyNames(), ", "))
		}
		named = []*config.Policy{p}
	case c.Tier != "":
		t := cfg.Tiers[c.Tier]
		if t == nil {
			return nil, http.StatusBadRequest, fmt.Errorf("unknown tier %q; valid: %s", c.Tier, strings.Join(cfg.TierNames(), ", "))
		}
		named, namedTier = t.Policies, t.Name
	}
	var policies []*config.Policy
	tierName := namedTier
	switch {
	case keyTier != nil && (named == nil || mode == addToKey):
		policies, tierName = addPolicies(keyTier.Policies, named), keyTier.Name
	case named != nil:
		policies = named
	default:
		return nil, http.StatusBadRequest, errors.New(`missing "policy" or "tier"`)
	}
	out := make([]target, len(policies))
	for i, p := range policies {
		out[i] = newTarget(cfg, p, tierName, identity, apiKey, cost)
	}
	return out, 0, nil
}

// newTarget is policy p for identity, with its limit for that identity.
func newTarget(cfg *config.Config, p *config.Policy, tier, identity string, apiKey *config.Key, cost int64) target {
	t := target{policy: p, tier: tier, identity: identity, req: sluice.Request{
		Key:       storeKey(identity, p),
		Algorithm: p.Algorithm,
		Limit:     cfg.LimitFor(p, identity, apiKey),
		Cost:      cost,
		UseLease:  p.Lease,
	}}
	t.base = t.req.Limit
	if p.Delayed() {
		t.req.Limit, t.req.MaxWait = p.Reservation(t.req.Limit) // delay.go
	}
	return t
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// decode reads a JSON body of at most cfg.MaxBodyBytes into v, strictly:
// the common flat shape without reflection (decodeCheckFast), anything else
// with encoding/json. On failure it writes the 400 or 413 answer and
// returns false.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, cfg *config.Config, v *checkBody) bool {
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer bufPool.Put(buf)
	body := r.Body
	if body == nil {
		body = http.NoBody
	}
	if r.ContentLength < 0 || r.ContentLength > cfg.MaxBodyBytes {
		// Unknown or too large a length: read through a MaxBytesReader,
		// which stops at the bound and closes the connection after the
		// answer. A known length within the bound is enforced by net/http.
		body = http.MaxBytesReader(w, r.Body, cfg.MaxBodyBytes)
	}
	_, err := buf.ReadFrom(body)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, "request body larger than %d bytes", cfg.MaxBodyBytes)
			return false
		}
		writeError(w, http.StatusBadRequest, "reading body: %v", err)
		return false
	}
	if decodeCheckFast(buf.Bytes(), v) {
		return true
	}
	if err := checkText(buf.Bytes()); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(buf.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && (te.Field == "cost" || strings.HasSuffix(te.Field, ".cost")) {
			writeError(w, http.StatusBadRequest, "cost: %s is not a whole number from 1 to %d", te.Value, int64(math.MaxInt64))
			return false
		}
		writeError(w, http.StatusBadRequest, "malformed JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
		return false
	}
	if _, err := dec.Token(); err != io.EOF {
		writeError(w, http.StatusBadRequest, "malformed JSON: data after the object")
		return false
	}
	return true
}

// handleCheck decides one check, or a batch all or nothing.
func (s *Server) handleCheck(w http.ResponseWriter, r *http.Request) {
	cfg := s.cfg.Load()
	var body checkBody
	if !s.decode(w, r, cfg, &body) {
		return
	}
	var targets []target
	if len(body.Checks) > 0 {
		if body.checkItem != (checkItem{}) {
			writeError(w, http.StatusBadRequest, `give one check or "checks", not both`)
			return
		}
		if len(body.Checks) > cfg.MaxChecks {
			writeError(w, http.StatusBadRequest, "%d checks; at most %d", len(body.Checks), cfg.MaxChecks)
			return
		}
		for i := range body.Checks {
			ts, status, err := resolve(cfg, &body.Checks[i], addToKey)
			if err != nil {
				writeError(w, status, "checks[%d]: %v", i, err)
				return
			}
			targets = append(targets, ts...)
		}
	} else {
		ts, status, err := resolve(cfg, &body.checkItem, addToKey)
		if err != nil {
			writeError(w, status, "%v", err)
			return
		}
		targets = ts
	}
	for i := range targets {
		if targets[i].req.Cost == 0 {
			writeError(w, http.StatusBadRequest, "cost must be at least 1; use GET /v1/status to look without charging")
			return
		}
	}
	release := s.waitSlot(cfg, targets)
	defer release()
	res, err := s.decide(r, sluice.OpAllow, targets)
	if err != nil {
		s.writeDecideError(w, err)
		return
	}
	if !s.hold(w, r, res) {
		return
	}
	s.writeDecision(w, res, http.StatusTooManyRequests, true)
}

// handleStatus peeks: what a check would decide now, charging nothing.
func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	cfg := s.cfg.Load()
	q := r.URL.Query()
	c := checkItem{Policy: q.Get("policy"), Tier: q.Get("tier"), Key: q.Get("key"), APIKey: r.Header.Get("X-API-Key")}
	if q.Has("api_key") {
		writeError(w, http.StatusBadRequest, "send the API key in the X-API-Key header, not the query string")
		return
	}
	zero := int64(0)
	c.Cost = &zero
	if v := q.Get("cost"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, "cost %q must be a whole number, 0 or more", v)
			return
		}
		c.Cost = &n
	}
	targets, status, err := resolve(cfg, &c, addToKey)
	if err != nil {
		writeError(w, status, "%v", err)
		return
	}
	res, err := s.decide(r, sluice.OpPeek, targets)
	if err != nil {
		s.writeDecideError(w, err)
		return
	}
	s.withHome(r.Context(), res) // statushome.go
	s.writeDecision(w, res, http.StatusOK, false)
}

// outcome is the result of deciding a set of targets.
type outcome struct {
	targets   []target
	decisions []sluice.Decision
	combined  sluice.Decision
	// limiting is the index of the target whose decision the combined one
	// reports (the most constrained enforced one).
	limiting int
	// sources are the remaining_source of each target of a status (set
	// for exact global policies, statushome.go); nil otherwise.
	sources []string
}

// decide applies op to the targets: the enforced policies together in one
// store call, then, if they admit, the shadow policies. It records metrics.
func (s *Server) decide(r *http.Request, op sluice.Op, targets []target) (*outcome, error) {
	ctx := r.Context()
	s.applyOverrides(targets)
	out := &outcome{targets: targets}
	shadow := 0
	for i := range targets {
		if targets[i].policy.Shadow {
			shadow++
		}
	}
	if shadow == 0 || op == sluice.OpPeek {
		// A peek charges nothing, so shadow policies need no call of their own.
		ds, err := s.apply(ctx, op, reqsOf(targets, nil))
		if err != nil {
			return nil, err
		}
		if len(ds) != len(targets) {
			return nil, fmt.Errorf("server: the store answered %d decisions for %d requests", len(ds), len(targets))
		}
		out.decisions = ds // the store's slice is ours
	} else {
		out.decisions = make([]sluice.Decision, len(targets))
		var enfIdx, shIdx []int
		for i := range targets {
			if targets[i].policy.Shadow {
				shIdx = append(shIdx, i)
			} else {
				enfIdx = append(enfIdx, i)
			}
		}
		allowed := true
		if len(enfIdx) > 0 {
			ds, err := s.apply(ctx, op, reqsOf(targets, enfIdx))
			if err != nil {
				return nil, err
			}
			if len(ds) != len(enfIdx) {
				return nil, fmt.Errorf("server: the store answered %d decisions for %d requests", len(ds), len(enfIdx))
			}
			for j, i := range enfIdx {
				out.decisions[i] = ds[j]
				allowed = allowed && ds[j].Allowed
			}
		}
		if !allowed && op == sluice.OpAllow {
			// The request is denied anyway: peek the shadow policies, all
			// in one call, so that they report without being charged.
			ds, err := s.apply(ctx, sluice.OpPeek, reqsOf(targets, shIdx))
			if err != nil {
				return nil, err
			}
			if len(ds) != len(shIdx) {
				return nil, fmt.Errorf("server: the store answered %d decisions for %d requests", len(ds), len(shIdx))
			}
			for j, i := range shIdx {
				out.decisions[i] = ds[j]
			}
			shIdx = nil
		}
		for _, i := range shIdx {
			// Each shadow policy is charged on its own, as if it were
			// enforced alone.
			ds, err := s.apply(ctx, op, reqsOf(targets, []int{i}))
			if err != nil {
				return nil, err
			}
			out.decisions[i] = ds[0]
		}
	}
	s.combine(out)
	if tracing.Recording(ctx) {
		tracing.Annotate(ctx, traceDecisions(out))
	}
	if op == sluice.OpAllow {
		for i, t := range targets {
			d := out.decisions[i]
			result := metrics.Allowed
			switch {
			case d.Degraded:
				result = metrics.Degraded
			case !d.Allowed && t.policy.Shadow:
				result = metrics.ShadowDenied
			case !d.Allowed:
				result = metrics.Denied
				if s.top != nil {
					s.top.Observe(t.identity, t.policy.Name, d.RetryAfter)
				}
			}
			k := decisionLabels{t.policy.Name, t.tier, result}
			s.decisions.get(k, func() prometheus.Counter {
				return s.m.Decisions.WithLabelValues(k.policy, k.tier, k.result)
			}).Inc()
		}
	}
	return out, nil
}

// DegradedHeader names the failure policy that made an answer because the
// store could not be asked, such as "Sluice-Degraded: local".
const DegradedHeader = "Sluice-Degraded"

// fallback names the failure policy that made any of the decisions, or
// is empty when the store made them all.
func (out *outcome) fallback(cfg *config.Config) string {
	for i := range out.decisions {
		if d := &out.decisions[i]; d.Degraded {
			if d.Fallback != "" {
				return d.Fallback
			}
			return cfg.Store.FailurePolicy
		}
	}
	return ""
}

// combine folds the enforced decisions the way sluice.Combine does and
// remembers which target limits.
func (s *Server) combine(out *outcome) {
	out.limiting = -1
	var c sluice.Decision
	c.Allowed = true
	for i, d := range out.decisions {
		if out.targets[i].policy.Shadow {
			continue
		}
		if out.limiting < 0 {
			c, out.limiting = d, i
			continue
		}
		c.Allowed = c.Allowed && d.Allowed
		c.Degraded = c.Degraded || d.Degraded
		c.RetryAfter = max(c.RetryAfter, d.RetryAfter)
		c.ResetAfter = max(c.ResetAfter, d.ResetAfter)
		c.Delay = max(c.Delay, d.Delay)
		if d.Remaining < c.Remaining {
			c.Remaining, c.Limit, out.limiting = d.Remaining, d.Limit, i
		}
	}
	if out.limiting < 0 {
		// Only shadow policies: report the first, but never deny.
		out.limiting = 0
		c = out.decisions[0]
		c.Allowed, c.RetryAfter = true, 0
	}
	out.combined = c
}

// apply asks the store, through the guard and the served failure policy:
// one request by Apply, so that the Redis store's over-limit cache
// (store.local_cache) answers a known denial without a round trip; several
// by ApplyAll, all or nothing.
func (s *Server) apply(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	if len(reqs) == 1 {
		d, err := s.guard.store.Apply(ctx, op, reqs[0])
		if err != nil {
			return nil, err
		}
		return []sluice.Decision{d}, nil
	}
	return s.guard.applyAll(ctx, op, reqs)
}

func reqsOf(targets []target, idx []int) []sluice.Request {
	if idx == nil {
		reqs := make([]sluice.Request, len(targets))
		for i := range targets {
			reqs[i] = targets[i].req
		}
		return reqs
	}
	reqs := make([]sluice.Request, len(idx))
	for j, i := range idx {
		reqs[j] = targets[i].req
	}
	return reqs
}

// writeDecideError answers a failed decision: 400 for requests the store
// rejects as invalid, 503 when the store failed and no failure policy
// answered. The store's error is logged, never sent: it can name internal
// store keys and nodes.
func (s *Server) writeDecideError(w http.ResponseWriter, err error) {
	for _, bad := range []error{sluice.ErrInvalidCost, sluice.ErrCostExceedsBurst, sluice.ErrInvalidRequest, sluice.ErrInvalidLimit, sluice.ErrUnknownAlgorithm} {
		if errors.Is(err, bad) {
			writeError(w, http.StatusBadRequest, "%s", strings.TrimPrefix(err.Error(), "sluice: "))
			return
		}
	}
	s.log.Warn("decision failed: store unavailable", "err", err)
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, "store unavailable; retry later")
}

// writeDecision writes the headers and the JSON decision. denyStatus is the
// status of a denial, degraded or not: a denial by the failure policy is a
// denial too. An answer the failure policy made carries DegradedHeader.
func (s *Server) writeDecision(w http.ResponseWriter, res *outcome, denyStatus int, charge bool) {
	d := res.combined
	lim := res.targets[res.limiting].policy.Name
	status := http.StatusOK
	if !d.Allowed && charge {
		status = denyStatus
	}
	if fb := res.fallback(s.cfg.Load()); fb != "" {
		w.Header()[DegradedHeader] = []string{fb}
	}
	bp := respPool.Get().(*[]byte)
	b := appendDecision((*bp)[:0], d, lim, res.targets[res.limiting].req.Algorithm)
	b = appendDecidedBy(b, d, res.targets[res.limiting].policy)
	b = res.appendSource(b, res.limiting)
	b = append(b, `,"results":[`...)
	for i, t := range res.targets {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendDecision(b, res.decisions[i], t.policy.Name, t.req.Algorithm)
		b = appendDecidedBy(b, res.decisions[i], t.policy)
		b = res.appendSource(b, i)
		b = append(b, `,"key":`...)
		b = appendString(b, t.identity)
		b = append(b, `,"tier":`...)
		b = appendString(b, t.tier)
		b = append(b, `,"shadow":`...)
		b = strconv.AppendBool(b, t.policy.Shadow)
		b = append(b, '}')
	}
	b = append(b, "]}\n"...)
	setDecisionHeaders(w.Header(), res, len(b))
	w.WriteHeader(status)
	_, _ = w.Write(b)
	if cap(b) <= maxPooledResp {
		*bp = b
		respPool.Put(bp)
	}
}

// respPool holds the buffers of JSON answers; maxPooledResp bounds what it
// keeps.
var respPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

const maxPooledResp = 64 << 10

// setDecisionHeaders writes what httplimit.SetHeaders writes for the
// enforced policies of res (shadow policies enforce nothing, so they are
// not published), and the JSON Content-Type and Content-Length, with two
// allocations: the values are formatted into one string and share one
// slice. TestDecisionHeaders holds them to SetHeaders.
func setDecisionHeaders(h http.Header, res *outcome, contentLength int) {
	var qbuf [8]httplimit.Quota
	qs := qbuf[:0]
	for i := range res.targets {
		t := &res.targets[i]
		if !t.policy.Shadow {
			qs = append(qs, httplimit.Quota{Name: t.policy.Name, Algorithm: t.req.Algorithm, Decision: res.decisions[i]})
		}
	}
	var scratch [512]byte
	b, ends := httplimit.AppendFieldValues(scratch[:0], qs)
	b = strconv.AppendInt(b, int64(contentLength), 10)
	all := string(b)
	n := len(httplimit.Fields)
	v := make([]string, n+2)
	from := 0
	for i, end := range ends {
		v[i] = all[from:end]
		from = end
		if v[i] != "" {
			// The names are canonical already: assign, as SetHeaders does.
			h[httplimit.Fields[i]] = v[i : i+1 : i+1]
		}
	}
	v[n] = all[from:]
	v[n+1] = "application/json"
	h["Content-Length"] = v[n : n+1 : n+1]
	h["Content-Type"] = v[n+1 : n+2 : n+2]
}

// appendDecision appends an unterminated JSON object for d, a decision of
// policy enforced with alg: the limit as "rate" per "period_ms" with
// "burst" (the most it admits at once), and the decision. "limit" and
// "window_ms" repeat rate and period_ms for older clients.
func appendDecision(b []byte, d sluice.Decision, policy string, alg sluice.Algorithm) []byte {
	burst := d.Limit.Rate
	if alg == sluice.GCRA || alg == sluice.TokenBucket {
		burst = d.Limit.Capacity()
	}
	periodMS := sluice.CeilMillis(d.Limit.Period)
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, d.Allowed)
	b = append(b, `,"policy":`...)
	b = appendString(b, policy)
	b = append(b, `,"rate":`...)
	b = strconv.AppendInt(b, d.Limit.Rate, 10)
	b = append(b, `,"period_ms":`...)
	b = strconv.AppendInt(b, periodMS, 10)
	b = append(b, `,"burst":`...)
	b = strconv.AppendInt(b, burst, 10)
	b = append(b, `,"limit":`...)
	b = strconv.AppendInt(b, d.Limit.Rate, 10)
	b = append(b, `,"window_ms":`...)
	b = strconv.AppendInt(b, periodMS, 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, d.Remaining, 10)
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, sluice.CeilMillis(d.RetryAfter), 10)
	b = append(b, `,"reset_after_ms":`...)
	b = strconv.AppendInt(b, sluice.CeilMillis(d.ResetAfter), 10)
	b = append(b, `,"degraded":`...)
	b = strconv.AppendBool(b, d.Degraded)
	if d.Delay > 0 {
		b = append(b, `,"delay_ms":`...)
		b = strconv.AppendInt(b, sluice.CeilMillis(d.Delay), 10)
	}
	return b
}

// appendDecidedBy appends, for a decision of a global policy (scope:
// global), which tier made it: "home" (the key's home store, in this
// region), "share" (a share of the key's capacity held in this region,
// charged at home in advance) or "policy" (the home was unreachable and
// the region's share spent: the failure policy); for an async policy
// (mode: async), "region" (this region's store, the others' counts
// shared at an interval) or "policy" (its counts could not reach another
// region for stale_after). Regional policies' answers are unchanged.
func appendDecidedBy(b []byte, d sluice.Decision, p *config.Policy) []byte {
	if !p.Global && d.Source != sluice.FromShare {
		return b
	}
	by := decidedBy(d)
	if by == "home" && p.Async {
		by = "region"
	}
	b = append(b, `,"decided_by":"`...)
	b = append(b, by...)
	return append(b, '"')
}

// appendSource appends target i's remaining_source, when it has one: for
// an exact global policy in a status, "home" when its remaining counts the
// home's (plus, outside the home, this region's share), "share" when it
// is this region's share alone, the home not having answered in time.
func (out *outcome) appendSource(b []byte, i int) []byte {
	if i >= len(out.sources) || out.sources[i] == "" {
		return b
	}
	b = append(b, `,"remaining_source":"`...)
	b = append(b, out.sources[i]...)
	return append(b, '"')
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff") // never rendered as HTML: its <, > and & go unescaped
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeError answers with {"error": "..."}.
func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	b := appendString([]byte(`{"error":`), msg)
	b = append(b, "}\n"...)
	writeJSON(w, status, b)
}

func writeText(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg)
}

// marshalJSON encodes v as JSON and a newline, without encoding/json's
// HTML escapes: a message's "<key>" reads as written, not as
// "\u003ckey\u003e" (writeJSON sends it with nosniff).
func marshalJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("encode JSON: %w", err)
	}
	return b.Bytes(), nil
}

// appendString appends s as a JSON string, without HTML escapes (as
// marshalJSON). Invalid UTF-8 becomes U+FFFD.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b = append(b, '\\', byte(r))
		case r < 0x20 || r == 0x7f || r == 0x2028 || r == 0x2029:
			b = append(b, '\\', 'u', hex[r>>12&0xf], hex[r>>8&0xf], hex[r>>4&0xf], hex[r&0xf])
		default:
			b = utf8.AppendRune(b, r)
		}
	}
	return append(b, '"')
}
