package lease

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
)

// entry is one key's lease: the capacity this instance holds and what it
// has learnt about the key. Its fields are guarded by mu.
type entry struct {
	key      string
	algo     sluice.Algorithm
	limit    sluice.Limit
	capacity int64

	mu     sync.Mutex
	gen    uint64 // bumped when held capacity is dropped, so put-backs of older units are not mixed in
	tokens int64  // capacity held: charged in the store, not yet admitted
	expiry int64  // local ns from which tokens must not be used
	// lent is what this generation of the lease admitted (or charged) and
	// was not settled back into it: the most a refund may put back
	// (settle.go). drop zeroes it with the generation.
	lent int64

	fetching bool
	done     chan struct{} // closed when the fetch in flight ends

	starvedUntil int64 // the store had no chunk: deny locally until then
	failedUntil  int64 // the store failed: no fetch until then
	backoff      int64

	storeRemaining int64 // the store's Remaining after the last fetch
	resetAt        int64 // local ns at which the store's ResetAfter of the last fetch ends
	lastUse        int64

	// hits and denials count Apply's decisions from this lease, on the
	// entry's own cache line, which the lock holds already: one counter
	// of the Store that every decision added to was 8% of a leased
	// decision's CPU at 64 callers on 2 cores (BenchmarkLeaseHot's
	// profile), its cache line passed between the cores. retired is set
	// when they moved to the Store's (Store.retire).
	hits, denials uint64
	retired       bool

	rateT0, rateUnits int64
	rate              float64 // units a second this instance is asked for, smoothed
	share             float64 // this instance's part of what the fleet takes, smoothed

	grantAt, grantRemaining, grantWindowEnd int64
	granted                                 bool
	direct                                  int64 // units the store admitted directly since the last grant
}

func (e *entry) window() bool {
	return e.algo == sluice.FixedWindow || e.algo == sluice.SlidingWindowCounter
}

// decisionNow is the time a decision from e's lease is made at, read
// under e.mu: the fast clock for GCRA and the token bucket, which a
// lagging reading only makes stricter but for a chunk spent up to the lag
// past its TTL; the exact clock for windows, whose chunks must not be
// spent past their window's end (the package doc, Clocks).
func (s *Store) decisionNow(e *entry) int64 {
	if e.window() {
		return s.clk.Now()
	}
	return s.fast.Now()
}

// drop empties the lease and returns what it held.
func (e *entry) drop() int64 {
	n := e.tokens
	e.tokens = 0
	e.lent = 0
	e.gen++
	return n
}

// observe counts cost towards the rate, over windows of at least w ns.
func (e *entry) observe(now, cost, w int64) {
	e.rateUnits += cost
	el := now - e.rateT0
	if el < w {
		return
	}
	inst := float64(e.rateUnits) * 1e9 / float64(el)
	switch {
	case el > 8*w && el <= 64*w && e.rate > 0:
		// A pause (a client between bursts): the old rate stands and the
		// measurement restarts at this request, so that the first chunk
		// after it is sized as before it, not from the pause (which would
		// send the burst's first requests to the store, on the client's
		// path, until a window was measured).
		e.rateT0, e.rateUnits = now, cost
		return
	case el > 8*w:
		e.rate = inst // idle for long: the old rate says nothing
	default:
		e.rate = (e.rate + inst) / 2
	}
	e.rateT0, e.rateUnits = now, 0
}

// noteDirect records a decision the store made for e's key without a
// lease: what it has left tells how close the key is to its limit (so a
// key far from it leases with a longer horizon from its first chunk on),
// and what it admitted for this instance is not the others' (learn).
func (e *entry) noteDirect(d sluice.Decision, cost int64) {
	if d.Degraded {
		return
	}
	e.mu.Lock()
	e.storeRemaining = d.Remaining
	if d.Allowed {
		e.direct += cost
	}
	e.mu.Unlock()
}

