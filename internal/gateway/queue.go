package gateway

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/httplimit"
	"github.com/sluice-io/sluice/internal/fairqueue"
)

// errAnswered means the queue has answered the client itself (or the
// client is gone): admit returns without a word of its own.
var errAnswered = errors.New("gateway: answered by the queue")

// queueKeyPrefix starts the store keys of the models' shared capacity,
// one hash tag for all of them.
const queueKeyPrefix = "{gwq}:"

// queue is the gateway's side of package fairqueue: which class and weight
// each client has, the metrics, and the dispatcher's goroutine.
type queue struct {
	fq      *fairqueue.Queue
	class   map[*client]queueClass
	tokens  bool // fair in tokens rather than requests
	stop    context.CancelFunc
	done    chan struct{}
	waited  *prometheus.HistogramVec
	results *prometheus.CounterVec
}

type queueClass struct {
	name   string
	weight float64
}

// newQueue builds the queue of cfg, or returns nil when cfg has none, and
// starts its dispatcher; Close stops it.
func (g *Gateway) newQueue(reg prometheus.Registerer) (*queue, error) {
	qc := &g.cfg.Queue
	if !qc.enabled() {
		return nil, nil
	}
	var classes []fairqueue.Class
	lowest := ""
	lowestPrio := 0
	for _, name := range sortedKeys(qc.Classes) {
		c := qc.Classes[name]
		classes = append(classes, fairqueue.Class{Name: name, Priority: c.Priority, Share: c.Share})
		if lowest == "" || c.Priority < lowestPrio {
			lowest, lowestPrio = name, c.Priority
		}
	}
	if lowest == "" {
		lowest = "default" // fairqueue's one class when none is configured
	}
	caps := map[string][]fairqueue.Limit{}
	for model, l := range qc.Capacity {
		var limits []fairqueue.Limit
		for _, s := range appendSpecs(nil, l, "", g.cfg.LeaseTTL) {
			k := fairqueue.Requests
			switch s.kind {
			case kindTokens:
				k = fairqueue.Tokens
			case kindConcurrency:
				k = fairqueue.Concurrency
			}
			limits = append(limits, fairqueue.Limit{Name: s.name, Kind: k, Algorithm: s.alg, Limit: s.limit})
		}
		caps[model] = limits
	}
	fq, err := fairqueue.New(fairqueue.Options{
		Store: g.store, Classes: classes, Capacities: caps, KeyPrefix: queueKeyPrefix,
		MaxWait: qc.MaxWait, MaxPerKey: qc.MaxPerKey, MaxPerGroup: qc.MaxPerTier, MaxTotal: qc.MaxTotal, MaxBytes: qc.MaxBytes,
		HalfLife: qc.HalfLife, Poll: qc.Poll, StoreTimeout: g.cfg.Store.Timeout,
		Jitter: 2 * time.Millisecond, Seed: rand.Uint64(),
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: queue: %w", err)
	}
	q := &queue{fq: fq, class: map[*client]queueClass{}, tokens: qc.Fairness == "tokens", done: make(chan struct{})}
	for _, k := range g.cfg.Keys {
		cl := g.keys[k.Hash]
		tc := g.cfg.Tiers[k.Tier]
		qcl := queueClass{name: k.Class, weight: k.Weight}
		if qcl.name == "" {
			qcl.name = tc.Class
		}
		if qcl.name == "" {
			qcl.name = lowest
		}
		if qcl.weight == 0 {
			qcl.weight = tc.Weight
		}
		q.class[cl] = qcl
	}
	if err := q.register(reg); err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	q.stop = stop
	go func() {
		defer close(q.done)
		fq.Run(ctx)
	}()
	return q, nil
}

func (q *queue) register(reg prometheus.Registerer) error {
	q.waited = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "sluice_gateway_queue_wait_seconds", Help: "Time requests waited in the queue, by tier, class and outcome (admitted, timeout, canceled, denied, failed).",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	}, []string{"tier", "class", "outcome"})
	q.results = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_gateway_queue_requests_total", Help: "Requests that met the queue, by tier, class and outcome (admitted after waiting, timeout, canceled, denied, failed, full: refused by a queue bound).",
	}, []string{"tier", "class", "outcome"})
	cs := []prometheus.Collector{q.waited, q.results}
	for _, class := range q.fq.Classes() {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_gateway_queue_depth", Help: "Requests waiting in the queue now, by class.",
			ConstLabels: prometheus.Labels{"class": class},
		}, func() float64 { return float64(q.fq.Depth(class)) }))
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("gateway: queue metrics: %w", err)
		}
	}
	return nil
}

