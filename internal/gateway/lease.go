package gateway

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/lease"
)

// maxAsyncReservations bounds the reservations in flight in the
// background: past it, a request waits for its reservation in its batch,
// so that a Redis slower than the request rate pushes back on clients
// instead of piling up calls that time out.
const maxAsyncReservations = 64

// applyLeased is admit's one all-or-nothing ApplyAll of c.reqs when no
// queue is configured (applyAdmit). For a leased tier without a
// concurrency limit it leaves the reservation member out of it and takes it
// in the background once the limits admitted: that member has no limit of
// its own (it never denies) and only marks the request so that one
// settlement refunds it. The limits are then decided from leases with no
// Redis round trip on the client's path. settle waits for the reservation
// first; one that failed leaves the refund batch unapplied (the store
// applies it only while the reservation is held), so a failure keeps the
// reservation charged, never refunds it twice. Past maxAsyncReservations
// in flight, the reservation stays in the batch.
func (g *Gateway) applyLeased(ctx context.Context, c *call) ([]sluice.Decision, error) {
	res := -1
	if c.client.tier.lease && g.asyncResv.Load() < maxAsyncReservations {
		for i, s := range c.specs {
			if s.kind == kindReservation {
				res = i
			}
		}
	}
	if res < 0 {
		return g.store.ApplyAll(ctx, sluice.OpAllow, c.reqs)
	}
	// The other members, in order: a prefix of c.reqs when the
	// reservation is last, as it is unless levels or a session follow
	// (stores do not write into the batch they are given).
	sub := c.reqs[:res:res]
	if res < len(c.reqs)-1 {
		sub = make([]sluice.Request, 0, len(c.reqs)-1)
		sub = append(append(sub, c.reqs[:res]...), c.reqs[res+1:]...)
	}
	var ds []sluice.Decision
	if len(sub) > 0 {
		var err error
		if ds, err = g.store.ApplyAll(ctx, sluice.OpAllow, sub); err != nil {
			return nil, err
		}
	}
	resv := &c.reqs[res]
	out := c.dsBuf[:0] // the call's own room (callpool.go)
	if len(c.reqs) > len(c.dsBuf) {
		out = make([]sluice.Decision, 0, len(c.reqs))
	}
	out = append(append(append(out, ds[:res]...), sluice.Decision{Allowed: true, Limit: resv.Limit, Remaining: resv.Limit.Rate}), ds[res:]...)
	if !sluice.Combine(out).Allowed {
		return out, nil
	}
	if pr, ok := g.takeReservation(c.client, resv); ok {
		// Held already: no store call for it.
		resv.Key, resv.Lease = pr.key, pr.id
		c.pooledResv, c.pooledAt = true, pr.at
		return out, nil
	}
	req := *resv
	done := make(chan struct{})
	c.reserving = done
	g.pending.Add(1)
	g.asyncResv.Add(1)
	go func() {
		defer g.pending.Done()
		defer close(done)
		defer g.asyncResv.Add(-1)
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.Store.Timeout)
		defer cancel()
		if _, err := g.store.Apply(ctx, sluice.OpAllow, req); err != nil {
			c.resvFailed.Store(true) // the store may still hold ctx, whose values are c's (callpool.go)
			g.log.Warn("gateway: reservation not recorded; the request stays charged as reserved", "request_id", c.id, "err", err)
		}
	}()
	return out, nil
}

// Reservations taken ahead (resvPool). A hot client of a leased tier
// without a concurrency limit would otherwise cost the store two calls per
// request, its reservation and its settlement; taken in batches, the
// reservations cost one call per batch, and its settlement is then the
// request's one store call.
const (
	// resvBatchMax bounds the reservations taken in one call (one
	// script); a batch of more (up to resvFillMax, after the pool ran
	// dry) is taken in calls of resvBatchMax at once (takeAhead).
	resvBatchMax = 64
	resvFillMax  = 2 * resvBatchMax
	// resvMaxAge bounds how old (and resvAgeFraction of LeaseTTL, if that
	// is less) a pooled reservation may be when a request takes it, so
	// that it outlives the request about as long as one taken at its
	// admission: its lease lapses LeaseTTL after it was taken.
	resvMaxAge      = 5 * time.Second
	resvAgeFraction = 100
	// A client's pool covers what its requests take over resvCoverRTTs
	// of its batches' round trips (from a batch's start to its
	// reservations pooled, at least resvMinRTT), and holds at most
	// resvPoolMax (capacity): the most reservations, and Redis keys, a
	// client can make the gateway hold ahead. The margin is for
	// settlements that lag their requests: a reservation comes back to
	// the pool only once its request is settled. In
	// BenchmarkServeHTTPLeased (2-core machine, loaded) a batch's round
	// trip took 7-20 ms, settlements lagged a client's requests by up to
	// 800, and a client at 35-50k requests/s held 500-700 on average; a
	// client sending one request at a time holds about 4
	// (TestResvPoolBound).
	resvCoverRTTs = 8
	resvMinRTT    = time.Millisecond
	resvPoolMax   = 16 * resvBatchMax
	// resvRateWindow is how long a client's requests since its pool's
	// last batch are counted before they say its rate (else the rate
	// measured over the batch before is used).
	resvRateWindow = 100 * time.Millisecond
)

