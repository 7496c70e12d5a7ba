package gateway

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/puzpuzpuz/xsync/v4"
)

// metrics are the gateway's Prometheus metrics. Their labels are the tier,
// the model (a configured model or "other") and a bounded reason or
// status: never a key.
type metrics struct {
	requests   *prometheus.CounterVec
	tokens     *prometheus.CounterVec
	rejections *prometheus.CounterVec
	upstream   *prometheus.HistogramVec
	overhead   *prometheus.HistogramVec
	spend      *prometheus.CounterVec
	// settleRetries counts refund and charge batches tried again because
	// the store was unavailable (Gateway.refundHeld, Gateway.chargeUnsent).
	settleRetries prometheus.Counter
	handler       http.Handler
	gatherer      prometheus.Gatherer // the private registry's, or nil
	// byTierModel holds each tier and model's instruments that every
	// request settles into (forTierModel): a label lookup each is a hash
	// of its values, their UTF-8 check and a locked map read, five times
	// per request.
	byTierModel *xsync.Map[tierModel, *tierModelMetrics]
}

// tierModel is a tier's name and a model label.
type tierModel struct{ tier, model string }

// tierModelMetrics are one tier and model's instruments, curried.
type tierModelMetrics struct {
	upstream, overhead prometheus.Observer
	prompt, completion prometheus.Counter
	ok                 prometheus.Counter // requests, status 200
}

// maxTierModels bounds byTierModel: past it, forTierModel builds the
// instruments per call, as WithLabelValues does. The labels are bounded
// already (a configured tier, a configured model or "other"); this bounds
// the cache whatever a caller sends.
const maxTierModels = 4096

// forTierModel returns tier and model's instruments.
func (m *metrics) forTierModel(tier, model string) *tierModelMetrics {
	k := tierModel{tier, model}
	if v, ok := m.byTierModel.Load(k); ok {
		return v
	}
	v := &tierModelMetrics{
		upstream:   m.upstream.WithLabelValues(tier, model),
		overhead:   m.overhead.WithLabelValues(tier, model),
		prompt:     m.tokens.WithLabelValues(tier, model, "prompt"),
		completion: m.tokens.WithLabelValues(tier, model, "completion"),
		ok:         m.requests.WithLabelValues(tier, model, "200"),
	}
	if m.byTierModel.Size() < maxTierModels {
		v, _ = m.byTierModel.LoadOrStore(k, v)
	}
	return v
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gateway_requests_total", Help: "Requests forwarded upstream, by tier, model and upstream status.",
		}, []string{"tier", "model", "status"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gateway_tokens_total", Help: "LLM tokens charged after settlement, by tier, model and kind (prompt or completion).",
		}, []string{"tier", "model", "kind"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gateway_rejections_total", Help: "Requests rejected, by tier, model and reason (the limit, too_large, unauthorized, host_not_allowed, store_error, upstream_*).",
		}, []string{"tier", "model", "reason"}),
		upstream: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_gateway_upstream_seconds", Help: "Time from sending a request upstream to its response headers.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}, []string{"tier", "model"}),
		overhead: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_gateway_overhead_seconds", Help: "Time the gateway adds before a request goes upstream: authentication, parsing, estimation and the limit check.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 14),
		}, []string{"tier", "model"}),
		spend: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gateway_spend_microdollars_total", Help: "Dollars charged to budgets after settlement, in micro-dollars, by org, team (\"-\" for none) and model.",
		}, []string{"org", "team", "model"}),
		settleRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_gateway_settle_retries_total", Help: "Settlement refunds and excess charges tried again because the store was unavailable.",
		}),
		handler:     http.NotFoundHandler(),
		byTierModel: xsync.NewMap[tierModel, *tierModelMetrics](),
	}
	for _, c := range []prometheus.Collector{m.requests, m.tokens, m.rejections, m.upstream, m.overhead, m.spend, m.settleRetries} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("gateway: metrics: %w", err)
		}
	}
	if g, ok := reg.(prometheus.Gatherer); ok {
		m.gatherer = g
		m.handler = promhttp.HandlerFor(g, promhttp.HandlerOpts{})
	}
	return m, nil
}
