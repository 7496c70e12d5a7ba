package gateway

// Anthropic's own token count
//
// The gateway counts OpenAI models exactly (package aitoken) and others
// with a heuristic, which counts at least half of a text's tokens on the
// corpus of aitoken's TestHeuristicBound and usually errs high. With
// upstream.count_tokens, a /v1/messages request for a model the gateway
// cannot count, under a token limit or a budget, is counted by the
// upstream's POST /v1/messages/count_tokens, and the reservation takes
// the larger of that count and the estimate (both weighted for prompt
// caching alike). The count is cached by the hash of what it counts
// (model, system, messages, tools, tool_choice, thinking), at most
// countCacheSize entries, so a request seen before costs nothing; a miss
// costs one round trip, bounded by countTokensTimeout, after which (or on
// any upstream error) the estimate alone is reserved.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/aitoken"
	"github.com/sluice-io/sluice/internal/upstream"
)

const (
	// countTokensTimeout bounds one count_tokens call.
	countTokensTimeout = time.Second
	// countCacheSize bounds the counts kept (about 100 bytes each).
	countCacheSize = 10000
	// maxCountAnswer bounds the count_tokens answer read.
	maxCountAnswer = 4 << 10
)

// errCountBusy means the client, or the gateway, has as many count_tokens
// calls in flight as it may.
var errCountBusy = errors.New("gateway: count_tokens: calls in flight at their bound")

// The bounds of count_tokens calls in flight.
const (
	countPerClient = 4
	countTotal     = 64
)

// countGate bounds the count_tokens calls in flight, per client and in
// all. Its map holds only clients with a call in flight: at most
// countTotal. The zero countGate is ready.
type countGate struct {
	mu     sync.Mutex
	total  int
	client map[string]int
}

// enter takes a slot for client, or reports false when it or the gateway
// has none left.
func (cg *countGate) enter(client string) bool {
	cg.mu.Lock()
	defer cg.mu.Unlock()
	if cg.total >= countTotal || cg.client[client] >= countPerClient {
		return false
	}
	if cg.client == nil {
		cg.client = map[string]int{}
	}
	cg.total++
	cg.client[client]++
	return true
}

// leave gives client's slot back.
func (cg *countGate) leave(client string) {
	cg.mu.Lock()
	defer cg.mu.Unlock()
	cg.total--
	if cg.client[client]--; cg.client[client] <= 0 {
		delete(cg.client, client)
	}
}

// countPath is the path of Anthropic's count_tokens.
const countPath = "/v1/messages/count_tokens"

// countFields are the members of a Messages body that count_tokens takes.
var countFields = []string{"model", "system", "messages", "tools", "tool_choice", "thinking"}

// countCache holds upstream counts by the hash of the body counted,
// evicting the oldest past its size. Safe for concurrent use.
type countCache struct {
	mu   sync.Mutex
	m    map[[32]byte]int64
	ring [][32]byte // insertion order; next is the slot to overwrite
	next int
	size int
}

func newCountCache(size int) *countCache {
	return &countCache{m: make(map[[32]byte]int64, size), size: size}
}

func (c *countCache) get(k [32]byte) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.m[k]
	return n, ok
}

func (c *countCache) put(k [32]byte, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; ok {
		c.m[k] = n
		return
	}
	if len(c.ring) < c.size {
		c.ring = append(c.ring, k)
	} else {
		delete(c.m, c.ring[c.next])
		c.ring[c.next] = k
		c.next = (c.next + 1) % c.size
	}
	c.m[k] = n
}