// resvPool is a client's reservations taken ahead: leases under ids of
// their own, each on a key of its own (pooledKey), taken in one ApplyAll and
// handed to requests oldest first. A request that finds none fresh
// takes its own in the background, as without the pool. A request
// settled wholly into the leases gives its reservation back to the pool
// (recycleReservation): the store never saw its id used, so the next
// request may hold it, until it is resvAge old. Reservations that aged
// in the pool are released with the settled ones (flushSettled); they
// would otherwise lapse after LeaseTTL: they have no limit of their own,
// so they hold nothing anyone else could use.
//
// The bound: the pool holds at most its capacity (at most resvPoolMax);
// a reservation given back or taken past it is released with the settled
// ones. Besides the pool, a client holds in the store one reservation per
// request admitted and not yet settled, fewer than resvBatchMax settled
// ones waiting for their batched release, and those being released; and
// a client gone quiet holds none 2*resvAge after its last request (the
// sweep, sweepReservations), not until its next request or LeaseTTL.
type resvPool struct {
	mu      sync.Mutex
	ids     []pooledResv // oldest first; a view of buf (see push, popFront, insert)
	buf     []pooledResv // ids' array, whole: ids is buf[head:head+len(ids)]
	head    int          // room before ids in buf, left by the reservations taken
	filling bool
	fillAt  time.Time // when the last batch was started
	batch   int       // the last batch's size
	// settled are the reservations of requests settled wholly into the
	// leases, still held in the store, to release in one call
	// (flushSettled).
	settled []sluice.Request
	last    time.Time     // the client's last request on this path
	rtt     time.Duration // a batch's time from its start to its reservations pooled, smoothed
	takes   int           // requests that asked for one since fillAt, given back or not
	asked   int           // takes less the reservations given back since fillAt
	dry     bool          // a request found the pool empty since the last batch started
	rate    float64       // requests per second between batches, smoothed
	sweep   *time.Timer   // releases the pool of a client gone quiet (sweepReservations)
	// misses counts the requests that found no fresh reservation (and
	// took their own), taken the reservations taken in batches: what
	// BenchmarkServeHTTPLeased reports of the pool.
	misses, taken int
}

// pooledKey is the store key of the pooled reservation id of the
// reservation key key: a key of its own, since the store reads and
// rewrites a concurrency key's every lease on each call, and a pool holds
// up to resvPoolMax of them.
func pooledKey(key, id string) string { return key + ":" + id }

// The pool's order. Requests take reservations from the front (the
// oldest), batches are added at the back, and a reservation given back
// (recycleReservation) goes in by its age, near the front: it was taken
// from there a request ago. With ids a plain slice, each of those was an
// insertion that moved the whole pool (in BenchmarkServeHTTPLeased, 474
// reservations on average),
// through the GC's write barriers (slices.Insert: 5% of
// BenchmarkServeHTTPLeased's CPU), and a new array whenever the front's
// room was gone. ids is kept in buf with the room the takes left before
// it, so that an insertion moves only the reservations on its shorter
// side.

// capacity is the most reservations the pool holds at now: what its
// client's requests take over resvCoverRTTs of its batches' round trips,
// at least two batches, at most resvPoolMax. A reservation given back or
// taken past it is released (flushSettled).
func (p *resvPool) capacity(now time.Time) int {
	rate := p.rate
	if el := now.Sub(p.fillAt); el >= resvRateWindow {
		rate = float64(p.takes) / el.Seconds()
	}
	need := rate * (resvCoverRTTs * max(p.rtt, resvMinRTT)).Seconds()
	return int(min(max(need+1, float64(2*max(p.batch, 2))), resvPoolMax))
}

