package region

import (
	"context"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice"
)

// entry is what an instance knows of one global key it decides from
// shares: its demand here and its fetch in flight.
type entry struct {
	mu       sync.Mutex
	req      sluice.Request // key, algorithm, limit of the last request
	rate     float64        // units/s this instance was asked for, smoothed
	rateAt   int64          // ns of the last update
	lastUse  int64          // ns
	fetching chan struct{}  // closed when the latest fetch started ends
	inflight int            // fetches in flight
	pending  int64          // units they asked for
	retryAt  int64          // ns before which no fetch is sent
	down     bool           // the last fetch failed: the home is unreachable
	lat      float64        // smoothed ns a fetch takes
	winEnd   int64          // ns: the end of the window of the last window share, estimated early
	short    bool           // the last fetch got less than it asked for, or nothing
	empty    bool           // the last fetch got nothing: the home is at its limit

	// fair.go
	fairSat  bool  // the key was at its limit at the last ask: its refill is shared by demand
	fairAt   int64 // ns of the home region's last report
	fairBusy bool  // a report is in flight
	// homeShort: the home region's store denied its last decision here
	// (the store is spent), reported to the demand table.
	homeShort atomic.Bool
	shared    bool // the home region decided the key from a share since the sweep last emptied it

	// epoch.go
	epoch      string // the home's epoch id of the key last seen
	epochAt    int64  // ns of the last check
	epochStale bool   // a call to the home failed since
	epochBusy  bool   // a check is in flight
	epochOwed  bool   // this instance found a loss and its quarantine charge failed
}

// minFetch is the fewest units a fetch asks for, when MaxFraction of the
// capacity allows.
const minFetch = 4

// rateTau is the time constant of the demand's moving average.
const rateTau = 0.5 // s

// note counts cost units asked for at now.
func (e *entry) note(now, cost int64) {
	e.mu.Lock()
	dt := float64(now-e.rateAt) / 1e9
	if e.rateAt == 0 || dt < 0 {
		dt = 0
	}
	e.rate = e.rate*math.Exp(-dt/rateTau) + float64(cost)/rateTau
	e.rateAt, e.lastUse = now, now
	e.mu.Unlock()
}

// target is how many units one fetch asks for: the demand over the
// horizon (at least three fetch round trips), at least one request's
// cost, at most MaxFraction of the capacity. Called with e.mu held.
func (e *entry) target(s *Store) int64 {
	h := max(s.horizon, 3*e.lat/1e9)
	if e.req.Algorithm == sluice.FixedWindow {
		// What a window's share holds at its end is lost: cover only
		// what is left of the window once the fetch is back.
		if left := float64(e.winEnd-s.clk.Now()) - e.lat; left > 0 {
			h = min(h, left/1e9)
		}
	}
	n := int64(math.Ceil(e.rate * h))
	capacity := e.req.Capacity()
	top := max(int64(s.frac*float64(capacity)), 1)
	// A standing minimum, so that a slow key does not cross regions for
	// every request.
	n = max(n, min(minFetch, top))
	n = min(n, top)
	return min(max(n, e.req.Cost, 1), capacity)
}

// lowWater is the share left under which the next fetch is sent: two
// fetch round trips of the demand, or half a fetch.
func (e *entry) lowWater(s *Store) float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return max(float64(e.target(s))/2, e.rate*2*e.lat/1e9)
}

// maxInflight bounds the fetches of one key an instance has in flight at
// once: a far region's demand can need more than one fetch per round trip
// (a fetch is at most MaxFraction of the capacity).
const maxInflight = 8

// prefetch starts a fetch of e's key when the region's share (held units,
// as the last decision saw it) and the fetches in flight hold less than
// the low-water mark, unless the last fetch said to wait; in parallel
// unless the last one came back empty (the home is at its limit) or
// failed, or the key is a window's. It
// returns a channel closed when a fetch in flight ends (nil when none is).
func (s *Store) prefetch(home sluice.Store, e *entry, held int64) <-chan struct{} {
	lw := e.lowWater(s)
	e.mu.Lock()
	defer e.mu.Unlock()
	limit := maxInflight
	if e.empty || e.down || e.req.Algorithm == sluice.FixedWindow {
		// A window's share strands what it holds at the window's end:
		// one fetch at a time (a fetch is up to MaxFraction of the
		// window's limit, and windows measured 0.935 with eight).
		limit = 1
	}
	if e.inflight >= limit || (e.inflight > 0 && float64(held+e.pending) >= lw) || s.clk.Now() < e.retryAt {
		return e.fetching
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return e.fetching
	}
	ch := make(chan struct{})
	e.fetching = ch
	req := e.req
	req.Cost = e.target(s)
	req.MaxWait, req.Lease, req.UseLease = 0, "", false
	e.inflight++
	e.pending += req.Cost
	s.inflight.Go(func() {
		s.fetch(home, e, req)
		e.mu.Lock()
		e.inflight--
		e.pending -= req.Cost
		if e.fetching == ch {
			e.fetching = nil
		}
		e.mu.Unlock()
		close(ch)
	})
	return ch
}