// len is the number of counts kept.
func (c *countCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// wantsUpstreamCount reports whether c's prompt should be counted by the
// upstream: count_tokens is on, the model is not one aitoken counts
// exactly, and a token limit or a budget applies.
func (g *Gateway) wantsUpstreamCount(c *call) bool {
	if g.counts == nil || c.ep != epMessages || aitoken.ForModel(c.rawModel).Exact() {
		return false
	}
	if c.client.levels != nil {
		return true
	}
	if g.pool != nil {
		if r := g.pool.Route(c.rawModel, modelBase(c.rawModel)); r != nil {
			if t := g.pool.CountTarget(r); t != nil && t.CountsTokens() {
				return true
			}
		}
	}
	for i := range c.client.tier.specs {
		if s := &c.client.tier.specs[i]; s.kind == kindTokens && s.applies(c.rawModel) {
			return true
		}
	}
	return false
}

// upstreamCount returns the upstream's input_tokens for body, a
// /v1/messages body for model, from the cache or from count_tokens: the
// single upstream's, or a pool's Anthropic upstream of model's route.
func (g *Gateway) upstreamCount(ctx context.Context, r *http.Request, body []byte, model, client string) (int64, error) {
	var all map[string]json.RawMessage
	if err := json.Unmarshal(body, &all); err != nil {
		return 0, fmt.Errorf("gateway: count_tokens: %w", err)
	}
	sub := make(map[string]json.RawMessage, len(countFields))
	for _, f := range countFields {
		if v, ok := all[f]; ok {
			sub[f] = v
		}
	}
	cb, err := json.Marshal(sub) // keys sorted: one hash per content
	if err != nil {
		return 0, fmt.Errorf("gateway: count_tokens: %w", err)
	}
	var target *upstream.TargetState
	if g.pool != nil {
		if rt := g.pool.Route(model, modelBase(model)); rt != nil {
			target = g.pool.CountTarget(rt)
		}
		if target == nil {
			return 0, fmt.Errorf("gateway: count_tokens: no anthropic upstream serves %s", model)
		}
		// The upstream's own model id: one cache entry per upstream model.
		cb = target.Rewrite(&http.Request{URL: &url.URL{}, Header: http.Header{}}, countPath, cb, model)
	}
	key := sha256.Sum256(cb)
	if n, ok := g.counts.get(key); ok {
		return n, nil
	}
	// A count runs once the client's limits admitted the request
	// (countAdmitted); still, one client's flood of new prompts gets
	// countPerClient calls at a time, the gateway countTotal, and the
	// rest reserve the estimate.
	if !g.countGate.enter(client) {
		return 0, errCountBusy
	}
	defer g.countGate.leave(client)
	ctx, cancel := context.WithTimeout(ctx, countTokensTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://count.invalid/", bytes.NewReader(cb))
	if err != nil {
		return 0, fmt.Errorf("gateway: count_tokens: %w", err)
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("anthropic-version", anthropicVersion(r))
	if b := r.Header.Values("anthropic-beta"); len(b) > 0 {
		req.Header["Anthropic-Beta"] = b
	}
	if target != nil {
		target.Rewrite(req, countPath, nil, model) // its URL and key only
	} else {
		u := *g.upstream
		u.Path = g.upstreamPath + "/messages/count_tokens"
		req.URL, req.Host = &u, u.Host
		if g.upstreamKey != "" {
			if g.cfg.Upstream.API == APIAnthropic {
				req.Header.Set("x-api-key", g.upstreamKey)
			} else {
				req.Header["Authorization"] = g.upstreamAuth
			}
		}
	}
	res, err := g.countClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("gateway: count_tokens: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("gateway: count_tokens: upstream status %d", res.StatusCode)
	}
	var ans struct {
		InputTokens *int64 `json:"input_tokens"`
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, maxCountAnswer)).Decode(&ans); err != nil {
		return 0, fmt.Errorf("gateway: count_tokens: %w", err)
	}
	if ans.InputTokens == nil || *ans.InputTokens < 0 {
		return 0, errors.New("gateway: count_tokens: no input_tokens in the answer")
	}
	n := min(*ans.InputTokens, maxUsageTokens)
	g.counts.put(key, n)
	return n, nil
}

// countAdmitted has c's prompt counted by its upstream (count_tokens),
// once the client's own limits admitted the request on its estimate, so
// that a client its own limits refuse causes no count call upstream. When
// the count, weighted as the estimate is, is the larger, the reservation
// takes it: the client's token limits (its key's, team's and org's) are
// charged the difference, which settlement reconciles with the usage like
// the rest, and the pool reserves it. A budget keeps its reservation of
// the estimate and settles on the usage. A failed count leaves the
// estimate.
func (g *Gateway) countAdmitted(r *http.Request, c *call) {
	n, err := g.upstreamCount(r.Context(), r, c.body, c.rawModel, c.client.id)
	if err != nil {
		g.log.Warn("gateway: count_tokens failed; reserving the estimate", "request_id", c.id, "err", err)
		return
	}
	est := c.countWeigh(n)
	if est <= c.promptEst {
		return
	}
	c.promptEst = est
	c.reserved = max(reservation(est, c.maxTokens, 1), 1)
	var charges []sluice.Request
	for i, s := range c.specs {
		if s.kind != kindTokens {
			continue
		}
		if d := g.tokenCost(c, s) - c.reqs[i].Cost; d > 0 {
			req := c.reqs[i]
			req.Cost = d
			charges = append(charges, req)
			c.reqs[i].Cost += d
		}
	}
	if len(charges) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), g.cfg.Store.Timeout)
	defer cancel()
	if _, err := g.store.ApplyAll(ctx, sluice.OpCharge, charges); err != nil {
		g.log.Warn("gateway: charging the upstream's count failed", "request_id", c.id, "err", err)
	}
}

// anthropicVersion is the request's anthropic-version, or the one the
// gateway adds when a client sends none.
func anthropicVersion(r *http.Request) string {
	if v := r.Header.Get("anthropic-version"); v != "" {
		return v
	}
	return DefaultAnthropicVersion
}