// smooth is a measure's estimate after the measure m: m when it is more
// than the estimate e (a pool takes a client's burst, or a slow round
// trip, into account at once), else an eighth of the way down to it (a
// pool shrinks over several batches, not after one quiet interval).
func smooth(e, m float64) float64 {
	if m >= e {
		return m
	}
	return e + (m-e)/8
}

// popFront takes the oldest reservation out of the pool; ids is not
// empty.
func (p *resvPool) popFront() pooledResv {
	r := p.ids[0]
	p.ids[0] = pooledResv{} // its strings are not kept by buf
	p.ids = p.ids[1:]
	p.head++
	if len(p.ids) == 0 {
		p.ids, p.head = p.buf[:0], 0
	}
	return r
}

// push adds r at the back of the pool.
func (p *resvPool) push(r pooledResv) {
	n := len(p.ids)
	if p.head+n == len(p.buf) {
		// No room after ids: move it to the front of buf, or of a
		// larger array when that is more than half full.
		buf := p.buf
		if 2*n >= len(buf) {
			buf = make([]pooledResv, max(2*len(buf), 8))
		}
		copy(buf, p.ids)
		clear(buf[n:max(n, p.head+n)])
		p.buf, p.head = buf, 0
	}
	p.ids = p.buf[p.head : p.head+n+1]
	p.ids[n] = r
}

// insert puts r at index i of the pool (0 <= i <= len(ids)), moving the
// fewer of the reservations before it (into the room in front) and after
// it (into the room behind, made if there is none).
func (p *resvPool) insert(i int, r pooledResv) {
	n := len(p.ids)
	if p.head > 0 && (i <= n-i || p.head+n == len(p.buf)) {
		p.head--
		p.ids = p.buf[p.head : p.head+n+1]
		copy(p.ids[:i], p.ids[1:i+1])
		p.ids[i] = r
		return
	}
	p.push(r)
	copy(p.ids[i+1:], p.ids[i:n])
	p.ids[i] = r
}

// pooledResv is one reservation taken ahead: its lease id and key, and when it
// was asked for (before the call, so it is no older than that).
type pooledResv struct {
	id  string
	key string // pooledKey of id, made once when it was taken
	at  time.Time
}

// resvAge is how old a pooled reservation may be when a request takes it.
func (g *Gateway) resvAge() time.Duration {
	return min(resvMaxAge, g.cfg.LeaseTTL/resvAgeFraction)
}

// takeReservation hands c's request a reservation taken ahead, if one is
// fresh (the oldest), and starts taking the next batch in the background when the
// pool is down to half of what the client asks for in half a resvAge. A
// client that sends a second request within resvAge starts its pool; a
// colder one takes its reservations one by one.
func (g *Gateway) takeReservation(cl *client, tmpl *sluice.Request) (pooledResv, bool) {
	p := &cl.resv
	now := g.now()
	maxAge := g.resvAge()
	p.mu.Lock()
	defer p.mu.Unlock()
	hot := !p.last.IsZero() && now.Sub(p.last) < maxAge
	p.last = now
	p.takes++
	p.asked++
	for len(p.ids) > 0 && now.Sub(p.ids[0].at) >= maxAge {
		// Aged out: released with the settled ones.
		r := *tmpl
		r.Key, r.Lease, r.UseLease = p.ids[0].key, p.ids[0].id, false
		p.settled = append(p.settled, r)
		p.popFront()
	}
	g.flushSettled(cl)
	if hot {
		g.armSweep(cl)
	}
	var pr pooledResv
	ok := len(p.ids) > 0
	if ok {
		pr = p.popFront()
	} else {
		p.misses++
		p.dry = true
	}
	if !hot || p.filling {
		return pr, ok
	}
	// The batch covers what the client's requests use up (asked: one
	// given back, recycleReservation, is not) over resvCoverRTTs of its
	// batches' round trips, and the next
	// is taken when the pool is down to one batch, so that a batch's
	// round trip does not leave the pool dry (with half a batch left, 129
	// of 6000 requests found it empty in BenchmarkTailRatio at one
	// connection, then 13). A request that found the pool empty since the
	// last batch allows the next up to resvFillMax: one of resvBatchMax
	// per round trip could not keep up with a client ramping up, or whose
	// settlements lag (BenchmarkServeHTTPLeased: 22.6 requests per 1000
	// without a pooled reservation, 17.2 with; sized by what requests
	// take, given back or not, a client sending one request at a time on
	// a loaded machine took 81 for 200 requests, 12-28 so).
	// After a pause (a client between bursts) the rate since the last
	// batch is low, and a batch sized by it ran dry within a few requests,
	// which then took their own reservations and settled in Redis: the
	// batch falls at most by half per fill (BenchmarkTailRatio at one
	// connection: 273 of 6000 requests without a pooled reservation).
	// Before, a batch covered a third of a resvAge at the client's rate:
	// a full batch for any client of more than a few requests a second,
	// so that each kept two (127 reservations after 32 requests, 8122
	// Redis keys after BenchmarkServeHTTPLeased's warm-up of 64 clients).
	batch := 2
	if el := now.Sub(p.fillAt); !p.fillAt.IsZero() && el > 0 {
		most := resvBatchMax
		if p.dry {
			most = resvFillMax
		}
		cover := resvCoverRTTs * max(p.rtt, resvMinRTT)
		batch = int(min(float64(p.asked)*float64(cover)/float64(el)+1, float64(most)))
		batch = max(batch, 2, min(p.batch/2, resvBatchMax))
	}
	if len(p.ids) <= batch && g.startFill() {
		if el := now.Sub(p.fillAt); !p.fillAt.IsZero() && el > 0 {
			p.rate = smooth(p.rate, float64(p.takes)/el.Seconds())
		}
		p.filling, p.fillAt, p.takes, p.asked, p.batch, p.dry = true, now, 0, 0, batch, false
		go g.fillReservations(cl, *tmpl, batch)
	}
	return pr, ok
}

