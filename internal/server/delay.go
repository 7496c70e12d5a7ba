package server

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/httplimit"
	"github.com/sluice-io/sluice/internal/config"
)

// Delay mode. A policy with max_wait (or delay) sends its requests to the
// store as reservations (sluice.Request.MaxWait): one admitted within the
// max wait is charged now against the future, and the handler holds the
// answer for the decision's Delay before sending it, with DelayHeader. A
// caller that goes away meanwhile gets its reservation refunded, so the
// capacity returns to the next caller.
//
// Each instance holds at most config.MaxWaiting requests at once. A
// request that finds them all taken is sent as a plain request, without
// its max wait: admitted at once within the burst, 429 beyond. So a caller
// cannot make an instance hold an unbounded number of goroutines and
// connections.

// DelayHeader carries how long a delay-mode answer was held, in
// milliseconds, rounded up: "Sluice-Delay-Ms: 300". It is absent when the
// answer was not held.
const DelayHeader = httplimit.DelayHeader

// waitSlot takes one of the instance's waiting slots for a check with
// delay-mode targets, or, when none is free, strips their max wait. It
// returns the function that gives the slot back.
func (s *Server) waitSlot(cfg *config.Config, targets []target) (release func()) {
	delayed := false
	for i := range targets {
		delayed = delayed || targets[i].req.MaxWait > 0
	}
	if !delayed {
		return func() {}
	}
	if s.waiting.Add(1) <= int64(cfg.MaxWaiting) {
		return func() { s.waiting.Add(-1) }
	}
	s.waiting.Add(-1)
	s.delay.outcomes.WithLabelValues(delayUnheld).Inc()
	for i := range targets {
		targets[i].req.MaxWait = 0
	}
	return func() {}
}

// overrideLimit sets t's limit to l, a runtime override of t.base, with
// delay mode's conversion as newTarget makes it (a delay threshold applies
// to the override's burst). A max wait that waitSlot stripped stays
// stripped.
func (t *target) overrideLimit(l sluice.Limit) {
	if !t.policy.Delayed() {
		t.req.Limit = l
		return
	}
	var w time.Duration
	t.req.Limit, w = t.policy.Reservation(l)
	if t.req.MaxWait > 0 {
		t.req.MaxWait = w
	}
}

// Waiting returns the number of requests being held now.
func (s *Server) Waiting() int64 { return s.waiting.Load() }

// hold holds an admitted, delayed outcome for its Delay. It reports false
// when the caller went away meanwhile: the reservation has been refunded
// and nothing is to be written.
func (s *Server) hold(w http.ResponseWriter, r *http.Request, res *outcome) bool {
	d := res.combined
	if !d.Allowed || d.Delay <= 0 {
		return true
	}
	var charged []sluice.Request
	var ds []sluice.Decision
	for i := range res.targets {
		if res.decisions[i].Allowed && !res.decisions[i].Degraded {
			charged = append(charged, res.targets[i].req)
			ds = append(ds, res.decisions[i])
		}
	}
	rv := sluice.NewReservation(s.guard.store, charged, d, s.sleep)
	rv.Decisions = ds // a refund keeps what later callers reserved behind it
	if err := rv.Wait(r.Context()); err != nil {
		s.delay.outcomes.WithLabelValues(delayAbandoned).Inc()
		s.log.Debug("delayed request abandoned by its caller; reservation refunded", "err", err)
		return false
	}
	s.delay.outcomes.WithLabelValues(delayHeld).Inc()
	s.delay.seconds.Observe(d.Delay.Seconds())
	w.Header()[DelayHeader] = []string{strconv.FormatInt(sluice.CeilMillis(d.Delay), 10)}
	return true
}

// The results of sluice_delay_requests_total.
const (
	delayHeld      = "held"      // held for its delay, then answered
	delayAbandoned = "abandoned" // its caller went away; refunded
	delayUnheld    = "unheld"    // no waiting slot free: decided at once
)

// delayMetrics are delay mode's collectors.
type delayMetrics struct {
	outcomes *prometheus.CounterVec
	seconds  prometheus.Histogram
}

// newDelayMetrics registers delay mode's collectors on reg, or reuses
// those registered there already.
func newDelayMetrics(reg prometheus.Registerer, waiting func() float64) *delayMetrics {
	m := &delayMetrics{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_delay_requests_total",
			Help: "Delay-mode requests by result: held (then answered), abandoned (the caller went away; refunded), unheld (max_waiting reached: decided at once).",
		}, []string{"result"}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_delay_seconds",
			Help:    "How long delay-mode requests were held.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
	}
	m.outcomes = register(reg, m.outcomes)
	m.seconds = register(reg, m.seconds)
	register(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_delay_waiting",
		Help: "Delay-mode requests being held now (at most max_waiting).",
	}, waiting))
	return m
}

// register registers c on reg, or returns the collector registered there
// already under its name.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var dup prometheus.AlreadyRegisteredError
		if errors.As(err, &dup) {
			if old, ok := dup.ExistingCollector.(C); ok {
				return old
			}
		}
	}
	return c
}
