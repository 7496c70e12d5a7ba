package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice/httplimit"
	"github.com/sluice-io/sluice/internal/fairqueue"
	"github.com/sluice-io/sluice/internal/upstream"
	"github.com/sluice-io/sluice/internal/yamlconf"
)

// Pools: with `upstreams:` and `routes:` in the config, a request goes to
// one of its model's upstreams, chosen among those whose provider limits
// have room for its reservation (package upstream), after the client's own
// limits admitted it:
//
//	route (before admit: an unrouted model is refused, nothing charged)
//	admit (the client's limits, as with one upstream)
//	acquire (the provider's limits; none with room: the queue's wait, or 429)
//	relay (poolTransport: failover before the first response byte)
//	settle (the client's limits once; each upstream's for what it was sent)

// checkPool records the problems of the pool's configuration, and of
// models the gateway names (tiers' models, models:, queue capacity) that
// no route serves.
func (c *Config) checkPool(doc *yamlconf.Doc) {
	if len(c.Upstreams) == 0 && len(c.Routes) == 0 {
		return
	}
	upstream.Check(doc, c.Upstreams, c.Routes, &c.Routing)
	if len(c.Routes) == 0 {
		return
	}
	if _, all := c.Routes["*"]; all {
		return
	}
	for _, m := range c.allModels() {
		if _, ok := c.Routes[m]; !ok {
			if _, ok := c.Routes[modelBase(m)]; !ok {
				doc.Addf("routes", "model %s (named under tiers, models or queue.capacity) has no route: add routes: {%s: [{upstream: NAME, model: ID}]}, or a * route", m, m)
			}
		}
	}
}

