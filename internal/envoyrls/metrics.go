package envoyrls

import (
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice"
)

// Label values that stand for many.
const (
	unknownDomain    = "_unknown_"
	overrideRule     = "_override_"
	defaultMaxSeries = 1000
)

// metrics are the service's Prometheus series. Their labels are bounded:
// domain and descriptor come from the configuration, not from requests,
// except for detailed_metric descriptors, whose request values are used up
// to a fixed number of series and folded into the configured key beyond it.
type metrics struct {
	hits          *prometheus.CounterVec
	requests      *prometheus.CounterVec
	requestErrors *prometheus.CounterVec
	loads         *prometheus.CounterVec
	refused       *prometheus.CounterVec // fairness.go, resetguard.go
	rules         prometheus.Gauge
	seconds       prometheus.Histogram
	maxSeries     int

	mu       sync.Mutex
	detailed map[string]*ruleStats // bounded by maxSeries
	unknown  *domainStats
}

// ruleStats are one descriptor's counters, resolved once so that the
// request path only adds.
type ruleStats struct {
	total, within, over, near, shadow prometheus.Counter
}

// domainStats count requests per domain by overall code, and the requests
// whose limit override was ignored or that exceeded the structural bounds.
type domainStats struct {
	ok, over, err         prometheus.Counter
	badOverride, tooLarge prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, maxSeries int) (*metrics, error) {
	if maxSeries <= 0 {
		maxSeries = defaultMaxSeries
	}
	m := &metrics{
		hits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_envoy_rls_hits_total",
			Help: "Hits per rate-limit descriptor, by outcome: total_hits, within_limit, over_limit, near_limit (over 80% used), shadow_mode (over the limit but let through).",
		}, []string{"domain", "descriptor", "outcome"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_envoy_rls_requests_total",
			Help: "ShouldRateLimit calls per domain by overall code: ok, over_limit or error.",
		}, []string{"domain", "code"}),
		requestErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_envoy_rls_request_errors_total",
			Help: "Malformed parts of ShouldRateLimit calls per domain, by problem: bad_override (a limit override with an unknown or missing unit or an out-of-range period; the configured limit applied), over_bounds (more descriptors or entries than the service takes; answered OVER_LIMIT).",
		}, []string{"domain", "problem"}),
		loads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_envoy_rls_config_loads_total",
			Help: "Configuration loads by result: success or error.",
		}, []string{"result"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_envoy_rls_refused_total",
			Help: "gRPC connections and calls refused to keep one client from slowing the others, by reason: conns_per_peer, cool_off (a connection while its client cools off after a rapid reset), peer_table (the table of clients is full), rapid_reset (a connection cut off with GOAWAY), peer_calls (a call beyond its client's calls in flight; OVER_LIMIT), oversize (a message over max_request_bytes; OVER_LIMIT).",
		}, []string{"reason"}),
		rules: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_envoy_rls_rules",
			Help: "Rate limits in the loaded configuration.",
		}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_envoy_rls_request_duration_seconds",
			Help:    "Time to answer a ShouldRateLimit call, store calls included.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}),
		maxSeries: maxSeries,
		detailed:  map[string]*ruleStats{},
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.hits, m.requests, m.requestErrors, m.loads, m.refused, m.rules, m.seconds} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	m.unknown = m.domain(unknownDomain)
	return m, nil
}

// refuse counts a refusal of the gRPC port's guards; m may be nil (a
// server without a Service's metrics).
func (m *metrics) refuse(reason string) {
	if m != nil {
		m.refused.WithLabelValues(reason).Inc()
	}
}

func (m *metrics) domain(name string) *domainStats {
	return &domainStats{
		ok:   m.requests.WithLabelValues(name, "ok"),
		over: m.requests.WithLabelValues(name, "over_limit"),
		err:  m.requests.WithLabelValues(name, "error"),

		badOverride: m.requestErrors.WithLabelValues(name, "bad_override"),
		tooLarge:    m.requestErrors.WithLabelValues(name, "over_bounds"),
	}
}

// rule returns the counters of a configured descriptor; fullKey starts
// with the domain and a dot, which the descriptor label leaves out.
func (m *metrics) rule(domain, fullKey string) *ruleStats {
	desc := strings.TrimPrefix(fullKey, domain+".")
	return &ruleStats{
		total:  m.hits.WithLabelValues(domain, desc, "total_hits"),
		within: m.hits.WithLabelValues(domain, desc, "within_limit"),
		over:   m.hits.WithLabelValues(domain, desc, "over_limit"),
		near:   m.hits.WithLabelValues(domain, desc, "near_limit"),
		shadow: m.hits.WithLabelValues(domain, desc, "shadow_mode"),
	}
}

// detailedRule returns the counters for a detailed_metric descriptor with
// the request's values, or fallback once maxSeries such series exist.
func (m *metrics) detailedRule(domain string, entries []entryKV, fallback *ruleStats) *ruleStats {
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteByte('.')
		}
		if len(e.key) > 64 || !utf8.ValidString(e.key) { // a wildcard key can match any bytes
			b.WriteString("sha256:" + sluice.HashKey(e.key)[:16])
		} else {
			b.WriteString(e.key)
		}
		if e.value != "" {
			b.WriteByte('_')
			b.WriteString(metricValue(e.key, e.value))
		}
	}
	desc := b.String()
	m.mu.Lock()
	defer m.mu.Unlock()
	if st, ok := m.detailed[domain+"\x00"+desc]; ok {
		return st
	}
	if len(m.detailed) >= m.maxSeries {
		return fallback
	}
	st := m.rule(domain, domain+"."+desc)
	m.detailed[domain+"\x00"+desc] = st
	return st
}

// entryKV is a descriptor entry.
type entryKV struct{ key, value string }

// credentialKeys are entry keys whose values are secrets: in metric labels
// they appear only hashed.
var credentialKeys = []string{"api_key", "apikey", "api-key", "token", "auth", "secret", "password", "credential", "cookie", "session"}

// metricValue returns a value fit for a label: a value of a credential-like
// key becomes the first 16 hex digits of its SHA-256, and long values and
// values that are not UTF-8 (which Prometheus refuses: a label would panic)
// are hashed too.
func metricValue(key, value string) string {
	k := strings.ToLower(key)
	secret := len(value) > 64 || !utf8.ValidString(value)
	for _, c := range credentialKeys {
		if strings.Contains(k, c) {
			secret = true
			break
		}
	}
	if secret {
		return "sha256:" + sluice.HashKey(value)[:16]
	}
	return value
}

// record counts one descriptor's outcome.
func (st *ruleStats) record(hits int64, over, shadow, near bool) {
	if st == nil || hits <= 0 {
		return
	}
	h := float64(hits)
	st.total.Add(h)
	switch {
	case over && shadow:
		st.shadow.Add(h)
		st.over.Add(h)
	case over:
		st.over.Add(h)
	default:
		st.within.Add(h)
		if near {
			st.near.Add(h)
		}
	}
}
