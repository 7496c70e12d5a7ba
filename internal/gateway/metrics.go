package gateway

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
		handler: http.NotFoundHandler(),
	}
	for _, c := range []prometheus.Collector{m.requests, m.tokens, m.rejections, m.upstream, m.overhead, m.spend, m.settleRetries} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("gateway: metrics: %w", err)
		}
	}
	if g, ok := reg.(prometheus.Gatherer); ok {
		m.handler = promhttp.HandlerFor(g, promhttp.HandlerOpts{})
	}
	return m, nil
}
