// Package metrics holds the sluice service's Prometheus metrics, on a
// private registry. Every label set is bounded: policy and tier names come
// from the configuration (requests that name anything else are rejected
// before they are counted), results and handlers are fixed lists, and no
// label ever carries a key, raw or hashed.
package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Results of a decision, the values of the "result" label.
const (
	Allowed      = "allowed"
	Denied       = "denied"
	ShadowDenied = "shadow_denied"
	Degraded     = "degraded"
)

// NoTier is the tier label of a check that named a policy directly.
const NoTier = "-"

// Circuit states, the values of the store circuit gauge.
const (
	CircuitClosed   = 0
	CircuitHalfOpen = 1
	CircuitOpen     = 2
)

// Metrics are the service's collectors. Create them with New.
type Metrics struct {
	// Registry holds every collector below, and the Go and process
	// collectors.
	Registry *prometheus.Registry
	// Decisions counts decisions by policy, tier and result.
	Decisions *prometheus.CounterVec
	// DecisionSeconds observes the latency of decisions by endpoint,
	// including the store call.
	DecisionSeconds *prometheus.HistogramVec
	// StoreErrors counts failed store calls by operation.
	StoreErrors *prometheus.CounterVec
	// StoreCircuit is the store circuit breaker's state: 0 closed,
	// 1 half-open, 2 open.
	StoreCircuit prometheus.Gauge
	// Reloads counts configuration reloads by result, success or failure.
	Reloads *prometheus.CounterVec
	// ConfigLoaded is the Unix time of the last successful (re)load.
	ConfigLoaded prometheus.Gauge
	// InFlight is the number of requests being served.
	InFlight prometheus.Gauge
	// Requests counts HTTP requests by handler and status code.
	Requests *prometheus.CounterVec
}

// New returns the metrics, registered on a new private registry.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_decisions_total",
			Help: "Rate-limit decisions by policy, tier and result (allowed, denied, shadow_denied, degraded).",
		}, []string{"policy", "tier", "result"}),
		DecisionSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_decision_duration_seconds",
			Help:    "Time to decide a request, store call included, by endpoint.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}, []string{"endpoint"}),
		StoreErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_store_errors_total",
			Help: "Store calls that failed (timeouts, connection errors), by operation.",
		}, []string{"op"}),
		StoreCircuit: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_store_circuit_state",
			Help: "Store circuit breaker: 0 closed, 1 half-open, 2 open (the failure policy answers).",
		}),
		Reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_config_reloads_total",
			Help: "Configuration reloads by result (success, failure).",
		}, []string{"result"}),
		ConfigLoaded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_config_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last successful configuration load.",
		}),
		InFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_http_requests_in_flight",
			Help: "HTTP requests being served.",
		}),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_http_requests_total",
			Help: "HTTP requests by handler and status code.",
		}, []string{"handler", "code"}),
	}
	m.Registry.MustRegister(m.Decisions, m.DecisionSeconds, m.StoreErrors, m.StoreCircuit,
		m.Reloads, m.ConfigLoaded, m.InFlight, m.Requests,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, r := range []string{"success", "failure"} {
		m.Reloads.WithLabelValues(r)
	}
	for _, op := range []string{"allow", "peek", "reset"} {
		m.StoreErrors.WithLabelValues(op)
	}
	return m
}

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// ReloadResult records a configuration reload.
func (m *Metrics) ReloadResult(err error, now time.Time) {
	if err != nil {
		m.Reloads.WithLabelValues("failure").Inc()
		return
	}
	m.Reloads.WithLabelValues("success").Inc()
	m.ConfigLoaded.Set(float64(now.UnixNano()) / 1e9)
}

// Code formats a status code as a label value without allocating for the
// common codes.
func Code(code int) string {
	switch code {
	case 200:
		return "200"
	case 400:
		return "400"
	case 401:
		return "401"
	case 403:
		return "403"
	case 404:
		return "404"
	case 405:
		return "405"
	case 413:
		return "413"
	case 429:
		return "429"
	case 500:
		return "500"
	case 503:
		return "503"
	}
	return strconv.Itoa(code)
}