// fetch charges req.Cost units of the key at its home and credits them
// to the region's share. When the home has fewer left, it takes what is
// left; when none, it waits for the home's RetryAfter. Every unit the
// ledger is credited was charged at home before: the bound.
func (s *Store) fetch(home sluice.Store, e *entry, req sluice.Request) {
	s.st.fetches.Add(1)
	ctx, cancel := context.WithTimeout(sluice.WaitForReply(context.Background()), s.fetchTO)
	defer cancel()
	// The home's epoch (epoch.go), beside the fetch rather than before
	// it: a cold key's first fetch would take two round trips, more than
	// FetchWait from a far region (TestGlobalBudgetAcrossRegions: ap,
	// 300ms away, was denied its first calls), and a window share's
	// expiry, read below, would be early by the check. A loss it finds is
	// charged after this fetch: the bound holds from then on, and this
	// fetch's units at most are spent meanwhile.
	e.mu.Lock()
	due := s.epochDue(e, s.clk.Now()) && !e.epochBusy
	e.mu.Unlock()
	if due {
		name := s.home(req.Key)
		s.inflight.Go(func() {
			cctx, ccancel := context.WithTimeout(context.Background(), s.fetchTO)
			defer ccancel()
			if err := s.checkEpoch(cctx, name, home, e); err != nil {
				e.mu.Lock()
				e.epochStale = true
				e.mu.Unlock()
			}
		})
	}
	// The share's expiry is set by the region's Redis clock, read before
	// the fetch: the home charges after it.
	t0, err := s.led.time(ctx)
	if err != nil {
		e.mu.Lock()
		e.retryAt = s.clk.Now() + s.downRetry
		e.mu.Unlock()
		s.st.fetchErrors.Add(1)
		return
	}
	sent := s.clk.Now()
	// Sharing by demand (fair.go): when the key is at its limit, the
	// units come from this region's pool in the key's demand table at
	// home, allotted by demand; else from the home's store as they come
	// (and what the pool still holds, asked beside the charge).
	fair, sat := s.ask(ctx, home, e, &req)
	var d sluice.Decision
	short := false
	if sat && fair.err == nil {
		d = sluice.Decision{Allowed: fair.g.n > 0, RetryAfter: max(fair.g.wait, time.Millisecond)}
		short = fair.g.n < req.Cost
		req.Cost = max(fair.g.n, 1)
	} else {
		d, err = home.Apply(ctx, sluice.OpAllow, req)
		short = err == nil && !d.Allowed
		if err == nil && !d.Degraded && !d.Allowed && d.Remaining > 0 && d.Remaining < req.Cost {
			req.Cost = d.Remaining
			d, err = home.Apply(ctx, sluice.OpAllow, req)
		}
		if fair != nil {
			<-fair.done
			if pool := fair.g.n; fair.err == nil && pool > 0 {
				switch {
				case err != nil || d.Degraded:
					s.st.stranded.Add(uint64(pool))
				case d.Allowed:
					req.Cost += pool
				default:
					req.Cost, d.Allowed = pool, true
				}
			}
		}
	}
	got := s.clk.Now()
	e.mu.Lock()
	if err != nil || d.Degraded {
		e.down, e.epochStale = true, true
		e.retryAt = got + s.downRetry
		e.mu.Unlock()
		s.st.fetchErrors.Add(1)
		return
	}
	e.down, e.short = false, short
	lat := float64(got - sent)
	if e.lat == 0 {
		e.lat = lat
	} else {
		e.lat += (lat - e.lat) / 4
	}
	e.empty = !d.Allowed
	if !d.Allowed {
		e.retryAt = sent + int64(d.RetryAfter)
		e.mu.Unlock()
		s.st.fetchDenied.Add(1)
		return
	}
	e.retryAt = 0
	e.mu.Unlock()

	// A bucket share is spendable for TTL from the charge, a window's
	// until its window ends: both counted from t0, the region's Redis
	// time before the fetch was sent (the home charged it later).
	var exp int64
	win := ""
	if req.Algorithm == sluice.FixedWindow {
		var w int64
		exp, w = s.windowEnd(req.Limit, t0, (got-sent)/int64(time.Millisecond), d.ResetAfter)
		win = strconv.FormatInt(w, 10)
		e.mu.Lock()
		e.winEnd = sent + int64(d.ResetAfter)
		e.mu.Unlock()
	} else {
		exp = t0 + s.ttl/int64(time.Millisecond)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), s.led.timeout*4)
	defer ccancel()
	sh, err := s.led.credit(cctx, req.Key, req.Cost, exp, win)
	if err != nil {
		// The units were charged at home and are lost to the region:
		// under-admission, never over.
		s.st.stranded.Add(uint64(req.Cost))
		s.log.Warn("region: crediting a share failed", "region", s.region, "units", req.Cost, "err", err)
		return
	}
	if !sh.ok {
		// It came back after its share would have expired.
		s.st.stranded.Add(uint64(req.Cost))
		s.refund(home, req, req.Cost)
		return
	}
	s.st.fetched.Add(uint64(req.Cost))
}