// releaseReservations gives back the reservations pooled and not used,
// one batch per client, so that a gateway that shuts down leaves none
// behind for lease_ttl. A batch the store refuses (one of its leases
// lapsed) or fails releases nothing; those lapse as they would have.
// Close calls it once no request can take one; it takes at most the
// store's timeout in all.
func (g *Gateway) releaseReservations() {
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.Store.Timeout)
	defer cancel()
	for _, cl := range g.keys {
		cl.resv.mu.Lock()
		if cl.resv.sweep != nil {
			cl.resv.sweep.Stop()
		}
		ids, settled := cl.resv.ids, cl.resv.settled
		cl.resv.ids, cl.resv.buf, cl.resv.head, cl.resv.settled = nil, nil, 0, nil
		cl.resv.mu.Unlock()
		if len(settled) > 0 {
			if _, err := g.store.ApplyAll(ctx, sluice.OpRefund, settled); err != nil {
				g.log.Debug("gateway: settled reservations not released; they lapse", "client", cl.id, "err", err)
			}
		}
		if len(ids) == 0 {
			continue
		}
		tmpl := cl.reservation()
		if tmpl.Algorithm != sluice.Concurrency {
			continue
		}
		reqs := make([]sluice.Request, len(ids))
		for i, p := range ids {
			reqs[i] = tmpl
			reqs[i].Key, reqs[i].Lease = p.key, p.id
		}
		if _, err := g.store.ApplyAll(ctx, sluice.OpRefund, reqs); err != nil {
			g.log.Debug("gateway: pooled reservations not given back; they lapse", "client", cl.id, "err", err)
		}
	}
}

// reservation is the request that takes cl's tier's reservation, without
// its key's lease id, or a zero Request if the tier has none.
func (cl *client) reservation() sluice.Request {
	for i := range cl.tier.specs {
		if s := &cl.tier.specs[i]; s.kind == kindReservation {
			return sluice.Request{Key: cl.specKeys[i], Algorithm: s.alg, Limit: s.limit, Cost: 1}
		}
	}
	return sluice.Request{}
}

// startFill counts a fill as a background reservation (Close waits for
// it), unless the Gateway is closing.
func (g *Gateway) startFill() bool {
	select {
	case <-g.closing:
		return false
	default:
	}
	g.pending.Add(1)
	g.asyncResv.Add(1)
	return true
}