// close stops the dispatcher; waiting requests, and those that would
// wait later, are answered as canceled. It may be called again.
func (q *queue) close() {
	if q != nil {
		q.stop()
		<-q.done
	}
}

// fairUsage is what an admission added to its client's recent usage, and
// when (the queue's clock): fair in tokens, the reservation, corrected to
// the tokens used at settlement.
type fairUsage struct {
	usage float64
	at    int64
}

// capacityGrant is the model capacity charged with an admitted request.
type capacityGrant struct {
	reqs  []sluice.Request
	kinds []fairqueue.Kind
}

// settle settles the model capacity that c was charged, as settle does
// c's own limits, in a call of its own (on Redis Cluster the capacity's
// keys are in another hash slot): the concurrency lease released, the
// tokens refunded or charged to actual, the request refunded when the
// upstream never received it. Only a settlement that found c's own lease held
// (held) touches tokens and requests, so that they are settled once, and
// corrects the client's recent usage when fair in tokens. Then it wakes
// the dispatcher: capacity may have freed for a waiting request.
func (q *queue) settle(ctx context.Context, st sluice.Store, c *call, actual int64, refundRequests, held bool) error {
	if q == nil {
		return nil
	}
	defer q.fq.Kick()
	if held && c.fair.usage > 0 {
		// Fair in tokens: count what the request used, not its
		// reservation (once, by the settlement that holds the lease).
		q.fq.AddUsage(c.client.id, float64(actual)-c.fair.usage, c.fair.at)
	}
	g := c.capacity
	if g == nil {
		return nil
	}
	var refunds, charges []sluice.Request
	for i, r := range g.reqs {
		switch g.kinds[i] {
		case fairqueue.Concurrency:
			refunds = append(refunds, r)
		case fairqueue.Tokens:
			if !held {
				continue
			}
			if d := r.Cost - actual; d > 0 {
				r.Cost = d
				refunds = append(refunds, r)
			} else if d < 0 {
				r.Cost = -d
				charges = append(charges, r)
			}
		case fairqueue.Requests:
			if held && refundRequests {
				refunds = append(refunds, r)
			}
		}
	}
	// An error leaves the capacity charged as reserved: tokens refill at
	// their rate and the lease lapses after lease_ttl.
	var errs []error
	if len(refunds) > 0 {
		if _, err := st.ApplyAll(ctx, sluice.OpRefund, refunds); err != nil {
			errs = append(errs, fmt.Errorf("gateway: settle %s: capacity refund: %w", c.id, err))
		}
	}
	if len(charges) > 0 {
		if _, err := st.ApplyAll(ctx, sluice.OpCharge, charges); err != nil {
			errs = append(errs, fmt.Errorf("gateway: settle %s: capacity charge: %w", c.id, err))
		}
	}
	return errors.Join(errs...)
}