// windowEnd is when a window share must be spent by, in ms by the
// region's Redis clock, and the window's number. t0 is that clock before
// the fetch was sent and rtt the fetch's round trip: the home charged the
// share between, so its window ends between t0 + ResetAfter and t0 + rtt
// + ResetAfter. The first is safe whatever the clocks, and loses what the
// round trip takes of each window. With ClockSkew set, the window's end
// by this clock (windows are aligned to the Unix epoch), less the skew,
// is used within those two. Both instances of a region read one clock, so
// they number a window alike.
//
// A calendar window (a day in a time zone, a month: of varying length) is
// named by its end in ms, the boundary of the calendar nearest to t0 +
// ResetAfter, as a periodic window is by its number (calendar.go).
func (s *Store) windowEnd(l sluice.Limit, t0, rtt int64, ra time.Duration) (exp, win int64) {
	lo := t0 + ra.Milliseconds() // ResetAfter rounded down: earlier
	hi := lo + rtt + 1
	end, win := nearestEnd(l, lo)
	if s.skew <= 0 {
		return lo, win
	}
	aligned := end - s.skew/int64(time.Millisecond)
	return min(max(aligned, lo), hi), win
}

// nearestEnd is the window boundary of l nearest to t (ms), and the name
// of the window it ends: its number for a periodic window, its end in ms
// for a calendar one. A share's window and a refund's are named by it.
func nearestEnd(l sluice.Limit, t int64) (end, win int64) {
	if l.Calendar.IsZero() {
		p := l.Period.Milliseconds()
		win = (t + p/2) / p
		return win * p, win
	}
	start, stop := l.Calendar.WindowNanos(t * int64(time.Millisecond))
	end = stop / int64(time.Millisecond)
	if t*int64(time.Millisecond)-start < stop-t*int64(time.Millisecond) {
		end = start / int64(time.Millisecond)
	}
	return end, end
}

// refund gives units of a bucket key back to its home; windows are never
// refunded (a late refund would land in the next window).
func (s *Store) refund(home sluice.Store, req sluice.Request, units int64) bool {
	if req.Algorithm == sluice.FixedWindow || units <= 0 {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.fetchTO)
	defer cancel()
	req.Cost = units
	if _, err := home.Apply(ctx, sluice.OpRefund, req); err != nil {
		s.log.Warn("region: refunding a share failed", "region", s.region, "units", units, "err", err)
		return false
	}
	s.st.refunds.Add(1)
	s.st.refunded.Add(uint64(units))
	return true
}

func (s *Store) sweepLoop(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sweep(context.Background())
		}
	}
}