// allowed is a decision made from the lease after a take.
func (e *entry) allowed(now int64) sluice.Decision {
	return sluice.Decision{
		Allowed:    true,
		Limit:      e.limit,
		Remaining:  min(e.capacity, e.tokens+max(0, e.storeRemaining)),
		ResetAfter: time.Duration(max(0, e.resetAt-now)),
		Source:     sluice.FromLease,
	}
}

// denied is a local denial while the store has no chunk for the key.
func (e *entry) denied(now int64) sluice.Decision {
	retry := time.Duration(max(1, e.starvedUntil-now))
	return sluice.Decision{
		Limit:      e.limit,
		Remaining:  min(e.capacity, e.tokens+max(0, e.storeRemaining)),
		RetryAfter: retry,
		ResetAfter: max(retry, time.Duration(e.resetAt-now)),
		Source:     sluice.FromLease,
	}
}

// learn updates the share from a grant of got units that left the store
// with remaining, sent at sent: what the store refilled since the last
// grant, minus what is left and what this instance took, is what the
// others took.
func (e *entry) learn(sent, got, remaining, windowEnd int64) {
	if e.granted {
		avail := int64(-1)
		switch e.algo {
		case sluice.GCRA, sluice.TokenBucket:
			avail = min(e.capacity, e.grantRemaining+algo.CostsIn(e.limit, max(0, sent-e.grantAt)))
		default:
			if d := windowEnd - e.grantWindowEnd; d > -int64(e.limit.Period)/4 && d < int64(e.limit.Period)/4 {
				avail = e.grantRemaining // the same window
			}
		}
		if avail >= 0 {
			others := max(0, avail-got-remaining-e.direct)
			inst := float64(got) / float64(got+others)
			e.share = min(1, max(1.0/64, (e.share+inst)/2))
		}
	}
	e.granted, e.grantAt, e.grantRemaining, e.grantWindowEnd = true, sent, remaining, windowEnd
	e.direct = 0
}

// count records a decision from e's lease for Stats. e.mu is held.
func (s *Store) count(e *entry, denied bool) {
	if e.retired {
		s.hits.Add(1)
		if denied {
			s.localDenials.Add(1)
		}
		return
	}
	e.hits++
	if denied {
		e.denials++
	}
}

// retire moves e's counts to the Store's when e has left the map. e.mu
// and s.statsMu are held.
func (s *Store) retire(e *entry) {
	s.retiredHits += e.hits
	s.retiredDenials += e.denials
	e.hits, e.denials, e.retired = 0, 0, true
}

// outcome is how take settled a request.
type outcome uint8

const (
	fromLease outcome = iota // admitted from the lease
	denied                   // denied locally: the store has no chunk
	toStore                  // the store must decide
)

// chunkFor is the chunk to fetch for e, or 0 when the key is better asked
// directly: cold, or with a limit too small to lease. e.mu is held.
func (s *Store) chunkFor(e *entry, cost int64) int64 {
	// A small limit is not leased; a small share still takes MinChunk, so
	// that it keeps learning its share from grants.
	top := s.frac * float64(e.capacity)
	bound := max(s.minChunk, int64(top*e.share))
	if top < float64(s.minChunk) || bound < cost {
		return 0
	}
	want := int64(math.Ceil(e.rate * s.horizonFor(e)))
	if want < s.minChunk {
		return 0
	}
	if e.window() {
		// No more than this instance uses before the window ends (by the
		// local clock; windows are aligned to the epoch): the rest would
		// be stranded.
		p := int64(e.limit.Period)
		left := p - s.clk.Now()%p
		want = min(want, int64(math.Ceil(e.rate*float64(left)/1e9)))
	}
	return min(max(want, cost, s.minChunk), bound)
}

// horizonFor is how many seconds of e's rate a chunk covers: Horizon near
// the limit, growing to MaxHorizon with the square of the fraction of the
// capacity the store had left at the last fetch. Far from its limit a key
// thus costs few fetches, and near it little capacity sits in leases.
// e.mu is held.
func (s *Store) horizonFor(e *entry) float64 {
	if s.maxHor <= s.horizon || e.capacity <= 0 {
		return s.horizon
	}
	f := min(1, max(0, float64(e.storeRemaining)/float64(e.capacity)))
	return s.horizon + (s.maxHor-s.horizon)*f*f
}