// applyAdmit charges c's limits in one store ApplyAll, with its model's
// shared capacity when it has one, waiting in the queue when a limit denies
// and waiting can help. It returns the decisions of c's own limits (c.reqs
// as admit built them); on admission the capacity's requests are appended
// to c.reqs and c.specs, to be settled with the rest. errAnswered means the
// queue answered the client itself.
func (g *Gateway) applyAdmit(ctx context.Context, w http.ResponseWriter, c *call) ([]sluice.Decision, error) {
	q := g.queue
	if q == nil {
		// Bounded by store.timeout, with a timer only if a call goes out
		// (storectx.go).
		sctx := c.storeCtx.start(ctx, time.Now().Add(g.cfg.Store.Timeout))
		defer c.storeCtx.stop()
		return g.applyLeased(sctx, c)
	}
	qc := q.class[c.client]
	it := fairqueue.Item{
		Key: c.client.id, Group: c.client.tier.name, Class: qc.name, Weight: qc.weight,
		Tokens: c.reserved, Lease: c.id, Reqs: c.reqs, Bytes: int64(len(c.body)),
	}
	if _, ok := g.cfg.Queue.Capacity[c.rawModel]; ok {
		it.Capacity = c.rawModel
	} else if base := modelBase(c.rawModel); base != c.rawModel {
		if _, ok := g.cfg.Queue.Capacity[base]; ok {
			it.Capacity = base // a snapshot shares its model's capacity
		}
	}
	if q.tokens {
		it.Usage = float64(max(c.reserved, 1))
	}
	res, err := q.fq.Admit(ctx, &it)
	if err != nil {
		return nil, fmt.Errorf("gateway: queue: %w", err)
	}
	tier := c.client.tier.name
	outcome := res.Outcome.String()
	if res.Queued {
		w.Header().Set("x-sluice-queued-ms", strconv.FormatInt(res.Waited.Milliseconds(), 10))
		q.waited.WithLabelValues(tier, qc.name, outcome).Observe(res.Waited.Seconds())
	}
	if res.Queued || res.Outcome == fairqueue.Full {
		q.results.WithLabelValues(tier, qc.name, outcome).Inc()
	}
	switch res.Outcome {
	case fairqueue.Admitted:
		if q.tokens {
			c.fair = fairUsage{usage: it.Usage, at: res.At}
		}
		if len(res.Pool) > 0 {
			c.capacity = &capacityGrant{reqs: res.Pool, kinds: res.PoolKinds}
		}
		return res.Decisions, nil
	case fairqueue.Failed:
		return nil, res.Err
	case fairqueue.Canceled:
		if ctx.Err() != nil {
			return nil, errAnswered // the client is gone
		}
		// The gateway is closing.
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "server_error", "shutting_down", "", "The gateway is shutting down; please retry.")
		return nil, errAnswered
	case fairqueue.Full:
		g.limited(c, "queue_full", time.Second)
		h := w.Header()
		h.Set("Retry-After", "1")
		h.Set("retry-after-ms", "1000")
		writeError(w, http.StatusTooManyRequests, "requests", "queue_full", "",
			fmt.Sprintf("Too many requests waiting for your key or tier %s (at most %d per key, %d per tier, %d bytes of bodies in all); please retry shortly.",
				tier, g.cfg.Queue.MaxPerKey, g.cfg.Queue.MaxPerTier, g.cfg.Queue.MaxBytes))
		return nil, errAnswered
	}
	// Denied or timed out: by the key's own limits (admit's usual 429),
	// or by the model's shared capacity.
	if len(res.Decisions) > 0 && !sluice.Combine(res.Decisions).Allowed {
		return res.Decisions, nil
	}
	g.capacityBusy(w, c, &res)
	return nil, errAnswered
}

// capacityBusy answers 429 for a request that the model's shared capacity
// denied (or can never admit: a reservation beyond its burst).
func (g *Gateway) capacityBusy(w http.ResponseWriter, c *call, res *fairqueue.Result) {
	if res.Outcome == fairqueue.Denied && len(res.PoolDecisions) == 0 {
		g.limited(c, "too_large", 0)
		w.Header().Set("x-should-retry", "false")
		writeError(w, http.StatusTooManyRequests, "tokens", "request_too_large", "max_tokens",
			fmt.Sprintf("Request too large for the shared capacity of model %s: requested %d tokens. Reduce the prompt, max_tokens or n.", c.model, c.reserved))
		return
	}
	var wait time.Duration
	for i, d := range res.PoolDecisions {
		if d.Allowed {
			continue
		}
		ra := d.RetryAfter
		if res.Pool[i].Algorithm == sluice.Concurrency {
			ra = min(ra, time.Second)
		}
		wait = max(wait, ra)
	}
	if wait <= 0 {
		// No denial to go by (the last try found every bucket known
		// exhausted, or a concurrency slot): a second, as Retry-After
		// says, rather than retry-after-ms 1 and "try again in 0s".
		wait = time.Second
	}
	g.limited(c, "capacity", wait)
	h := w.Header()
	h.Set("Retry-After", strconv.FormatInt(max(sluice.CeilSeconds(wait), 1), 10))
	h.Set("retry-after-ms", httplimit.RetryAfterMillis(max(wait, time.Millisecond)))
	msg := fmt.Sprintf("Model %s is at its shared capacity; please try again in %s.", c.model, formatReset(wait))
	if res.Outcome == fairqueue.Timeout {
		msg = fmt.Sprintf("Model %s stayed at its shared capacity for the %s a request may wait; please try again in %s.", c.model, g.cfg.Queue.MaxWait, formatReset(wait))
	}
	writeError(w, http.StatusTooManyRequests, "requests", "rate_limit_exceeded", "", msg)
}
