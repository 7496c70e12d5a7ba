// Package metrics holds the sluice service's Prometheus metrics, on a
// private registry. Every label set is bounded: policy and tier names come
// from the configuration (requests that name anything else are rejected
// before they are counted), results and handlers are fixed lists, and no
// label ever carries a key, raw or hashed.
package metrics

import (
	"net/http"
	"strconv"
	"sync/atomic"
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
	// collectors; the components running beside the API register theirs
	// on it too.
	Registry *Registry
	// Decisions counts decisions by policy, tier and result.
	Decisions *prometheus.CounterVec
	// DecisionSeconds observes the latency of decisions by endpoint,
	// including the store call.
	DecisionSeconds *prometheus.HistogramVec
	// store reads the store's counters at each scrape.
	store atomic.Pointer[func() StoreStats]
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
		Registry: NewRegistry(),
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_decisions_total",
			Help: "Rate-limit decisions by policy, tier and result (allowed, denied, shadow_denied, degraded).",
		}, []string{"policy", "tier", "result"}),
		DecisionSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_decision_duration_seconds",
			Help:    "Time to decide a request, store call included, by endpoint.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}, []string{"endpoint"}),
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
	m.Registry.MustRegister(m.Decisions, m.DecisionSeconds, storeCollector{m.storeStats},
		m.Reloads, m.ConfigLoaded, m.InFlight, m.Requests,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, r := range []string{"success", "failure"} {
		m.Reloads.WithLabelValues(r)
	}
	return m
}

// StoreStats are a store's counters since start, read at each scrape.
type StoreStats struct {
	// Calls is the number of calls sent to the store.
	Calls uint64
	// Errors is the number of calls that failed or timed out.
	Errors uint64
	// Degraded is the number of decisions the failure policy made.
	Degraded uint64
	// CacheHits is the number of denials answered from a local cache.
	CacheHits uint64
	// CircuitOpens is how many times the circuit breaker opened.
	CircuitOpens uint64
	// StarvedLate counts late store calls and probes not held against the
	// store because this process was starved of CPU (guard.Stats).
	StarvedLate uint64
	// LateAnswers counts store calls answered by the store after their
	// deadline, within the guard's late grace.
	LateAnswers uint64
	// Circuit is CircuitClosed, CircuitHalfOpen or CircuitOpen.
	Circuit int
	// Instances is the number of instances the local failure policy
	// divides limits by (learnt by heartbeat, or store.instances).
	Instances int
	// LeaseHits, LeaseFetches and LeaseReturns count decisions made from
	// leased capacity, chunk requests and refunds of unused capacity.
	LeaseHits, LeaseFetches, LeaseReturns uint64
	// Plain and PlainLate count the Redis store's plain-path decisions
	// (store.plain_windows) and those decided again by a script because
	// their answer came late; Groups and Grouped the group commit's groups
	// and the commands they held (redisstore.Stats).
	Plain, PlainLate, Groups, Grouped uint64
	// DegradedBy counts the decisions each failure policy made, by the
	// policy's configuration name.
	DegradedBy map[string]uint64
	// Nodes are the counters of each store node (a Redis address; one for
	// a standalone Redis, one per master on a Cluster).
	Nodes []NodeStats
	// Region, with store.region set, counts this instance's decisions of
	// global keys and its shares (region.Stats); nil exports nothing.
	Region *RegionStats
}