// CheckKeys reads every upstream key of cfg (the single upstream's
// variable is checked by `sluice gateway` itself) and returns an error
// naming each upstream whose key is missing.
func CheckKeys(cfg *Config, getenv func(string) string, readFile func(string) ([]byte, error)) error {
	var errs []error
	for _, d := range cfg.Upstreams {
		if _, err := upstream.ReadKey(d, getenv, readFile); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// newPool builds the pool of opts' config, nil without upstreams.
func newPool(opts Options) (*upstream.Pool, error) {
	cfg := opts.Config
	if len(cfg.Upstreams) == 0 {
		return nil, nil
	}
	reg := opts.Registerer
	m, err := upstream.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	p, err := upstream.New(upstream.Options{Upstreams: cfg.Upstreams, Routes: cfg.Routes, Routing: cfg.Routing, Store: opts.Store,
		Getenv: opts.Getenv, ReadFile: opts.ReadFile, Period: opts.PoolPeriod, Metrics: m,
		Prober: opts.Transport, ProbeMin: opts.ProbeMin, ProbeMax: opts.ProbeMax})
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	return p, nil
}

// routeCall finds c's route; it answers 404 model_not_found itself and
// returns false when there is none, and 400 model_not_on_this_path when
// the route has no upstream of the path's API. Nothing is charged.
func (g *Gateway) routeCall(w http.ResponseWriter, c *call) bool {
	c.route = g.pool.Route(c.rawModel, modelBase(c.rawModel))
	if c.route != nil && c.route.Serves(c.ep.anthropic()) {
		return true
	}
	if c.route != nil {
		// A Claude model on OpenAI's paths, or an OpenAI model on
		// /v1/messages: a routing error, not one of size or capacity.
		api, other, otherPath := "OpenAI's API", "Anthropic's Messages API", "/v1/messages"
		if c.ep.anthropic() {
			api, other, otherPath = "Anthropic's Messages API", "OpenAI's API", "/v1/chat/completions"
		}
		g.metrics.rejections.WithLabelValues(c.client.tier.name, c.model, "no_route").Inc()
		writeError(w, http.StatusBadRequest, "invalid_request_error", "model_not_on_this_path", "model",
			"The model "+strconv.Quote(c.rawModel)+" is served by route "+strconv.Quote(c.route.Name)+", which has no upstream speaking "+api+
				" (the path "+c.path+"); its upstreams speak "+other+": send the request to "+otherPath+".")
		return false
	}
	g.metrics.rejections.WithLabelValues(c.client.tier.name, c.model, "no_route").Inc()
	writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", "model",
		"The model "+strconv.Quote(c.rawModel)+" is not served by this gateway.")
	return false
}

// acquire reserves c's request on one of its route's upstreams. With none
// that has room it waits, with a queue and queue.max_wait, in the fair
// queue in c's class (waitRoom); then, or without a queue, it answers 429
// with the wait as Retry-After, and c settles as never sent (its client
// limits refunded).
func (g *Gateway) acquire(w http.ResponseWriter, r *http.Request, c *call) bool {
	in, out := c.promptEst, max(c.reserved-c.promptEst, 0)
	u := upstream.Units{In: in, RateIn: c.rateIn, Out: out}
	ctx, cancel := context.WithTimeout(r.Context(), g.cfg.Store.Timeout)
	grant, wait, err := g.pool.AcquireUnits(ctx, c.route, c.ep.anthropic(), u, nil, affinity(r, c))
	cancel()
	if err == nil && grant == nil && wait > 0 && g.queue != nil && g.cfg.Queue.MaxWait > 0 {
		var answered bool
		grant, wait, answered, err = g.waitRoom(w, r, c, u)
		if answered {
			return false
		}
	}
	switch {
	case errors.Is(err, upstream.ErrUnreachable):
		c.unsent = true
		g.metrics.rejections.WithLabelValues(c.client.tier.name, c.model, "upstream_unreachable").Inc()
		writeError(w, http.StatusBadGateway, "server_error", "upstream_unreachable", "",
			"Every upstream serving model "+c.rawModel+" is unreachable; the gateway is probing them. Please retry later.")
		return false
	case err != nil:
		c.unsent = true
		g.metrics.rejections.WithLabelValues(c.client.tier.name, c.model, "store_error").Inc()
		g.log.Error("gateway: store unavailable", "request_id", c.id, "client", c.client.id, "err", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "server_error", "rate_limiter_unavailable", "",
			"The gateway's rate limiter is unavailable; please retry shortly.")
		return false
	case grant != nil:
		c.grant = grant
		return true
	}
	c.unsent = true
	if wait <= 0 {
		g.metrics.rejections.WithLabelValues(c.client.tier.name, c.model, "upstream_capacity").Inc()
		writeError(w, http.StatusBadRequest, "invalid_request_error", "request_too_large", "",
			"The request's "+strconv.FormatInt(max(in, c.rateIn)+out, 10)+" tokens exceed every upstream's limit for model "+c.rawModel+".")
		return false
	}
	g.limited(c, "upstream_capacity", wait)
	h := w.Header()
	h.Set("Retry-After", strconv.FormatInt(int64(max((wait+time.Second-1)/time.Second, 1)), 10))
	h.Set("retry-after-ms", httplimit.RetryAfterMillis(max(wait, time.Millisecond)))
	writeError(w, http.StatusTooManyRequests, "requests", "rate_limit_exceeded", "",
		"Every upstream serving model "+c.rawModel+" is at its provider limit. Please try again in "+formatReset(wait)+".")
	return false
}

// waitRoom waits for room on c's route in the fair queue, in c's class
// and by its fair share: the waits of one route share a gate, so that
// when an upstream has room again the highest class waiting takes it,
// and a request arriving then queues behind those waiting. It returns the
// grant, or the last wait for room (for Retry-After), or a store error;
// answered when the client is gone or the gateway closing (answered).
func (g *Gateway) waitRoom(w http.ResponseWriter, r *http.Request, c *call, u upstream.Units) (grant *upstream.Grant, wait time.Duration, answered bool, err error) {
	q := g.queue
	qc := q.class[c.client]
	gate, _ := g.roomGates.LoadOrStore(c.route, &fairqueue.Gate{})
	aff := affinity(r, c)
	it := fairqueue.Item{
		Key: c.client.id, Group: c.client.tier.name, Class: qc.name, Weight: qc.weight, Bytes: int64(len(c.body)),
		Usage: 1e-9, // the request counted in its fair share when admitted
		Gate:  gate.(*fairqueue.Gate),
		// Called by the dispatcher, one try at a time: grant and wait are
		// read after the queue is done with the item.
		Try: func(ctx context.Context) (bool, time.Duration, error) {
			actx, cancel := context.WithTimeout(ctx, g.cfg.Store.Timeout)
			defer cancel()
			gr, wt, err := g.pool.AcquireUnits(actx, c.route, c.ep.anthropic(), u, nil, aff)
			grant, wait = gr, wt
			return gr != nil, wt, err
		},
	}
	res, qerr := q.fq.Admit(r.Context(), &it)
	if qerr != nil {
		return nil, 0, false, fmt.Errorf("gateway: queue: %w", qerr)
	}
	if res.Queued {
		w.Header().Set("x-sluice-queued-ms", strconv.FormatInt(res.Waited.Milliseconds(), 10))
	}
	if res.Outcome != fairqueue.Admitted && grant != nil {
		// Admitted as the client left: give the upstream its room back.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), g.cfg.Store.Timeout)
		_, _ = grant.Settle(sctx, 0, 0, true)
		cancel()
		grant = nil
	}
	switch res.Outcome {
	case fairqueue.Admitted:
		return grant, 0, false, nil
	case fairqueue.Failed:
		return nil, 0, false, res.Err
	case fairqueue.Canceled:
		c.unsent = true
		if r.Context().Err() != nil {
			c.canceled = true
			return nil, 0, true, nil
		}
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "server_error", "shutting_down", "", "The gateway is shutting down; please retry.")
		return nil, 0, true, nil
	case fairqueue.Full:
		return nil, time.Second, false, nil
	case fairqueue.Timeout:
		return nil, max(wait, time.Millisecond), false, nil
	}
	// Denied: no room within queue.max_wait, or (wait 0) never.
	return nil, wait, false, nil
}