// Sweep refunds at home the bucket shares that expired or went unspent
// for IdleAfter in this region, and what a share holds beyond twice this
// instance's need (a fetch and the low-water mark), and forgets keys this instance has not
// been asked for since. The units of a refund that fails are counted
// stranded, not put back (it may have run at home). The background sweep
// calls it.
func (s *Store) Sweep(ctx context.Context) {
	now := s.clk.Now()
	s.keys.Range(func(key string, e *entry) bool {
		e.mu.Lock()
		req, idle, busy, down := e.req, now-e.lastUse > int64(s.idle), e.inflight > 0, e.down && now < e.retryAt
		e.mu.Unlock()
		if s.home(key) == s.region {
			// A key this region is the home of: its entry holds the
			// epoch this instance saw, kept as long as it may matter,
			// and its demand. At its limit the region decides it from a
			// share (fair.go): what the share holds beyond twice this
			// instance's need goes back to the store, as below, and all
			// of it once the key is under its limit again.
			e.mu.Lock()
			last, sat, shared := e.lastUse, e.fairSat, e.shared
			e.mu.Unlock()
			if shared && !busy {
				keep := int64(-1)
				if sat {
					lw := e.lowWater(s)
					e.mu.Lock()
					keep = 2 * (e.target(s) + int64(math.Ceil(lw)))
					e.mu.Unlock()
				}
				if s.takeBack(ctx, req, s.idle, !sat, keep) && !sat {
					e.mu.Lock()
					e.shared = e.fairSat
					e.mu.Unlock()
				}
			}
			if now-last > int64(epochTTL(&req)) {
				s.forget(key, e)
			}
			return true
		}
		if busy || down || req.Algorithm == sluice.FixedWindow {
			if idle && !busy && req.Algorithm == sluice.FixedWindow {
				s.forget(key, e)
			}
			return true
		}
		// A share over twice what this instance's demand keeps (a fetch
		// and the low-water mark) goes back too: the demand moved away,
		// and another region may need it. (The region's other instance
		// fetches again if it needed more.)
		lw := e.lowWater(s)
		e.mu.Lock()
		keep := 2 * (e.target(s) + int64(math.Ceil(lw)))
		e.mu.Unlock()
		if !s.takeBack(ctx, req, s.idle, false, keep) {
			return true
		}
		if idle {
			s.forget(key, e)
		}
		return true
	})
	s.refundOrphans(ctx)
}

// counters are a Store's statistics.
type counters struct {
	home, share, denied, policy                                             atomic.Uint64
	fetches, fetchDenied, fetchErrors, fetched, refunds, refunded, stranded atomic.Uint64
	async, synced, syncErrors, quarantines                                  atomic.Uint64
	allotted, fairErrors                                                    atomic.Uint64
}

// Stats are a Store's counts since it started.
type Stats struct {
	// Home counts admissions and denials of global keys decided by this
	// region's store as their home.
	Home uint64
	// Share counts admissions from a share this region held.
	Share uint64
	// Denied counts requests denied because the region's share was spent
	// and the home had no more to give yet.
	Denied uint64
	// Policy counts requests the failure policy answered: the home was
	// unreachable and the share spent.
	Policy uint64
	// Fetches counts share fetches sent to homes; FetchDenied those the
	// home had nothing for, FetchErrors those that failed.
	Fetches, FetchDenied, FetchErrors uint64
	// Fetched counts the units credited to shares.
	Fetched uint64
	// Refunds and Refunded count refunds at homes and their units.
	Refunds, Refunded uint64
	// Stranded counts units charged at home that the region could not
	// use or give back (a reply too late, a failed credit).
	Stranded uint64
	// Async counts admissions of asynchronous keys by this region's
	// store.
	Async uint64
	// Synced counts the units of asynchronous keys delivered to other
	// regions (charged or refunded there); SyncErrors the deliveries
	// that failed (retried by the next round).
	Synced, SyncErrors uint64
	// Quarantines counts the times this instance found that a home had
	// lost a key's state, and charged its capacity there (epoch.go).
	Quarantines uint64
	// Allotted counts the units this instance, in a key's home region,
	// charged at its store and allotted to the regions' pools by demand
	// while the key was at its limit (fair.go); FairErrors the calls to
	// a demand table that failed (a fetch then charges the store as it
	// comes).
	Allotted, FairErrors uint64
	// Keys is the number of global keys tracked.
	Keys int64
}

// Stats returns the Store's counts.
func (s *Store) Stats() Stats {
	return Stats{
		Home: s.st.home.Load(), Share: s.st.share.Load(), Denied: s.st.denied.Load(), Policy: s.st.policy.Load(),
		Fetches: s.st.fetches.Load(), FetchDenied: s.st.fetchDenied.Load(), FetchErrors: s.st.fetchErrors.Load(),
		Fetched: s.st.fetched.Load(), Refunds: s.st.refunds.Load(), Refunded: s.st.refunded.Load(),
		Stranded: s.st.stranded.Load(), Async: s.st.async.Load(), Synced: s.st.synced.Load(), SyncErrors: s.st.syncErrors.Load(),
		Quarantines: s.st.quarantines.Load(), Allotted: s.st.allotted.Load(), FairErrors: s.st.fairErrors.Load(),
		Keys: s.size.Load(),
	}
}
