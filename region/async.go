package region

// The asynchronous mode: for a global key that prefers using all of its
// limit over exactness, each region decides on its own store alone, as
// for a regional key, and every SyncInterval each instance charges the
// units it admitted since its last round to every other region's store
// (OpCharge, taken even into a debt). Each region's store thus sees every
// admission anywhere, its own at once and the others' late by a delivery
// delay δ (the interval, plus the trip). Over-admission is bounded by
// what the regions admit within δ:
//
//	admitted over [0, t] ≤ C + r·t + 1 + Σ_j A_j(δ)
//
// A_j(δ) the most region j admits in any span δ (≈ its rate × δ): at the
// last admission, by region k at t*, k's store had been charged with its
// own admissions and every other region's until t* − δ, and admitted
// within its own bound. A fixed window is ≤ R + Σ_j A_j(δ) per window.
// An instance that cannot deliver its counts (a partition, a peer's Redis
// down) stops admitting the key by its failure policy once the oldest
// count it holds undelivered is StaleAfter old (FailClosed), so δ ≤
// StaleAfter, whatever the faults. A region's store that restarts without
// its data, or fails over, is caught by the key's epoch marker there and
// charged the key's capacity (epoch.go): + 1 per life of its state.

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/sluice-io/sluice"
)

// Defaults of the asynchronous mode.
const (
	DefaultSyncInterval = 100 * time.Millisecond
	DefaultStaleAfter   = time.Second
)

// syncFanout bounds the deliveries to one region in flight at once (they
// pipeline on the region's connection); maxFlying those of one key.
const (
	syncFanout = 256
	maxFlying  = 8
)

// counts is what an instance admitted of one asynchronous key and has not
// yet delivered to each other region.
type counts struct {
	mu      sync.Mutex
	req     sluice.Request     // key, algorithm, limit of the last request
	win     int64              // the window the counts are of (fixed windows)
	pending []int64            // units per remote region (Store.remotes order); negative: a refund
	oldest  []int64            // ns of the oldest unit pending per remote region, 0 when none
	flying  []map[uint64]int64 // per remote region, deliveries in flight: id to their oldest unit's ns
	nextID  uint64
	lastUse int64 // ns

	// epoch.go: the key's epoch marker on this region's store
	epoch      string // the id last seen
	epochAt    int64  // ns of the last check
	epochStale bool   // a call to the region's store failed since
	epochBusy  bool   // a check is in flight
	epochOwed  bool   // this instance found a loss and its quarantine charge failed
	forgotten  bool   // dropped from the table (its id is kept in aseen)
}

// asyncEntry returns the key's counts; nil when MaxKeys are tracked.
func (s *Store) asyncEntry(req *sluice.Request) *counts {
	if c, ok := s.akeys.Load(req.Key); ok {
		return c
	}
	if s.size.Load() >= s.maxKeys {
		return nil
	}
	c, loaded := s.akeys.LoadOrCompute(req.Key, func() (*counts, bool) {
		n := len(s.remotes)
		return &counts{
			req:     sluice.Request{Key: req.Key, Algorithm: req.Algorithm, Limit: req.Limit},
			pending: make([]int64, n), oldest: make([]int64, n), flying: make([]map[uint64]int64, n),
		}, false
	})
	if !loaded {
		s.size.Add(1)
	}
	return c
}

// stale reports whether c holds a count undelivered for StaleAfter.
// Called with c.mu held.
func (c *counts) stale(now, after int64) bool {
	for i, o := range c.oldest {
		if o != 0 && now-o > after {
			return true
		}
		for _, o := range c.flying[i] {
			if now-o > after {
				return true
			}
		}
	}
	return false
}

// busy reports deliveries in flight. Called with c.mu held.
func (c *counts) busy() bool {
	for _, f := range c.flying {
		if len(f) > 0 {
			return true
		}
	}
	return false
}

// add records units admitted (or charged; negative: refunded) here at
// now, in window win, for every other region. Called with c.mu held.
func (c *counts) add(now, units, win int64) {
	if win != c.win {
		// A window ended: its undelivered counts would land in the next
		// window elsewhere; the one they were of is over.
		clear(c.pending)
		clear(c.oldest)
		c.win = win
	}
	for i := range c.pending {
		if c.pending[i] == 0 && c.oldest[i] == 0 {
			c.oldest[i] = now
		}
		c.pending[i] += units
	}
	c.lastUse = now
}