// lowMark is how much capacity e may hold before the next chunk is
// fetched: half a chunk, or what the key uses in four fetch times if that
// is more, so that a steady caller never waits for a fetch. e.mu is held.
func (s *Store) lowMark(e *entry, chunk int64) int64 {
	lat := float64(s.fetchLat.Load()) / 1e9
	return min(chunk, max(chunk/2, int64(math.Ceil(4*lat*e.rate))))
}

// expiring reports whether e holds GCRA or token-bucket capacity past
// half its TTL, and less than chunk: the next chunk is fetched now, and
// its TTL covers what is held (TTL counts from the last fetch), so that a
// key used in bursts with pauses, whose chunk outlives many of its
// requests, is not found empty by the request after the lapse and sent to
// the store on its path. What is held stays under two chunks. Window
// chunks lapse at their window's end, which a new chunk does not move.
// e.mu is held.
func (s *Store) expiring(e *entry, now, chunk int64) bool {
	return !e.window() && e.tokens < chunk && now >= e.expiry-s.ttl/2
}

// noteFetch folds one fetch's duration into the smoothed fetch latency.
func (s *Store) noteFetch(ns int64) {
	old := s.fetchLat.Load()
	if old == 0 {
		s.fetchLat.Store(ns)
		return
	}
	s.fetchLat.Store(old + (ns-old)/8)
}

// maxAttempts bounds how often take waits for or makes a fetch before it
// lets the store decide: many callers may drain one small chunk at once.
const maxAttempts = 8

// take admits cost from e's lease (waiting for a fetch in flight when the
// lease is short), or reports that the store is out of chunks (a local
// denial) or that the store must decide. When the lease is short and no
// fetch is in flight, it fetches a chunk: in the background, letting the
// store decide this request, when the key is far from its limit
// (farFromLimit); else it waits for the chunk. gen identifies the units
// taken, for putBack. With count, a decision from the lease is counted
// in e's Stats (a batch counts its own).
func (s *Store) take(ctx context.Context, e *entry, cost int64, count bool) (sluice.Decision, uint64, outcome, error) {
	for attempt := 0; ; attempt++ {
		// The clock is read under the lock: a goroutine paused between the
		// two (a stopped or starved process) would otherwise decide on a
		// time long past, after others have seen the lease expire, and
		// spend a chunk charged long ago on top of a refilled limit. Under
		// the lock, decisions are made in the order of their times.
		e.mu.Lock()
		now := s.decisionNow(e)
		if attempt == 0 {
			e.observe(now, cost, s.rateWindow)
			e.lastUse = now
		}
		var expired int64
		if e.tokens > 0 && now >= e.expiry {
			expired = e.drop()
		}
		if e.tokens >= cost {
			e.tokens -= cost
			e.lent += cost
			if count {
				s.count(e, false)
			}
			d, gen := e.allowed(now), e.gen
			var chunk int64
			if !e.fetching && now >= e.starvedUntil && now >= e.failedUntil {
				if c := s.chunkFor(e, 1); c > 0 && (e.tokens < s.lowMark(e, c) || s.expiring(e, now, c)) {
					chunk = c
					e.fetching, e.done = true, make(chan struct{})
				}
			}
			e.mu.Unlock()
			s.returnAsync(e, expired)
			if chunk > 0 && !s.async(func() { s.fetch(e, chunk) }) {
				s.fetchDone(e)
			}
			return d, gen, fromLease, nil
		}
		if now < e.starvedUntil {
			if count {
				s.count(e, true)
			}
			d := e.denied(now)
			e.mu.Unlock()
			s.returnAsync(e, expired)
			return d, 0, denied, nil
		}
		if e.fetching && attempt < maxAttempts {
			ch := e.done
			e.mu.Unlock()
			s.returnAsync(e, expired)
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return sluice.Decision{}, 0, 0, fmt.Errorf("lease: %w", ctx.Err())
			}
		}
		var chunk int64
		if attempt < maxAttempts && now >= e.failedUntil && !e.fetching {
			chunk = s.chunkFor(e, cost)
		}
		if chunk == 0 {
			e.mu.Unlock()
			s.returnAsync(e, expired)
			return sluice.Decision{}, 0, toStore, nil
		}
		e.fetching, e.done = true, make(chan struct{})
		far := s.farFromLimit(e, chunk, cost)
		e.mu.Unlock()
		s.returnAsync(e, expired)
		if far {
			// Far from the limit, the chunk is fetched in the background
			// and the store decides this request meanwhile, in the same
			// round trip as the batch's other members: the request waits
			// for no fetch, and a batch whose leases are all empty costs
			// one round trip, not one per member, after it (the leased
			// gateway's tail at 64 connections, docs/BENCHMARKS.md).
			if !s.async(func() { s.fetch(e, chunk) }) {
				s.fetchDone(e)
			}
			return sluice.Decision{}, 0, toStore, nil
		}
		s.fetch(e, chunk)
	}
}