// fillReservations takes n reservations of cl's key in one ApplyAll and
// pools the ones granted (all: the reservation has no limit of its own).
// A failed call pools nothing; requests take their own meanwhile.
func (g *Gateway) fillReservations(cl *client, tmpl sluice.Request, n int) {
	defer g.pending.Done()
	defer g.asyncResv.Add(-1)
	reqs := make([]sluice.Request, n)
	for i := range reqs {
		id := sluice.NewLeaseID()
		reqs[i] = tmpl
		reqs[i].Key, reqs[i].Lease, reqs[i].UseLease = pooledKey(tmpl.Key, id), id, false
	}
	at := g.now() // before the call: the leases are no older than this says
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.Store.Timeout)
	defer cancel()
	ds, err := g.takeAhead(ctx, reqs)
	p := &cl.resv
	p.mu.Lock()
	defer p.mu.Unlock()
	p.filling = false
	if el := g.now().Sub(p.fillAt); el > 0 {
		p.rtt = time.Duration(smooth(float64(p.rtt), float64(el)))
	}
	if err != nil {
		g.log.Debug("gateway: reservations not taken ahead; requests take their own", "client", cl.id, "err", err)
	}
	if len(ds) != len(reqs) {
		return
	}
	p.taken += len(ds)
	capacity := p.capacity(g.now())
	for i, d := range ds {
		if !d.Allowed || d.Degraded {
			continue
		}
		if len(p.ids) >= capacity {
			// Given back meanwhile (recycleReservation): over the
			// bound, released with the settled ones.
			r := tmpl
			r.Key, r.Lease = reqs[i].Key, reqs[i].Lease
			p.settled = append(p.settled, r)
			continue
		}
		p.push(pooledResv{reqs[i].Lease, reqs[i].Key, at})
	}
	g.flushSettled(cl)
	g.armSweep(cl)
}

// takeAhead takes reqs in calls of resvBatchMax at once, so that no one
// script holds Redis for a whole batch of resvFillMax. A call that fails
// leaves its decisions denied: its reservations are not pooled (they
// lapse, as a failed batch's would), the others are.
func (g *Gateway) takeAhead(ctx context.Context, reqs []sluice.Request) ([]sluice.Decision, error) {
	if len(reqs) <= resvBatchMax {
		return g.store.ApplyAll(ctx, sluice.OpAllow, reqs)
	}
	ds := make([]sluice.Decision, len(reqs))
	errs := make([]error, (len(reqs)+resvBatchMax-1)/resvBatchMax)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			part := reqs[i*resvBatchMax : min(len(reqs), (i+1)*resvBatchMax)]
			got, err := g.store.ApplyAll(ctx, sluice.OpAllow, part)
			if err == nil && len(got) != len(part) {
				err = fmt.Errorf("gateway: %d decisions for %d reservations", len(got), len(part))
			}
			if errs[i] = err; err == nil {
				copy(ds[i*resvBatchMax:], got)
			}
		}()
	}
	wg.Wait()
	return ds, errors.Join(errs...)
}

// leaseLayer returns the lease.Store among st and the stores it wraps
// (Unwrap), or nil.
func leaseLayer(st sluice.Store) *lease.Store {
	for st != nil {
		if l, ok := st.(*lease.Store); ok {
			return l
		}
		u, ok := st.(interface{ Unwrap() sluice.Store })
		if !ok {
			return nil
		}
		st = u.Unwrap()
	}
	return nil
}

// settleIntoLeases settles the refunds of a request whose reservation was
// taken ahead (c.pooledResv) into the leases its limits were admitted
// from, with no store call (lease.Store.SettleLocal: into the chunk that
// lent the units, while it is live, at most what it lent), and returns
// the refund batch left for the store. The store applies a refund batch
// only while its reservation is held, so that a settlement applies once
// among gateway instances and retries (refundHeld); a pooled
// reservation's id is known to this gateway alone and settle runs once
// per request (settleAsync), so the local part needs no such condition.
// What the leases cannot take (a lapsed chunk, units the store admitted
// directly) goes to the store with the reservation, as before; when
// nothing is left the reservation is released later with others, in one
// call (flushSettled).
func (g *Gateway) settleIntoLeases(c *call, refunds []sluice.Request) []sluice.Request {
	resv := -1
	for i := range refunds {
		if refunds[i].Algorithm == sluice.Concurrency && refunds[i].Lease != "" {
			if resv >= 0 {
				return refunds // a concurrency limit too: its slot is fleet-wide, released in the store with the rest
			}
			resv = i
		}
	}
	if resv < 0 {
		return refunds
	}
	// The others, in order, moved over the reservation in refunds (c.reqs,
	// which nothing reads after settle; SettleLocal returns a batch of its
	// own, or others itself when it took nothing).
	r := refunds[resv]
	others := append(refunds[:resv], refunds[resv+1:]...)
	rest := g.leases.SettleLocal(sluice.OpRefund, others)
	if len(rest) > 0 {
		return append(rest, r)
	}
	g.recycleReservation(c.client, r, c.pooledAt)
	return nil
}

