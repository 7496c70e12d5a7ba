package gateway

// The global remaining in /v1/status
//
// Outside a global limit's or budget's home, the region decides from its
// share, and a peek of the share says only what this region holds. For
// /v1/status the gateway reads the home's state too (region.Store's
// PeekHome, across regions: for the status answer, never for admission)
// and answers what this region can still spend: what the home has left
// plus this region's share (remaining_source "home"). What other regions
// hold in their shares is not counted: they alone can spend it (a
// window's share until its window ends, a bucket's until it is spent or
// flows back), nor a fetch in flight (charged at home, not yet credited
// to the share): the answer is low by at most those, never high. When the
// home does not answer within homeStatusTimeout the
// row keeps the share's figure, and says so (remaining_source "share").
//
// The home's answer is kept per store key for homeStatusReuse, shared by
// every client of that key on this instance (an org's budget by all its
// keys), and concurrent status calls wait for the one read in flight: a
// flood of status calls costs the home at most one read per global key
// per homeStatusReuse per instance, and a home that does not answer costs
// each call no more than one timeout per homeStatusReuse (a failure is
// kept as long). At most maxHomeReads keys are kept; past them a status
// call answers the share's figure.

import (
	"context"
	"sync"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/region"
)

// Bounds of the home reads of /v1/status.
const (
	homeStatusReuse   = time.Second
	homeStatusTimeout = time.Second
	maxHomeReads      = 4096
)

// The remaining_source of a global row of /v1/status.
const (
	sourceHome  = "home"
	sourceShare = "share"
)

// homeReads keeps the homes' answers per store key.
type homeReads struct {
	rs      *region.Store // nil without regions: nothing is read
	timeout time.Duration
	mu      sync.Mutex
	m       map[string]*homeRead
}

// homeRead is one read of a key's state at its home; d and err are set
// before done is closed, at under homeReads.mu.
type homeRead struct {
	done chan struct{}
	at   time.Time
	d    sluice.Decision
	err  error
}

func newHomeReads(st sluice.Store) *homeReads {
	return &homeReads{rs: regionLayer(st), timeout: homeStatusTimeout, m: map[string]*homeRead{}}
}

func (r *homeRead) finished() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// get returns the home's decision for req, read now or at most
// homeStatusReuse ago (by now), and whether there is one.
func (h *homeReads) get(ctx context.Context, now func() time.Time, req sluice.Request) (sluice.Decision, bool) {
	t := now()
	h.mu.Lock()
	e := h.m[req.Key]
	if e != nil && (!e.finished() || (t.Sub(e.at) < homeStatusReuse && !t.Before(e.at))) {
		h.mu.Unlock()
		select {
		case <-e.done:
			return e.d, e.err == nil
		case <-ctx.Done():
			return sluice.Decision{}, false
		}
	}
	if e == nil && len(h.m) >= maxHomeReads {
		for k, v := range h.m {
			if v.finished() && (t.Sub(v.at) >= homeStatusReuse || t.Before(v.at)) {
				delete(h.m, k)
			}
		}
		if len(h.m) >= maxHomeReads {
			h.mu.Unlock()
			return sluice.Decision{}, false
		}
	}
	e = &homeRead{done: make(chan struct{})}
	h.m[req.Key] = e
	h.mu.Unlock()
	// Not the caller's deadline: others may wait for this read.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.timeout)
	e.d, e.err = h.rs.PeekHome(rctx, req)
	cancel()
	h.mu.Lock()
	e.at = now()
	h.mu.Unlock()
	close(e.done)
	return e.d, e.err == nil
}

// fromHome reads, at once, the home's state of each global row i of a
// status (specs[i], reqs[i]) that this region answered from its share
// (ds[i]); home[i] is nil where none was read.
func (g *Gateway) fromHome(ctx context.Context, specs []*spec, reqs []sluice.Request, ds []sluice.Decision) []*sluice.Decision {
	if g.homeReads.rs == nil {
		return nil
	}
	home := make([]*sluice.Decision, len(ds))
	var wg sync.WaitGroup
	for i := range ds {
		if specs[i].mark == "" || ds[i].Source != sluice.FromShare {
			continue
		}
		wg.Go(func() {
			if d, ok := g.homeReads.get(ctx, g.now, reqs[i]); ok {
				home[i] = &d
			}
		})
	}
	wg.Wait()
	return home
}

// withHome is what a status row answers for spec s, decided d in this
// region, with hd the home's decision when it was read: d, with the
// home's remaining added to the share's (at most capacity) and its reset
// time when hd is set; and the row's remaining_source, "" for a regional
// spec.
func withHome(s *spec, d sluice.Decision, hd *sluice.Decision, capacity int64) (sluice.Decision, string) {
	switch {
	case s.mark == "":
		return d, ""
	case d.Source != sluice.FromShare:
		return d, sourceHome
	case hd == nil:
		return d, sourceShare
	}
	d.Remaining = min(max(d.Remaining, 0)+max(hd.Remaining, 0), capacity)
	d.ResetAfter, d.RetryAfter = hd.ResetAfter, hd.RetryAfter
	return d, sourceHome
}