// farFromLimit reports whether the store had so much of e's key left at
// the last fetch or direct decision that a chunk and cost taken side by
// side, in two calls, cannot deny each other: together at most a
// sixteenth of it, so that what the store had left may be stale by much
// (other instances took it since) and still hold both. Near the limit the
// request waits for the chunk instead, so that the two calls do not race
// for the last units (the direct call denied while the chunk took them,
// or the chunk denied and the key starved for a RetryAfter while the
// store had the cost). With a quarter, TestAccuracyTable's skewed GCRA
// and token-bucket rows lost 0.18 points (0.9982 to 0.9964 of ideal): a
// key offered 3x its limit drains within a few fetches, and the stale
// figure said far. A chunk is at most a tenth of the capacity
// (MaxFraction), so this applies to chunks sized by a rate well under
// the limit, the keys far from it. e.mu is held.
func (s *Store) farFromLimit(e *entry, chunk, cost int64) bool {
	return e.storeRemaining > 0 && chunk+cost <= e.storeRemaining/16
}

// putBack returns units taken by take for a batch the store then denied.
// Units of an older generation (dropped meanwhile) are not put back.
func (s *Store) putBack(e *entry, gen uint64, cost int64) {
	e.mu.Lock()
	if e.gen == gen {
		e.tokens += cost
		e.lent -= cost
	}
	e.mu.Unlock()
}

// fetched is what a fetch's calls to the store got.
type fetched struct {
	req        sluice.Request // Cost is what the last call asked
	d          sluice.Decision
	err        error
	sent, recv int64
}

// fetch asks the store for a chunk of e's key and records the answer.
// e.fetching is set; fetch clears it. The takers waiting for the chunk
// wait at most FetchWait: past it they go on as after a failed fetch (the
// store decides for them), and the chunk is credited when its reply comes.
// The store applies a call it received whether or not its reply comes in
// time, so a fetch that gave up on its reply lost its chunk: charged, and
// never admitted (0.971-0.979 of exact for hot keys on a loaded machine
// that missed many deadlines). The call therefore waits for its reply
// (sluice.WaitForReply) for as long as a chunk could still be spent, TTL.
func (s *Store) fetch(e *entry, chunk int64) {
	res := make(chan fetched, 1)
	if !s.async(func() { res <- s.call(e, chunk) }) {
		res <- s.call(e, chunk) // closing
	}
	t := time.NewTimer(s.fetchWait)
	select {
	case f := <-res:
		t.Stop()
		s.record(e, &f, true)
		return
	case <-t.C:
	}
	s.lateFetches.Add(1)
	e.mu.Lock()
	e.backoff = min(max(2*e.backoff, int64(10*time.Millisecond)), int64(time.Second))
	e.failedUntil = s.clk.Now() + e.backoff
	e.fetching = false
	close(e.done)
	e.done = nil
	e.mu.Unlock()
	if !s.async(func() { f := <-res; s.record(e, &f, false) }) {
		f := <-res
		s.record(e, &f, false)
	}
}

