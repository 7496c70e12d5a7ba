package upstream

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a pool's counters per upstream and model. Their labels are
// names from the configuration only, never keys: bounded by the
// configuration's MaxUpstreams and models.
type Metrics struct {
	sent        *prometheus.CounterVec
	provider429 *prometheus.CounterVec
	cooldowns   *prometheus.CounterVec
	failovers   *prometheus.CounterVec
	tightened   *prometheus.CounterVec
	remaining   *prometheus.GaugeVec
	chunks      *prometheus.CounterVec
	ratio       *prometheus.GaugeVec
	ownRefusals *prometheus.CounterVec
	unreachable *prometheus.CounterVec
	probes      *prometheus.CounterVec
}

// NewMetrics registers a pool's metrics with reg. A metric registered
// already (a second gateway on one registry) is shared.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_gateway_upstream_requests_total",
			Help: "Requests sent to each upstream and model, by the upstream's answer (2xx, 4xx, 429, 5xx, 529, error)."}, []string{"upstream", "model", "status"}),
		provider429: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_gateway_upstream_429_total",
			Help: "429 answers of each upstream and model: the provider refused what the pool sent."}, []string{"upstream", "model"}),
		cooldowns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_gateway_upstream_cooldowns_total",
			Help: "Fleet-wide cooldowns started on each upstream and model (a provider 429, a refused connection, repeated 5xx, 529 or timeouts)."}, []string{"upstream", "model"}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_gateway_upstream_failovers_total",
			Help: "Requests moved from each upstream and model to another, by reason (error, timeout, 429, 5xx, 529)."}, []string{"upstream", "model", "reason"}),
		tightened: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_gateway_upstream_tightened_total",
			Help: "Times the provider's rate-limit headers reported less left than the store held, and the store was charged the difference."}, []string{"upstream", "model"}),
		remaining: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_gateway_upstream_remaining",
			Help: "What each upstream and model last reported left, by kind (requests, tokens)."}, []string{"upstream", "model", "kind"}),
		chunks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_gateway_upstream_chunks_total",
			Help: "Chunks of a hot upstream model's limits this replica leased, each handed out by the replica until its slot ended."}, []string{"upstream", "model"}),
		ratio: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_gateway_upstream_token_ratio",
			Help: "The learned ratio of the input tokens each upstream model counts to those the pool reserves before it (units.go)."}, []string{"upstream", "model"}),
		ownRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_gateway_upstream_request_refusals_total",
			Help: "Provider 429s attributed to the request's own size (undercounted or larger than the limit): the client refused, the upstream not cooled."}, []string{"upstream", "model"}),
		unreachable: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_gateway_upstream_unreachable_total",
			Help: "Times this replica took an upstream out of rotation after a request could not reach it, until a probe was answered."}, []string{"upstream"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_gateway_upstream_probes_total",
			Help: "Probes of unreachable upstreams (the gateway's own GET of the health path), by result (up, down)."}, []string{"upstream", "result"}),
	}
	var err error
	m.sent, err = register(reg, m.sent)
	if err == nil {
		m.provider429, err = register(reg, m.provider429)
	}
	if err == nil {
		m.cooldowns, err = register(reg, m.cooldowns)
	}
	if err == nil {
		m.failovers, err = register(reg, m.failovers)
	}
	if err == nil {
		m.tightened, err = register(reg, m.tightened)
	}
	if err == nil {
		m.remaining, err = register(reg, m.remaining)
	}
	if err == nil {
		m.chunks, err = register(reg, m.chunks)
	}
	if err == nil {
		m.ratio, err = register(reg, m.ratio)
	}
	if err == nil {
		m.ownRefusals, err = register(reg, m.ownRefusals)
	}
	if err == nil {
		m.unreachable, err = register(reg, m.unreachable)
	}
	if err == nil {
		m.probes, err = register(reg, m.probes)
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if ex, ok := are.ExistingCollector.(C); ok {
				return ex, nil
			}
		}
		return c, fmt.Errorf("upstream: metrics: %w", err)
	}
	return c, nil
}