// RegionStats are one instance's counters of global keys (package region).
type RegionStats struct {
	// Region is the instance's region, the metrics' region label.
	Region string
	// Home, Share, Denied and Policy count decisions by the tier that made
	// them: the key's home store (this region), a share held here, a
	// denial for want of a share, the failure policy.
	Home, Share, Denied, Policy uint64
	// Fetches, FetchDenied and FetchErrors count share fetches sent to
	// homes, those the home had nothing for, and those that failed.
	Fetches, FetchDenied, FetchErrors uint64
	// Fetched, Refunded and Stranded count units credited to shares,
	// given back to homes, and lost to late replies or failed credits;
	// Allotted the units this instance charged at a home of its region
	// and allotted to the regions' pools by demand, a key at its limit.
	Fetched, Refunded, Stranded, Allotted uint64
	// Async counts admissions of asynchronous keys by this region's
	// store; Synced the units of them delivered to other regions, and
	// SyncErrors the deliveries that failed (retried next round).
	Async, Synced, SyncErrors uint64
	// Quarantines counts the homes found to have lost a key's state.
	Quarantines uint64
}

// NodeStats are one store node's counters.
type NodeStats struct {
	// Node names the node, such as a Redis address.
	Node string
	// Calls and Errors count as in StoreStats; Openings counts this node's
	// circuit openings.
	Calls, Errors, Openings uint64
	// Open reports that the node's circuit is open now.
	Open bool
}

// SetStoreStats sets the function that reports the store's counters.
func (m *Metrics) SetStoreStats(fn func() StoreStats) { m.store.Store(&fn) }

func (m *Metrics) storeStats() StoreStats {
	if fn := m.store.Load(); fn != nil {
		return (*fn)()
	}
	return StoreStats{}
}

// NewStoreCollector returns a collector of the store counters that stats
// reports at each scrape (sluice_store_*, sluice_lease_*, sluice_redis_*,
// sluice_region_*), for a process without Metrics: the standalone
// gateway.
func NewStoreCollector(stats func() StoreStats) prometheus.Collector { return storeCollector{stats} }