// recycleReservation gives the pooled reservation r, asked for at at, of a
// request settled wholly into the leases back to its client's pool, while
// it is younger than resvAge and the pool is below its capacity, and
// releases it with the settled ones otherwise (flushSettled). Its id was never sent to the store with a
// refund, so it is held there as when it was taken, and no other
// settlement knows it: the next request that holds it settles it exactly
// once, as the first did not. Before, each such reservation was released
// and a new one taken: two of a request's Redis commands each way
// (BenchmarkTailRatio at 64 connections: 16411 HGETALL and DEL, 8192
// HSET and PEXPIRE in 2 s, for about 8000 requests).
func (g *Gateway) recycleReservation(cl *client, r sluice.Request, at time.Time) {
	p := &cl.resv
	p.mu.Lock()
	defer p.mu.Unlock()
	closing := false
	select {
	case <-g.closing:
		closing = true // Close may have released the pool already
	default:
	}
	now := g.now()
	if closing || now.Sub(at) >= g.resvAge() || len(p.ids) >= p.capacity(now) {
		p.settled = append(p.settled, r)
		g.flushSettled(cl)
	} else {
		i, _ := slices.BinarySearchFunc(p.ids, at, func(e pooledResv, t time.Time) int { return e.at.Compare(t) })
		p.insert(i, pooledResv{r.Lease, r.Key, at})
		p.asked = max(p.asked-1, 0)
	}
	if !closing {
		g.armSweep(cl) // its request may have been the client's last
	}
}

// flushSettled releases cl's recorded reservations (resvPool.settled: of
// requests settled wholly into the leases past resvAge, or aged in the
// pool, or past its capacity) in one background call once there are
// resvBatchMax of them (the sweep releases the rest resvAge later,
// sweepReservations, and Close, releaseReservations). Until then each stays
// held in the store, where it holds nothing anyone could use: a
// reservation has no limit. cl.resv.mu is held.
func (g *Gateway) flushSettled(cl *client) { g.releaseSettled(cl, resvBatchMax) }

// releaseSettled is flushSettled once there are at least n to release.
func (g *Gateway) releaseSettled(cl *client, n int) {
	p := &cl.resv
	var batch []sluice.Request
	if len(p.settled) >= n && g.startRelease() {
		batch, p.settled = p.settled, nil
	}
	if batch != nil {
		go func() {
			defer g.pending.Done()
			ctx, cancel := context.WithTimeout(context.Background(), g.cfg.Store.Timeout)
			defer cancel()
			if _, err := g.store.ApplyAll(ctx, sluice.OpRefund, batch); err != nil {
				g.log.Debug("gateway: settled reservations not released; they lapse", "client", cl.id, "err", err)
			}
		}()
	}
}

// sweepReservations releases cl's pooled reservations that aged (all of
// them once the client has sent nothing for resvAge: a batch is taken at
// a request) and the settled ones (flushSettled), however few, so that a
// client gone quiet after a burst leaves nothing held in the store past
// 2*resvAge, instead of until the next request or LeaseTTL. It runs
// resvAge after the pool's first request, then every resvAge while
// anything is held.
func (g *Gateway) sweepReservations(cl *client) {
	p := &cl.resv
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-g.closing:
		p.sweep = nil // Close releases the rest (releaseReservations)
		return
	default:
	}
	maxAge := g.resvAge()
	now := g.now()
	for len(p.ids) > 0 && now.Sub(p.ids[0].at) >= maxAge {
		r := cl.reservation()
		r.Key, r.Lease = p.ids[0].key, p.ids[0].id
		p.settled = append(p.settled, r)
		p.popFront()
	}
	g.releaseSettled(cl, 1)
	if len(p.ids) == 0 && len(p.settled) == 0 {
		p.sweep = nil // the next request arms it again
		return
	}
	if p.sweep == nil {
		g.armSweep(cl)
	} else {
		p.sweep.Reset(maxAge)
	}
}

// armSweep starts cl's sweep (sweepReservations) unless it is armed:
// when a hot client's request may start a batch, and when a reservation
// comes into its pool or its settled ones. cl.resv.mu is held.
func (g *Gateway) armSweep(cl *client) {
	p := &cl.resv
	if p.sweep == nil {
		p.sweep = time.AfterFunc(g.resvAge(), func() { g.sweepReservations(cl) })
	}
}

// startRelease counts a release of settled reservations as pending work
// (Close waits for it), unless the Gateway is closing.
func (g *Gateway) startRelease() bool {
	select {
	case <-g.closing:
		return false
	default:
	}
	g.pending.Add(1)
	return true
}