// windowOf is the number of the fixed window a decision of req made at
// now (ns) belongs to, from its ResetAfter; 0 for the other algorithms.
func windowOf(req *sluice.Request, now int64, d sluice.Decision) int64 {
	if req.Algorithm != sluice.FixedWindow {
		return 0
	}
	p := int64(req.Limit.Period)
	return (now + int64(d.ResetAfter) + p/2) / p
}

// applyAsync decides an asynchronous key on this region's store and
// counts what it admitted, for the next round to deliver elsewhere.
func (s *Store) applyAsync(ctx context.Context, op sluice.Op, req sluice.Request) (sluice.Decision, error) {
	c := s.asyncEntry(&req)
	now := s.clk.Now()
	degraded := false
	if op == sluice.OpAllow {
		// A key whose counts have not reached another region for
		// StaleAfter, or one this instance cannot track (MaxKeys): its
		// admissions would not be seen elsewhere in time, and would
		// widen the bound. FailClosed denies; FailOpen decides on this
		// region's store alone (each region then holds the limit alone).
		stale := c == nil
		if c != nil {
			c.mu.Lock()
			c.req.Algorithm, c.req.Limit = req.Algorithm, req.Limit
			stale = c.stale(now, s.staleAfter)
			c.mu.Unlock()
		}
		if stale {
			s.st.policy.Add(1)
			if s.policy != FailOpen {
				return sluice.Decision{Limit: req.Limit, Degraded: true, Fallback: s.policy.String(), Source: sluice.FromStore, RetryAfter: s.syncEvery}, nil
			}
			degraded = true
		}
	}
	if op == sluice.OpReset {
		return s.resetEverywhere(ctx, req)
	}
	// This region's store may have lost the key's state (a restart
	// without persistence, a failover): its epoch, beside (epoch.go).
	s.startAsyncEpoch(c)
	d, err := s.local.Apply(ctx, op, req)
	if degraded {
		d.Degraded, d.Fallback = true, s.policy.String()
	}
	if err != nil {
		s.asyncCallFailed([]*counts{c})
	}
	if err != nil || c == nil {
		return d, err
	}
	var units int64
	switch op {
	case sluice.OpAllow:
		if d.Allowed {
			units = req.Cost
			s.st.async.Add(1)
		}
	case sluice.OpCharge:
		units = req.Cost
	case sluice.OpRefund:
		if req.Algorithm != sluice.FixedWindow {
			// The other regions give the units back too; a window's stay
			// charged elsewhere (a refund could land in the next window).
			units = -req.Cost
		}
	}
	if units != 0 {
		c.mu.Lock()
		c.add(now, units, windowOf(&req, now, d))
		c.mu.Unlock()
	}
	return d, nil
}

// resetEverywhere resets an asynchronous key in every region.
func (s *Store) resetEverywhere(ctx context.Context, req sluice.Request) (sluice.Decision, error) {
	if c, ok := s.akeys.Load(req.Key); ok {
		c.mu.Lock()
		clear(c.pending)
		clear(c.oldest)
		c.mu.Unlock()
	}
	d, err := s.local.Apply(ctx, sluice.OpReset, req)
	if err != nil {
		return d, err
	}
	for _, r := range s.remotes {
		if _, err := s.regions[r].Apply(ctx, sluice.OpReset, req); err != nil {
			return sluice.Decision{}, err
		}
	}
	return d, nil
}

func (s *Store) syncLoop(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.syncRound(context.Background(), false)
		}
	}
}

// Sync delivers to every other region's store the units this instance
// admitted of asynchronous keys since the last round, one OpCharge (or
// OpRefund) per key and region, and waits for them; it forgets keys idle
// for IdleAfter with nothing left to deliver. A delivery that fails is
// retried by the next round; a key whose oldest undelivered count is
// StaleAfter old is answered by the failure policy meanwhile. The
// background loop runs a round every SyncInterval without waiting for
// the last: a far region's deliveries do not hold up a near one's.
func (s *Store) Sync(ctx context.Context) {
	s.syncRound(ctx, true)
}