var (
	storeCallsDesc     = prometheus.NewDesc("sluice_store_calls_total", "Calls sent to the store.", nil, nil)
	storeErrorsDesc    = prometheus.NewDesc("sluice_store_errors_total", "Store calls that failed or timed out.", nil, nil)
	storeDegradedDesc  = prometheus.NewDesc("sluice_store_degraded_total", "Decisions made by the failure policy because the store failed or its circuit was open.", nil, nil)
	storeCacheDesc     = prometheus.NewDesc("sluice_store_deny_cache_hits_total", "Denials answered from the local over-limit cache without asking the store.", nil, nil)
	storeOpensDesc     = prometheus.NewDesc("sluice_store_circuit_opens_total", "Times the store circuit breaker opened.", nil, nil)
	storeStarvedDesc   = prometheus.NewDesc("sluice_store_late_while_starved_total", "Late store calls and probes not held against the store, because this process was starved of CPU meanwhile.", nil, nil)
	storeLateDesc      = prometheus.NewDesc("sluice_store_late_answers_total", "Store calls answered by the store after the call deadline, within the guard's late grace, instead of by the failure policy.", nil, nil)
	storeInstancesDesc = prometheus.NewDesc("sluice_store_instances", "Instances sharing the limits, as the local failure policy counts them (heartbeats in the store, or store.instances).", nil, nil)
	storeCircuitDesc   = prometheus.NewDesc("sluice_store_circuit_state", "Store circuit breaker: 0 closed, 1 half-open, 2 open (the failure policy answers).", nil, nil)
	leaseHitsDesc      = prometheus.NewDesc("sluice_lease_hits_total", "Decisions made locally from leased capacity, without the store.", nil, nil)
	leaseFetchesDesc   = prometheus.NewDesc("sluice_lease_fetches_total", "Chunks of capacity requested from the store.", nil, nil)
	leaseReturnsDesc   = prometheus.NewDesc("sluice_lease_returns_total", "Refunds of unused leased capacity to the store.", nil, nil)
	plainDesc          = prometheus.NewDesc("sluice_redis_plain_total", "Fixed-window checks decided by one plain command instead of a script (store.plain_windows).", nil, nil)
	plainLateDesc      = prometheus.NewDesc("sluice_redis_plain_late_total", "Plain-path answers that came back too late to be known to lie in their window, decided again by a script.", nil, nil)
	groupsDesc         = prometheus.NewDesc("sluice_redis_groups_total", "Groups of commands the Redis store sent in one write while its lanes to a node were busy (group commit).", nil, nil)
	groupedDesc        = prometheus.NewDesc("sluice_redis_grouped_commands_total", "Commands sent in groups; divided by sluice_redis_groups_total, the depth of the pipeline under load.", nil, nil)
	degradedByDesc     = prometheus.NewDesc("sluice_store_degraded_by_policy_total", "Decisions made by each failure policy because the store failed, missed its deadline or its circuit was open.", []string{"policy"}, nil)
	nodeCallsDesc      = prometheus.NewDesc("sluice_store_node_calls_total", "Calls sent to each store node.", []string{"node"}, nil)
	nodeErrorsDesc     = prometheus.NewDesc("sluice_store_node_errors_total", "Calls to each store node that failed or missed the deadline.", []string{"node"}, nil)
	nodeOpensDesc      = prometheus.NewDesc("sluice_store_node_circuit_opens_total", "Times each store node's circuit opened.", []string{"node"}, nil)
	nodeOpenDesc       = prometheus.NewDesc("sluice_store_node_circuit_open", "1 while a store node's circuit is open (the failure policy answers for its keys).", []string{"node"}, nil)
	regionDecDesc      = prometheus.NewDesc("sluice_region_decisions_total", "Decisions of global keys by the tier that made them: home (the key's home store, this region), share (a share held in this region), denied (no share left, the home had none to give yet), policy (the home unreachable, the failure policy answered), region (an asynchronous key, decided by this region's store).", []string{"region", "tier"}, nil)
	regionFetchDesc    = prometheus.NewDesc("sluice_region_fetches_total", "Share fetches sent to global keys' homes, by result: ok, denied (the home had nothing to give), error.", []string{"region", "result"}, nil)
	regionSyncDesc     = prometheus.NewDesc("sluice_region_sync_total", "Asynchronous global keys: units delivered to the other regions (ok) and deliveries that failed (error, retried by the next round).", []string{"region", "result"}, nil)
	regionQuarDesc     = prometheus.NewDesc("sluice_region_quarantines_total", "Global keys whose home (an async key's own region's store) was found to have lost their state, or may have (a restart, a failover), each charged its capacity there once.", []string{"region"}, nil)
	regionUnitsDesc    = prometheus.NewDesc("sluice_region_units_total", "Units of global keys' capacity: fetched (charged at home, credited to this region's shares), refunded (given back to the home), stranded (charged at home, never spendable here), allotted (charged at this region's home store and allotted to the regions by demand, a key at its limit).", []string{"region", "kind"}, nil)
)

// storeCollector exports StoreStats.
type storeCollector struct{ stats func() StoreStats }

func (c storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{storeCallsDesc, storeErrorsDesc, storeDegradedDesc, storeCacheDesc, storeOpensDesc, storeStarvedDesc, storeLateDesc, storeCircuitDesc, storeInstancesDesc, leaseHitsDesc, leaseFetchesDesc, leaseReturnsDesc, plainDesc, plainLateDesc, groupsDesc, groupedDesc, degradedByDesc, nodeCallsDesc, nodeErrorsDesc, nodeOpensDesc, nodeOpenDesc, regionDecDesc, regionFetchDesc, regionUnitsDesc, regionSyncDesc, regionQuarDesc} {
		ch <- d
	}
}