// call makes a fetch's calls to the store: a chunk, and when less than a
// chunk is left, what there is.
func (s *Store) call(e *entry, chunk int64) fetched {
	ctx, cancel := context.WithTimeout(context.Background(), max(s.timeout, time.Duration(s.ttl)))
	defer cancel()
	ctx = sluice.WaitForReply(ctx)
	f := fetched{req: sluice.Request{Key: e.key, Algorithm: e.algo, Limit: e.limit, Cost: chunk}}
	f.sent = s.clk.Now()
	s.fetches.Add(1)
	f.d, f.err = s.inner.Apply(ctx, sluice.OpAllow, f.req)
	if d := f.d; f.err == nil && !d.Allowed && !d.Degraded && d.Remaining >= 1 && (e.window() || float64(d.RetryAfter) > 4*s.horizon*1e9) {
		// Less than a chunk is left, and a whole chunk is far off (or
		// its window ends first): take what there is, so that a key near
		// its limit is not denied while the store could admit. When the
		// chunk comes soon, waiting for it costs one call, not three.
		f.req.Cost = d.Remaining
		f.sent = s.clk.Now()
		s.fetches.Add(1)
		f.d, f.err = s.inner.Apply(ctx, sluice.OpAllow, f.req)
	}
	f.recv = s.clk.Now()
	if f.err == nil && !f.d.Degraded {
		s.noteFetch(f.recv - f.sent)
	}
	return f
}

// record applies what a fetch got to e. owner is false for a reply that
// came after the fetch's takers went on (FetchWait): it only credits a
// granted chunk, and leaves the fetch state to the fetches since.
func (s *Store) record(e *entry, f *fetched, owner bool) {
	req, d, err, sent, recv := &f.req, f.d, f.err, f.sent, f.recv
	var expired int64
	e.mu.Lock()
	switch {
	case err != nil || d.Degraded:
		// Nothing was granted. A charge that Redis applied after the
		// deadline is lost capacity, never admitted capacity.
		s.fetchErrors.Add(1)
		if owner {
			e.backoff = min(max(2*e.backoff, int64(10*time.Millisecond)), int64(time.Second))
			e.failedUntil = recv + e.backoff
		}
	case d.Allowed:
		e.backoff = 0
		if recv >= e.expiry {
			// The lease lapsed: a new generation, so that what the old
			// one lent is not settled into the new one (SettleLocal).
			expired = e.drop()
		}
		// TTL counts from the charge, which Redis made after sent: not from
		// the reply's processing, which a paused or starved process may do
		// an hour later, when the limit has refilled under the chunk.
		exp := sent + s.ttl
		var windowEnd int64
		if e.window() {
			// The window the chunk was charged in ends no earlier than
			// this: Redis read its clock after we sent.
			windowEnd = sent + int64(d.ResetAfter)
			if e.algo == sluice.SlidingWindowCounter {
				windowEnd -= int64(e.limit.Period)
			}
			exp = windowEnd
			if e.tokens > 0 {
				exp = min(exp, e.expiry)
			}
		}
		if recv >= exp {
			// Charged too long ago to be spent now: give it back (a refund
			// is capped at a full limit, so it returns nothing twice).
			expired += req.Cost
		} else {
			e.tokens += req.Cost
			e.expiry = exp
		}
		e.starvedUntil = 0
		e.storeRemaining = d.Remaining
		e.resetAt = sent + int64(d.ResetAfter)
		e.learn(sent, req.Cost, d.Remaining, windowEnd)
		s.fetched.Add(uint64(req.Cost))
	case !owner:
		// A late denial: the fetches since know better.
	default:
		e.starvedUntil = sent + int64(d.RetryAfter)
		if e.algo == sluice.SlidingWindowCounter {
			// Its capacity trickles in as the previous window's weight
			// falls, and what is not taken by the window's end is lost:
			// ask again within a fifth of a Horizon (and a hundredth of
			// the period) for what is left
			// (the instance holding a chunk uses the trickle only as fast
			// as it is asked: left to it, the surplus lapses at the
			// window's end; 98% of ideal waiting a whole Horizon, 99.4%
			// a fifth, in TestAccuracyTable), and just before the
			// window's end, rather than wait for a whole chunk into the
			// next window.
			p := int64(e.limit.Period)
			e.starvedUntil = min(e.starvedUntil, sent+min(int64(s.horizon*1e9)/5, p/100))
			last := sent + p - sent%p - max(2*s.fetchLat.Load(), int64(time.Millisecond))
			if last > sent && last < e.starvedUntil {
				e.starvedUntil = last
			}
		}
		e.storeRemaining = d.Remaining
		e.resetAt = sent + int64(d.ResetAfter)
	}
	if owner {
		e.fetching = false
		close(e.done)
		e.done = nil
	}
	e.mu.Unlock()
	s.returnAsync(e, expired)
}