// syncRound starts a round of deliveries; wait waits for them.
func (s *Store) syncRound(ctx context.Context, wait bool) {
	now := s.clk.Now()
	// A key with nothing left to deliver holds no state worth keeping (a
	// new entry starts from zero counts, as this one is now), so it is
	// forgotten two rounds after its last use rather than after IdleAfter:
	// MaxKeys entries are then a bound on the keys used per two rounds,
	// and one client's flood of new keys frees its entries within 200 ms
	// instead of holding every other client's new keys at the failure
	// policy for a second (TestAsyncKeyFloodForgotten).
	forget := int64(s.idle)
	if s.syncEvery > 0 {
		forget = min(forget, int64(2*s.syncEvery))
	}
	type job struct {
		c     *counts
		req   sluice.Request
		units int64
		id    uint64
		win   int64
	}
	var jobs [][]job
	s.akeys.Range(func(key string, c *counts) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.req.Algorithm == sluice.FixedWindow && c.win != 0 {
			// A window that ended takes no more counts: they would land
			// in the next window elsewhere.
			if now > c.win*int64(c.req.Limit.Period)+s.skew {
				clear(c.pending)
				clear(c.oldest)
			}
		}
		empty := true
		for i := range s.remotes {
			if c.pending[i] == 0 {
				c.oldest[i] = 0
				continue
			}
			empty = false
			if len(c.flying[i]) >= maxFlying {
				// The link is slow: the counts wait, and age.
				continue
			}
			if jobs == nil {
				jobs = make([][]job, len(s.remotes))
			}
			c.nextID++
			if c.flying[i] == nil {
				c.flying[i] = map[uint64]int64{}
			}
			c.flying[i][c.nextID] = c.oldest[i]
			jobs[i] = append(jobs[i], job{c: c, req: c.req, units: c.pending[i], id: c.nextID, win: c.win})
			c.pending[i], c.oldest[i] = 0, 0
		}
		// A key with its epoch check in flight is forgotten too (the
		// check then remembers its id when it ends, checkAsyncEpoch):
		// waiting for it kept a flood's keys in the table a round more.
		if empty && now-c.lastUse > forget && !c.busy() && !c.epochOwed {
			if _, ok := s.akeys.LoadAndDelete(key); ok {
				s.size.Add(-1)
				c.forgotten = true
				s.rememberAsyncEpoch(c)
			}
		}
		return true
	})
	s.pruneAsyncSeen(now)
	var wg sync.WaitGroup
	for i, r := range jobs {
		if len(r) == 0 {
			continue
		}
		st, sem := s.regions[s.remotes[i]], s.sems[i]
		for _, j := range r {
			wg.Add(1)
			s.inflight.Go(func() {
				defer wg.Done()
				sem <- struct{}{}
				ok := s.deliver(ctx, st, j.req, j.units)
				<-sem
				c := j.c
				c.mu.Lock()
				defer c.mu.Unlock()
				since := c.flying[i][j.id]
				delete(c.flying[i], j.id)
				if ok || j.win != c.win {
					// Delivered, or of a window that ended meanwhile.
					return
				}
				// Still undelivered: back with the rest, as old as it was.
				if c.pending[i] == 0 && c.oldest[i] == 0 || since < c.oldest[i] {
					c.oldest[i] = since
				}
				c.pending[i] += j.units
			})
		}
	}
	if wait {
		wg.Wait()
	}
}

// deliver charges (or refunds, for negative units) units of req's key at
// another region's store.
func (s *Store) deliver(ctx context.Context, st sluice.Store, req sluice.Request, units int64) bool {
	// A delivery slower than StaleAfter has put the key under the
	// failure policy already: fail it, and the next round sends its
	// units again (after a partition heals, on a new connection).
	ctx, cancel := context.WithTimeout(sluice.WaitForReply(ctx), min(s.fetchTO, time.Duration(s.staleAfter)))
	defer cancel()
	op := sluice.OpCharge
	if units < 0 {
		op, units = sluice.OpRefund, -units
	}
	req.Cost = units
	req.MaxWait, req.Lease, req.UseLease = 0, "", false
	if _, err := st.Apply(ctx, op, req); err != nil {
		s.st.syncErrors.Add(1)
		return false
	}
	s.st.synced.Add(uint64(math.Abs(float64(units))))
	return true
}