// AffinityHeader is the request header whose value (a conversation's id)
// sends a client's requests to the same upstream of their route while it
// has room: the provider's prompt cache then holds their common prefix.
const AffinityHeader = "X-Sluice-Affinity"

// affinity returns c's affinity key, bounded: the X-Sluice-Affinity
// header of r, else the body's prompt_cache_key (OpenAI's own hint for
// the same locality).
func affinity(r *http.Request, c *call) string {
	a := r.Header.Get(AffinityHeader)
	if a == "" {
		a = c.cacheKey
	}
	if len(a) > 256 {
		a = a[:256]
	}
	return a
}

// poolTransport sends a routed request to its grant's upstream and, on a
// connection error, timeout, 5xx, 529 or 429 before the first response
// byte, to the route's next upstream with room, within routing's attempts
// and deadline. A response whose headers came is the client's, whatever
// its body does: a stream is never replayed.
type poolTransport struct {
	g    *Gateway
	next http.RoundTripper
}

func (t poolTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c := callFrom(req.Context())
	if c == nil || c.grant == nil {
		return t.next.RoundTrip(req)
	}
	pool := t.g.pool
	rt := pool.Routing()
	deadline := c.start.Add(rt.Deadline)
	tried := make([]*upstream.TargetState, 0, rt.MaxAttempts)
	for attempt := 1; ; attempt++ {
		grant := c.grant
		tried = append(tried, grant.Target)
		var wrote atomic.Bool
		out := req.Clone(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			WroteRequest: func(info httptrace.WroteRequestInfo) {
				if info.Err == nil {
					wrote.Store(true)
				}
			},
		}))
		body := grant.Target.Rewrite(out, c.path, c.body, c.rawModel)
		out.Body = io.NopCloser(bytes.NewReader(body))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		out.ContentLength = int64(len(body))
		out.Header["Content-Length"] = []string{strconv.Itoa(len(body))}
		sent := time.Now()
		res, err := t.next.RoundTrip(out)
		status := 0
		var h http.Header
		if res != nil {
			status, h = res.StatusCode, res.Header
		}
		latency := time.Since(sent)
		refusal := upstream.RefusalGeneral
		if status == http.StatusTooManyRequests {
			refusal = t.judge(req.Context(), grant, res) // pool_refusal.go
		}
		octx, ocancel := context.WithTimeout(req.Context(), t.g.cfg.Store.Timeout)
		pool.Observe(octx, grant, status, h, latency)
		ocancel()
		if refusal == upstream.RefusalUndercount {
			// Not another upstream's turn: this client's request.
			return ownRefusal(c, res, refusal, upstream.RetryAfter(h, time.Now())), nil
		}
		reason := failoverReason(req.Context(), status, err)
		switch {
		case reason == "" || reason == "429":
			// An answer, or a 429 Observe cooled fleet-wide.
		case reason != "" && err != nil && !wrote.Load():
			// Unreachable (refused, DNS, TLS, a dial timeout): the whole
			// fleet leaves it alone for a while, and this replica sends
			// it no client request until its own probe is answered.
			pool.Cooldown(req.Context(), grant.Target, upstream.DefaultCooldown)
			pool.Unreachable(grant.Target)
		default:
			// A 5xx, 529 or timeout: this replica tries it last for a
			// while, and enough of them across the fleet cool it for all.
			fctx, fcancel := context.WithTimeout(req.Context(), t.g.cfg.Store.Timeout)
			pool.Fail(fctx, grant.Target)
			fcancel()
		}
		if reason == "" || attempt >= rt.MaxAttempts || time.Now().After(deadline) {
			if refusal == upstream.RefusalTooLarge {
				return ownRefusal(c, res, refusal, 0), nil
			}
			return res, err
		}
		in, outTok := grant.Reserved()
		next, wait := t.nextGrant(req.Context(), c, grant.Units(), tried, deadline)
		if next == nil {
			if refusal == upstream.RefusalTooLarge {
				return ownRefusal(c, res, refusal, 0), nil
			}
			if err != nil && wait > 0 {
				// No answer, and no upstream with room is left within
				// the deadline: the client's answer is our 429 with
				// when one has room (upstreamError), not a 502.
				c.noRoom = wait
			}
			return res, err
		}
		if res != nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
			_ = res.Body.Close()
		}
		// The failed upstream is charged what it was sent: the request,
		// and on a timeout the reservation (it may still be generating).
		keepIn, keepOut := int64(0), int64(0)
		if reason == "timeout" {
			keepIn, keepOut = in, outTok
		}
		sctx, scancel := context.WithTimeout(context.WithoutCancel(req.Context()), t.g.cfg.Store.Timeout)
		_, _ = grant.Settle(sctx, keepIn, keepOut, !wrote.Load() && err != nil)
		scancel()
		pool.Failover(grant.Target, reason)
		c.grant = next
	}
}

// nextGrant reserves the request on another upstream of c's route, not
// in tried, waiting for one to have room until deadline; nil when none
// does by then, with when one has room (0: none will, or an error).
func (t poolTransport) nextGrant(ctx context.Context, c *call, u upstream.Units, tried []*upstream.TargetState, deadline time.Time) (*upstream.Grant, time.Duration) {
	for {
		actx, cancel := context.WithTimeout(ctx, t.g.cfg.Store.Timeout)
		next, wait, err := t.g.pool.AcquireUnits(actx, c.route, c.ep.anthropic(), u, tried, "")
		cancel()
		switch {
		case err != nil:
			return nil, 0
		case next != nil || wait <= 0:
			return next, 0
		case time.Now().Add(wait).After(deadline):
			return nil, wait
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, 0
		}
	}
}

// failoverReason says why a request should move to another upstream, or
// "" when its answer is the client's.
func failoverReason(ctx context.Context, status int, err error) string {
	if err != nil {
		if ctx.Err() != nil {
			return "" // the client left
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return "timeout"
		}
		return "error"
	}
	switch {
	case status == http.StatusTooManyRequests:
		return "429"
	case status == 529:
		return "529"
	case status >= 500:
		return "5xx"
	}
	return ""
}
