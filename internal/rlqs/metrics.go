package rlqs

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are labelled by configured domain and policy names only, never
// by bucket ids (whose values may be user ids).
type metrics struct {
	streams     *prometheus.GaugeVec   // domain
	reports     *prometheus.CounterVec // domain, policy
	assignments *prometheus.CounterVec // domain, policy, action (tokens, deny, abandon)
	rebalances  *prometheus.CounterVec // domain, policy
	storeErrors *prometheus.CounterVec // domain, policy
	refused     *prometheus.CounterVec // reason
	dropped     *prometheus.CounterVec // reason
	coalesced   prometheus.Counter
	leases      *prometheus.CounterVec // domain, policy, result (ok, error): renewals of a region lease at a global policy's home
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_rlqs_streams",
			Help: "Open RLQS streams (one per Envoy), by domain."}, []string{"domain"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_rlqs_reports_total",
			Help: "Bucket usage reports received, by domain and policy."}, []string{"domain", "policy"}),
		assignments: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_rlqs_assignments_total",
			Help: "Bucket actions sent: tokens (a token-bucket assignment), deny (blanket deny) or abandon (no policy)."}, []string{"domain", "policy", "action"}),
		rebalances: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_rlqs_rebalances_total",
			Help: "Assignments that changed a stream's tokens per interval by more than 10 %."}, []string{"domain", "policy"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_rlqs_store_errors_total",
			Help: "Reports left without a new assignment because the store failed or was late."}, []string{"domain", "policy"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_rlqs_refused_total",
			Help: "Streams ended by a bound: streams_per_peer, streams, usages_per_report, buckets_per_stream, bucket_id, unknown_domain."}, []string{"reason"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_rlqs_dropped_total",
			Help: "Bucket usages answered with nothing, the Envoy keeping its assignment: peer_reports (over the client's report budget), peer_new_buckets (over its new-bucket budget), buckets (the server at max_buckets), pending (the server holding MaxPendingBytes of reports)."}, []string{"reason"}),
		coalesced: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_rlqs_coalesced_total",
			Help: "Bucket usages reported again within half a report interval of the bucket's last store call, answered from its assignment in force without one."}),
		leases: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_rlqs_region_leases_total",
			Help: "Renewals of this instance's lease of a global policy's capacity at its home region: ok, or error (the home unreachable, late or degraded)."}, []string{"domain", "policy", "result"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.streams, m.reports, m.assignments, m.rebalances, m.storeErrors, m.refused, m.dropped, m.coalesced, m.leases} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("rlqs: register metrics: %w", err)
		}
	}
	return m, nil
}
