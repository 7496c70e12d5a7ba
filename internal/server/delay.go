package server

import (
	"net/http"
	"strconv"

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
	for i := range targets {
		targets[i].req.MaxWait = 0
	}
	return func() {}
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
	for i := range res.targets {
		if res.decisions[i].Allowed && !res.decisions[i].Degraded {
			charged = append(charged, res.targets[i].req)
		}
	}
	rv := sluice.NewReservation(s.guard.store, charged, d, s.sleep)
	if err := rv.Wait(r.Context()); err != nil {
		s.log.Debug("delayed request abandoned by its caller; reservation refunded", "err", err)
		return false
	}
	w.Header()[DelayHeader] = []string{strconv.FormatInt(sluice.CeilMillis(d.Delay), 10)}
	return true
}