func (c storeCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	ch <- prometheus.MustNewConstMetric(storeCallsDesc, prometheus.CounterValue, float64(st.Calls))
	ch <- prometheus.MustNewConstMetric(storeErrorsDesc, prometheus.CounterValue, float64(st.Errors))
	ch <- prometheus.MustNewConstMetric(storeDegradedDesc, prometheus.CounterValue, float64(st.Degraded))
	ch <- prometheus.MustNewConstMetric(storeCacheDesc, prometheus.CounterValue, float64(st.CacheHits))
	ch <- prometheus.MustNewConstMetric(storeOpensDesc, prometheus.CounterValue, float64(st.CircuitOpens))
	ch <- prometheus.MustNewConstMetric(storeStarvedDesc, prometheus.CounterValue, float64(st.StarvedLate))
	ch <- prometheus.MustNewConstMetric(storeLateDesc, prometheus.CounterValue, float64(st.LateAnswers))
	ch <- prometheus.MustNewConstMetric(storeCircuitDesc, prometheus.GaugeValue, float64(st.Circuit))
	ch <- prometheus.MustNewConstMetric(storeInstancesDesc, prometheus.GaugeValue, float64(st.Instances))
	ch <- prometheus.MustNewConstMetric(leaseHitsDesc, prometheus.CounterValue, float64(st.LeaseHits))
	ch <- prometheus.MustNewConstMetric(leaseFetchesDesc, prometheus.CounterValue, float64(st.LeaseFetches))
	ch <- prometheus.MustNewConstMetric(leaseReturnsDesc, prometheus.CounterValue, float64(st.LeaseReturns))
	ch <- prometheus.MustNewConstMetric(plainDesc, prometheus.CounterValue, float64(st.Plain))
	ch <- prometheus.MustNewConstMetric(plainLateDesc, prometheus.CounterValue, float64(st.PlainLate))
	ch <- prometheus.MustNewConstMetric(groupsDesc, prometheus.CounterValue, float64(st.Groups))
	ch <- prometheus.MustNewConstMetric(groupedDesc, prometheus.CounterValue, float64(st.Grouped))
	for policy, n := range st.DegradedBy {
		ch <- prometheus.MustNewConstMetric(degradedByDesc, prometheus.CounterValue, float64(n), policy)
	}
	if r := st.Region; r != nil {
		for tier, n := range map[string]uint64{"home": r.Home, "share": r.Share, "denied": r.Denied, "policy": r.Policy, "region": r.Async} {
			ch <- prometheus.MustNewConstMetric(regionDecDesc, prometheus.CounterValue, float64(n), r.Region, tier)
		}
		for result, n := range map[string]uint64{"ok": r.Fetches - min(r.Fetches, r.FetchDenied+r.FetchErrors), "denied": r.FetchDenied, "error": r.FetchErrors} {
			ch <- prometheus.MustNewConstMetric(regionFetchDesc, prometheus.CounterValue, float64(n), r.Region, result)
		}
		for kind, n := range map[string]uint64{"fetched": r.Fetched, "refunded": r.Refunded, "stranded": r.Stranded, "allotted": r.Allotted} {
			ch <- prometheus.MustNewConstMetric(regionUnitsDesc, prometheus.CounterValue, float64(n), r.Region, kind)
		}
		ch <- prometheus.MustNewConstMetric(regionSyncDesc, prometheus.CounterValue, float64(r.Synced), r.Region, "ok")
		ch <- prometheus.MustNewConstMetric(regionSyncDesc, prometheus.CounterValue, float64(r.SyncErrors), r.Region, "error")
		ch <- prometheus.MustNewConstMetric(regionQuarDesc, prometheus.CounterValue, float64(r.Quarantines), r.Region)
	}
	for _, n := range st.Nodes {
		open := 0.0
		if n.Open {
			open = 1
		}
		ch <- prometheus.MustNewConstMetric(nodeCallsDesc, prometheus.CounterValue, float64(n.Calls), n.Node)
		ch <- prometheus.MustNewConstMetric(nodeErrorsDesc, prometheus.CounterValue, float64(n.Errors), n.Node)
		ch <- prometheus.MustNewConstMetric(nodeOpensDesc, prometheus.CounterValue, float64(n.Openings), n.Node)
		ch <- prometheus.MustNewConstMetric(nodeOpenDesc, prometheus.GaugeValue, open, n.Node)
	}
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