// fetchDone ends a fetch that could not be started (the Store is closing).
func (s *Store) fetchDone(e *entry) {
	e.mu.Lock()
	e.fetching = false
	close(e.done)
	e.done = nil
	e.mu.Unlock()
}

// returnAsync gives n units of e back in the background.
func (s *Store) returnAsync(e *entry, n int64) {
	if n > 0 && !s.async(func() { s.giveBack(e, n) }) {
		s.giveBack(e, n)
	}
}

// async runs f in a goroutine that Close waits for, unless the Store is
// closing; it reports whether f was started.
func (s *Store) async(f func()) bool {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.isClosed.Load() {
		return false
	}
	s.inflight.Go(f)
	return true
}

// entry returns the lease of req's key, or nil when MaxKeys are tracked.
// A key seen with another algorithm or limit starts a new lease, and the
// old one's capacity goes back.
func (s *Store) entry(req *sluice.Request) *entry {
	if e, ok := s.keys.Load(req.Key); ok && e.algo == req.Algorithm && e.limit == req.Limit {
		return e
	}
	now := s.clk.Now()
	fresh := &entry{key: req.Key, algo: req.Algorithm, limit: req.Limit, capacity: req.Capacity(), share: s.seed, rateT0: now, lastUse: now}
	other := false
	e, _ := s.keys.Compute(req.Key, func(cur *entry, loaded bool) (*entry, xsync.ComputeOp) {
		switch {
		case loaded && cur.algo == req.Algorithm && cur.limit == req.Limit:
			return cur, xsync.CancelOp
		case loaded:
			other = true // replaced below, under statsMu
			return cur, xsync.CancelOp
		case s.size.Load() >= s.maxKeys:
			return nil, xsync.CancelOp
		}
		s.size.Add(1)
		return fresh, xsync.UpdateOp
	})
	if !other {
		return e
	}
	return s.replace(req, fresh)
}

// replace puts fresh in the map in place of a lease of req's key under
// another algorithm or limit, whose capacity goes back, and retires that
// one with its counts, under statsMu as Sweep does, so that Stats sees
// them in one place or the other. It returns the lease now in the map.
func (s *Store) replace(req *sluice.Request, fresh *entry) *entry {
	var old *entry
	var n int64
	s.statsMu.Lock()
	e, _ := s.keys.Compute(req.Key, func(cur *entry, loaded bool) (*entry, xsync.ComputeOp) {
		switch {
		case loaded && cur.algo == req.Algorithm && cur.limit == req.Limit:
			return cur, xsync.CancelOp
		case loaded:
			old = cur
			return fresh, xsync.UpdateOp
		case s.size.Load() >= s.maxKeys:
			return nil, xsync.CancelOp
		}
		s.size.Add(1)
		return fresh, xsync.UpdateOp
	})
	if old != nil {
		old.mu.Lock()
		n = old.drop()
		s.retire(old)
		old.mu.Unlock()
	}
	s.statsMu.Unlock()
	if old != nil {
		s.returnAsync(old, n)
	}
	return e
}

// forget drops key's lease without giving it back, for OpReset.
func (s *Store) forget(key string) {
	if e, ok := s.keys.Load(key); ok {
		e.mu.Lock()
		e.drop()
		e.starvedUntil = 0
		e.mu.Unlock()
	}
}
