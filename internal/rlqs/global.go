package rlqs

// Global limits across regions (scope: global)
//
// A global policy's bucket is one limit for the Envoys of every region
// together. It is the quota service's own escrow one tier up: each
// instance holds a *region lease* of part of the bucket's capacity C at
// the home region's store (a concurrency lease, OpTake, renewed in the
// background for leaseTTL), and its streams divide only what it holds,
// exactly as a single region's streams divide C:
//
//   - the lease is sized by the instance's demand (its streams' demand key,
//     this instance's own) against the world's: each instance also sets its
//     demand as its lease in a second concurrency key at the home, whose
//     slots used are the demand of every region; it asks
//     C × its demand / the world's when the world wants more than C, its
//     demand and half again when not (shareOf, as a stream does);
//   - the streams take their leases from a local capacity (cap) that is
//     never more than the lease held at home: cap grows only after the home
//     granted, and shrinks *before* the lease does. A shrink lowers cap
//     with the bucket's gate held for writing, so that once it is released
//     no take with the old cap is in flight; then it reads what the streams
//     hold (OpPeek) and asks the home for no less. The lease at home is thus
//     at least what the instance's streams hold, at every instant, and the
//     leases at home sum to at most C: every region's Envoys together
//     spend at most C per fill, as one region's do;
//   - a lease ends at home leaseTTL after the home took it, by the home's
//     clock; the instance counts it from *before* it sent the renewal
//     (region/'s share expiry, docs/regions.md), so its estimate is never
//     late, and never assigns tokens that could outlive it: an assignment's
//     TTL is cut to the whole seconds left before the lease ends less a
//     delivery margin, and a bucket with less than a second left is denied
//     (fail_closed). A region cut off from the home thus spends what it
//     holds, shrinking, then stops; after the heal its next renewal takes
//     its part again.
//
// Renewals run in the background (every half report interval, and at
// once when a report wants more than the instance holds), those due
// together in one call per home and domain of up to renewBatch buckets:
// a report never waits for a call across regions, but a bucket's first report waits for
// its first renewal, bounded by the report's store time (half an
// interval). The leases are per instance, not per region: two instances
// of a region would otherwise have to agree on what the region holds
// before either could shrink.
//
// One client cannot delay another's renewals (schedule, dispatch): the
// renewer walks its own list of buckets, not under the mutex reports take
// to find theirs; it queues the renewals due by the client (address) that
// reported each bucket last, each queue in the order of its leases' ends
// (a new bucket first), and deals batches one client at a time, from a
// client that moves at each walk. A quarter of the places in flight is
// kept for clients with none in flight, so a flood's calls, however
// many, leave the next place to another client's renewal; and a server
// sends at most renewalsPerTick batches a tick (2560 calls a second to
// its homes), and a bucket at most one renewal per interval/8. A flood of
// buckets beyond what the homes' round trips carry thus ages the flood's
// own leases (its Envoys then get DENY_ALL), not the others'.

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice"
)

// Global connects a Server to the other regions, for the policies with
// scope global.
type Global struct {
	// Region is this instance's region; required.
	Region string
	// StoreOf returns a region's store as this instance reaches it (its
	// own region's, and the others' across regions: region.Store.StoreOf),
	// or nil for a region it does not know; required.
	StoreOf func(region string) sluice.Store
	// HomeOf is the home region of a global bucket whose policy names
	// none, by its key (region.Store.HomeOf: a hash over the regions);
	// required.
	HomeOf func(key string) string
	// FailOpen keeps assigning what an instance last held while its lease
	// cannot be renewed, beyond the lease's end: availability over the
	// bound (store.global.failure_policy: fail_open). False (fail_closed)
	// stops assigning before the lease ends.
	FailOpen bool
}

// homeSlack is what a region lease outlives the longest assignment
// given under it by, beyond two report intervals: the renewal's round trip
// to the farthest home (300 ms here) and the scheduling of a loaded host.
const homeSlack = 500 * time.Millisecond

// maxRenewals bounds the batch renewals of one server in flight at once.
const maxRenewals = 64

// leaseTTL is how long a region lease lives at the home from a renewal:
// the assignments' TTL, two report intervals (a renewal every half
// interval: three chances to renew before an assignment must be cut),
// and homeSlack.
func (c *compiled) leaseTTL() time.Duration { return c.ttl + 2*c.interval + homeSlack }

// margin is what an assignment's end is kept before the lease's, for the
// answer's way to the Envoy, whose TTL starts when it arrives.
func (c *compiled) margin() time.Duration { return max(50*time.Millisecond, c.interval/4) }

// globals are a Server's region leases, one per global bucket key.
type globals struct {
	s    *Server
	opt  Global
	mu   sync.Mutex
	byKy map[string]*globalBucket
	// fresh are the buckets created since the renewer last took them,
	// under mu: a report adds one in O(1), and the renewer walks its own
	// list (all) without mu.
	fresh []*globalBucket
	gen   uint64 // lessee generations, under mu
	// switchMu is held by the one shrink of a cap at a time: with a
	// single writer, reports holding several buckets' gates for reading
	// cannot deadlock with it.
	switchMu sync.Mutex
	kick     chan struct{}
	// sem holds the batch renewals in flight, and reserve those sent
	// for a client with no other in flight when sem is full; flying
	// counts each client's in flight, under flyMu.
	sem, reserve chan struct{}
	flyMu        sync.Mutex
	flying       map[string]int
	stopped      chan struct{} // closed when run returns

	// The renewer's own (run's goroutine, or a test's with run stopped).
	all    []*globalBucket  // every bucket of byKy, and those forgotten not yet seen
	turn   int              // the peer whose batch comes first this round
	budget float64          // batches that may be sent now (renewalsPerTick a tick)
	last   int64            // clock ns of the last schedule
	swept  int64            // clock ns of the last walk over all
	queues map[string][]due // the renewals due by client, kept between walks
}

// globalBucket is one global bucket key's lease at its home, on one
// instance.
type globalBucket struct {
	homeKey  string // the bucket's key at the home (its demand key: + demandSuffix)
	home     sluice.Store
	region   string       // the home's name
	lessee   string       // the lease id at the home: region, instance and generation
	capacity atomic.Int64 // C, tokens per fill (a reload may change it)
	local    string       // the key the instance's streams take from
	domain   string       // labels
	policy   string
	key      string // its key in globals.byKy

	// gate is held for reading by a report's take while it uses cap, and
	// for writing by a shrink of cap.
	gate    sync.RWMutex
	cap     atomic.Int64 // what the streams divide: at most the lease at home
	expires atomic.Int64 // clock ns by which the lease at home has not ended; 0 none
	demand  atomic.Int64 // the instance's demand per fill (its streams')
	world   atomic.Int64 // every region's demand, as the last renewal read it
	told    atomic.Int64 // this instance's part of world: the demand that renewal set
	hungry  atomic.Bool  // a report wanted more than cap
	busy    atomic.Bool  // a renewal is in flight
	lastUse atomic.Int64 // clock ns of the last report (written under globals.mu)
	// peer is the client address (Server.peerHost) whose stream reported
	// the bucket last: the renewer shares its calls among them.
	peer  atomic.Pointer[string]
	sent  atomic.Int64 // clock ns of the last renewal sent
	held  atomic.Int64 // the lease at home, as the last renewal left it
	short atomic.Bool  // the last renewal got less than the instance's share: the next comes sooner
	ready chan struct{}
	once  sync.Once
}

func newGlobals(s *Server, opt Global) (*globals, error) {
	if opt.Region == "" || opt.StoreOf == nil || opt.HomeOf == nil {
		return nil, fmt.Errorf("%w: Options.Global needs Region, StoreOf and HomeOf", ErrConfig)
	}
	return &globals{s: s, opt: opt, byKy: map[string]*globalBucket{}, kick: make(chan struct{}, 1),
		sem: make(chan struct{}, maxRenewals-reservedRenewals), reserve: make(chan struct{}, reservedRenewals), flying: map[string]int{}, queues: map[string][]due{}, stopped: make(chan struct{})}, nil
}

// bucket returns the lease of the global bucket whose key at the home is
// homeKey, and whose streams on this instance take from local, creating
// it (and sending its first renewal) when new; peer is the address of the
// client reporting it.
func (g *globals) bucket(homeKey, local string, p *policy, domain, peer string, now int64) (*globalBucket, error) {
	home := p.home
	if home == "" {
		home = g.opt.HomeOf(homeKey)
	}
	// A reload that moves the home starts a new lease there (the old
	// one is released when it goes idle); one that changes the limit
	// reaches the lease at its next renewal.
	k := local + "|" + home
	g.mu.Lock()
	defer g.mu.Unlock()
	if gb := g.byKy[k]; gb != nil {
		gb.lastUse.Store(now)
		gb.capacity.Store(p.capacity)
		if q := gb.peer.Load(); *q != peer {
			h := peer
			gb.peer.Store(&h)
		}
		return gb, nil
	}
	hs := g.opt.StoreOf(home)
	if hs == nil {
		return nil, fmt.Errorf("rlqs: policy %s: home region %q has no store", p.name, home)
	}
	g.gen++
	gb := &globalBucket{homeKey: homeKey, home: hs, region: home, local: local, domain: domain, policy: p.name, key: k,
		lessee: g.opt.Region + "/" + g.s.id + "/" + fmt.Sprint(g.gen), ready: make(chan struct{})}
	gb.lastUse.Store(now)
	h := peer // a copy: peer itself, escaping, would cost every report an allocation
	gb.peer.Store(&h)
	gb.capacity.Store(p.capacity)
	g.byKy[k] = gb
	g.fresh = append(g.fresh, gb)

	gb.hungry.Store(true)
	g.nudge()
	return gb, nil
}

// nudge wakes the renewer.
func (g *globals) nudge() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// ttlAt is the TTL of an assignment given at now under gb's lease: the
// configured one, cut to the whole seconds before the lease ends less the
// margin; under a second, none can be given (0). Fail open: always the
// configured one.
func (g *globals) ttlAt(cfg *compiled, gb *globalBucket, now int64) time.Duration {
	if g.opt.FailOpen && gb.expires.Load() != 0 {
		return cfg.ttl
	}
	left := time.Duration(gb.expires.Load()-now) - cfg.margin()
	return min(cfg.ttl, left.Truncate(time.Second))
}

// run renews the leases until the server drains: each every half
// interval, and at once when a report wants more than its instance holds.
func (g *globals) run() {
	defer close(g.stopped)
	tick := time.NewTicker(renewTick)
	defer tick.Stop()
	var walked time.Time
	for {
		select {
		case <-g.s.done:
			g.releaseAll()
			return
		case <-tick.C:
		case <-g.kick:
			// Reports that want more kick at once, but the walk over every
			// bucket runs at most once per minWalk.
			if d := minWalk - time.Since(walked); d > 0 {
				time.Sleep(d)
			}
		}
		walked = time.Now()
		cfg := g.s.config()
		next := g.schedule(cfg, g.s.clock.Now(), cap(g.sem)-len(g.sem), cap(g.reserve)-len(g.reserve))
		g.budget -= float64(g.dispatch(cfg, next))
	}
}

// dispatch sends the batches in their order, each in a goroutine of its
// own, while there is room in flight, and returns how many it sent.
// Where sem is full, a batch of a client with none in flight takes a
// reserved place: one client's calls in flight, however many, leave
// room for another's first. So it takes reservedRenewals clients, each
// with a renewal in flight, to hold every place a client with none could
// take.
func (g *globals) dispatch(cfg *compiled, due [][]*globalBucket) int {
	sent := 0
	for _, batch := range due {
		peer := *batch[0].peer.Load() // a batch is one client's (schedule)
		var slot chan struct{}
		select {
		case g.sem <- struct{}{}:
			slot = g.sem
		default:
			g.flyMu.Lock()
			idle := g.flying[peer] == 0
			g.flyMu.Unlock()
			if !idle {
				continue // at the bound: a later tick
			}
			select {
			case g.reserve <- struct{}{}:
				slot = g.reserve
			default:
				continue
			}
		}
		sent++
		g.flyMu.Lock()
		g.flying[peer]++
		g.flyMu.Unlock()
		for _, gb := range batch {
			gb.busy.Store(true)
		}
		go func() {
			defer func() {
				g.flyMu.Lock()
				if g.flying[peer]--; g.flying[peer] == 0 {
					delete(g.flying, peer)
				}
				g.flyMu.Unlock()
				<-slot
				for _, gb := range batch {
					gb.busy.Store(false)
				}
			}()
			g.renewAll(cfg, batch)
		}()
	}
	return sent
}

// renewTick is how often the renewer looks for renewals due, and
// minWalk the least time between two looks when reports kick it.
const (
	renewTick = 25 * time.Millisecond
	minWalk   = 5 * time.Millisecond
)

// renewalsPerTick is the most batch renewals one server sends per
// renewTick (and at most maxRenewals in flight): 2560 calls a second to
// the homes at most, 40960 buckets renewed, however many buckets its
// clients hold. reservedRenewals of the places in flight are kept for
// clients with none (dispatch).
const (
	renewalsPerTick  = maxRenewals
	reservedRenewals = maxRenewals / 4
)

// schedule is the renewer's look at now, with room for so many batches
// in sem and in reserve: it forgets the buckets unreported for longer than
// their lease lives (releasing their leases), and returns the batches to
// send now (at most what its budget and the room allow), in order. Those
// due are queued by the client that reported them last, each queue in
// the order of its leases' ends (a bucket never renewed first: it has
// none), and the batches are dealt one per client in turn, from a client
// that moves each time: a client that holds thousands of buckets gets as
// many calls as one that holds one, and a lease close to its end is never
// behind fresh ones of its own client. Beyond the room in sem, only the
// first batch of a client with none in flight is dealt (dispatch sends it
// in a reserved place). It walks the buckets without g.mu, which reports
// take to find theirs; with no room at all, it only looks for idle
// buckets, every half interval.
func (g *globals) schedule(cfg *compiled, now int64, semRoom, resRoom int) [][]*globalBucket {
	g.mu.Lock()
	g.all = append(g.all, g.fresh...)
	clear(g.fresh)
	g.fresh = g.fresh[:0]
	g.mu.Unlock()
	if g.last != 0 {
		g.budget += float64(now-g.last) / float64(renewTick) * renewalsPerTick
	} else {
		g.budget = renewalsPerTick
	}
	g.budget = min(g.budget, renewalsPerTick)
	g.last = now
	free := min(int(g.budget), semRoom+resRoom)
	if free == 0 && time.Duration(now-g.swept) < cfg.interval/2 {
		return nil
	}
	g.swept = now

	// The queues of the last walk, emptied: their arrays are kept (a
	// flood's are large), a client's dropped once it has none due.
	queues := g.queues
	for p, q := range queues {
		if len(q) == 0 {
			delete(queues, p)
		} else {
			queues[p] = q[:0]
		}
	}
	var idle []*globalBucket
	keep := g.all[:0]
	for _, gb := range g.all {
		if time.Duration(now-gb.lastUse.Load()) > cfg.leaseTTL() {
			// No report for longer than any stream lease and assignment
			// under it lives: nothing is spent from it.
			idle = append(idle, gb)
			continue
		}
		keep = append(keep, gb)
		if free == 0 || gb.busy.Load() {
			continue
		}
		every := cfg.interval / 2
		if gb.short.Load() {
			// Capacity is being freed elsewhere (the others' streams
			// shrink at their reports): ask again soon.
			every = cfg.interval / 8
		}
		sent := gb.sent.Load()
		since := time.Duration(now - sent)
		// A report that wants more asks at once, but a bucket is renewed
		// at most every interval/8 (its first renewal at once): reports
		// that want more at every turn do not make more calls.
		if since >= every || (gb.hungry.Load() && (sent == 0 || since >= cfg.interval/8)) {
			p := *gb.peer.Load()
			queues[p] = append(queues[p], due{gb.expires.Load(), gb})
		}
	}
	clear(g.all[len(keep):])
	g.all = keep
	if len(idle) > 0 {
		g.forget(cfg, idle, now)
	}
	peers := make([]string, 0, len(queues))
	for p, q := range queues {
		if len(q) > 0 {
			peers = append(peers, p)
		}
	}
	if free == 0 || len(peers) == 0 {
		return nil
	}
	slices.Sort(peers)
	g.flyMu.Lock()
	busy := make([]bool, len(peers))
	for i, p := range peers {
		busy[i] = g.flying[p] > 0
	}
	g.flyMu.Unlock()
	dealt := make([][][]*globalBucket, len(peers))
	for i, p := range peers {
		// At most what could be sent now, in batches of its earliest.
		q := earliest(queues[p], free*renewBatch)
		gbs := make([]*globalBucket, len(q))
		for k := range q {
			gbs[k] = q[k].gb
		}
		dealt[i] = batches(gbs)
	}
	var out [][]*globalBucket
	for round := 0; len(out) < free; round++ {
		more := false
		for k := range peers {
			i := (g.turn + k) % len(peers)
			if round >= len(dealt[i]) || len(out) == free {
				continue
			}
			more = true
			if len(out) >= semRoom && (round > 0 || busy[i]) {
				continue // only a reserved place is left, and not for this client
			}
			out = append(out, dealt[i][round])
		}
		if !more {
			break
		}
	}
	g.turn++
	return out
}

// due is a renewal due: its bucket, and when its lease ends (0: it holds
// none yet), read once.
type due struct {
	end int64
	gb  *globalBucket
}

// earliest returns the k renewals of q whose leases end first, in that
// order (all of q when it has fewer): a selection of the k (Hoare's, on
// average linear in len(q)), then a sort of those, so that a client's
// thousands of renewals due cost the renewer no sort of them all.
func earliest(q []due, k int) []due {
	if k < len(q) {
		lo, hi, nth := 0, len(q)-1, k-1
		for lo < hi {
			pivot := q[lo+(hi-lo)/2].end
			i, j := lo, hi
			for i <= j {
				for q[i].end < pivot {
					i++
				}
				for q[j].end > pivot {
					j--
				}
				if i <= j {
					q[i], q[j] = q[j], q[i]
					i++
					j--
				}
			}
			switch {
			case nth <= j:
				hi = j
			case nth >= i:
				lo = i
			default:
				lo = hi // between j and i: equal to the pivot, in place
			}
		}
		q = q[:k]
	}
	slices.SortFunc(q, func(a, b due) int { return cmp.Compare(a.end, b.end) })
	return q
}

// forget drops the idle buckets from byKy (unless a report took one
// again meanwhile) and releases their leases at their homes.
func (g *globals) forget(cfg *compiled, idle []*globalBucket, now int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, gb := range idle {
		if time.Duration(now-gb.lastUse.Load()) <= cfg.leaseTTL() {
			g.all = append(g.all, gb) // reported again while the renewer looked
			continue
		}
		if g.byKy[gb.key] == gb {
			delete(g.byKy, gb.key)
		}
		gb.once.Do(func() { close(gb.ready) })
		if !gb.busy.Swap(true) {
			go g.release(gb, cfg)
		}
	}
}

// renewBatch is the most buckets renewed in one call to their home, as
// a report's buckets are taken in chunks (chunkBuckets): one script of a
// bounded size on each Redis.
const renewBatch = chunkBuckets

// batches groups due renewals by home and domain (one call takes keys of
// one hash tag at one store), at most renewBatch a group.
func batches(due []*globalBucket) [][]*globalBucket {
	type at struct{ home, domain string }
	var out [][]*globalBucket
	open := map[at]int{} // the group being filled, by home and domain
	for _, gb := range due {
		k := at{gb.region, gb.domain}
		i, ok := open[k]
		if !ok || len(out[i]) == renewBatch {
			i = len(out)
			open[k] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], gb)
	}
	return out
}

// release gives a forgotten lease back at its home (best effort: it ends
// at its TTL anyway).
func (g *globals) release(gb *globalBucket, cfg *compiled) {
	ctx, cancel := context.WithTimeout(context.Background(), max(time.Second, cfg.interval))
	defer cancel()
	for _, r := range gb.homeReqs(cfg, 1, 1) {
		_, _ = gb.home.Apply(ctx, sluice.OpRefund, r) // a concurrency refund releases the lease
	}
}

// releaseAll gives back every lease, as the server drains.
func (g *globals) releaseAll() {
	cfg := g.s.cfg.Load()
	g.mu.Lock()
	all := make([]*globalBucket, 0, len(g.byKy))
	for k, gb := range g.byKy {
		delete(g.byKy, k)
		all = append(all, gb)
	}
	g.mu.Unlock()
	var wg sync.WaitGroup
	for _, gb := range all {
		wg.Go(func() {
			for gb.busy.Swap(true) {
				time.Sleep(5 * time.Millisecond) // a renewal in flight ends within its timeout
			}
			g.release(gb, cfg)
		})
	}
	wg.Wait()
}

// homeReqs are a renewal's takes at the home: the instance's demand, then
// its lease of the capacity.
func (gb *globalBucket) homeReqs(cfg *compiled, demand, want int64) []sluice.Request {
	l := cfg.leaseTTL()
	return []sluice.Request{
		{Key: gb.homeKey + demandSuffix, Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: demandRate, Period: l}, Cost: demand, Lease: gb.lessee},
		{Key: gb.homeKey, Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: gb.capacity.Load(), Period: l}, Cost: want, Lease: gb.lessee},
	}
}

// renew sizes gb's lease at its home by the instance's demand.
func (g *globals) renew(cfg *compiled, gb *globalBucket) { g.renewAll(cfg, []*globalBucket{gb}) }

// renewing is one bucket's part of a batch renewal.
type renewing struct {
	gb                  *globalBucket
	demand, target, use int64
}

// renewAll sizes the leases of gbs, buckets of one domain (their keys'
// hash tag) at one home, at most renewBatch of them: a shrink of each
// local capacity first, then one peek of what their streams hold on this
// region's store, one call of their takes at the home (and one more for
// those whose share grew with the world's demand), then a growth of each
// local capacity to what the home granted.
func (g *globals) renewAll(cfg *compiled, gbs []*globalBucket) {
	defer func() {
		for _, gb := range gbs {
			gb.once.Do(func() { close(gb.ready) })
		}
	}()
	rs := make([]renewing, len(gbs))
	peek := make([]sluice.Request, len(gbs))
	for i, gb := range gbs {
		gb.hungry.Store(false)
		demand := gb.demand.Load()
		// The world's demand with this instance's own part as it is now
		// (as a stream counts the fleet's): only the others' moves lag.
		target := shareOf(gb.capacity.Load(), demand, max(demand, gb.world.Load()-gb.told.Load()+demand), gb.held.Load())
		if target < gb.cap.Load() {
			g.setCap(gb, target)
		}
		// Unless the peek answers: what the lease holds (never less).
		rs[i] = renewing{gb: gb, demand: demand, target: target, use: max(gb.cap.Load(), gb.held.Load())}
		peek[i] = sluice.Request{Key: gb.local, Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: demandRate, Period: cfg.leaseTTL()}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(time.Second, cfg.interval))
	defer cancel()
	// What the streams hold now: no take with a larger cap is in flight.
	if ds, err := g.s.store.ApplyAll(ctx, sluice.OpPeek, peek); err == nil {
		for i := range rs {
			if !ds[i].Degraded {
				rs[i].use = demandRate - ds[i].Remaining
			}
		}
	}
	reqs := make([]sluice.Request, 0, 2*len(rs))
	for _, r := range rs {
		reqs = append(reqs, r.gb.homeReqs(cfg, max(1, r.demand), max(r.target, r.use, r.gb.cap.Load()))...)
	}
	t0 := g.s.clock.Now()
	for _, r := range rs {
		r.gb.sent.Store(t0)
	}
	home := gbs[0].home
	ds, err := home.ApplyAll(ctx, sluice.OpTake, reqs)

	for i := 0; err == nil && i < len(ds); i++ {
		if ds[i].Degraded {
			err = ErrDegraded
		}
	}
	if err != nil {
		for _, r := range rs {
			g.s.m.leases.WithLabelValues(r.gb.domain, r.gb.policy, "error").Inc()
		}
		g.s.warn.log("region_lease", "rlqs: region leases could not be renewed at their home; their assignments end with them", "domain", gbs[0].domain, "buckets", len(gbs), "err", err.Error())
		return
	}
	// Where the world's demand moved since the last renewal, and now
	// gives a larger share while capacity is free, the larger share is
	// the target: the bucket is short, and its next renewal goes at once
	// (interval/8 after this one was sent). Not a second call now: every
	// call renews the lease, and one that waits behind a busy home (its
	// calls in flight go in at most two groups at a time, redisstore's
	// commit lanes: up to two round trips each) must not make the next
	// renewal wait for two.
	for i, r := range rs {
		world, got := demandRate-ds[2*i].Remaining, ds[2*i+1].Taken
		if more := shareOf(r.gb.capacity.Load(), r.demand, max(r.demand, world), got); more > got && ds[2*i+1].Remaining > 0 {
			rs[i].target = max(r.target, more)
		}
	}
	for i, r := range rs {
		gb, got := r.gb, ds[2*i+1].Taken
		g.s.m.leases.WithLabelValues(gb.domain, gb.policy, "ok").Inc()
		gb.world.Store(demandRate - ds[2*i].Remaining)
		gb.told.Store(max(1, r.demand))
		gb.held.Store(got)
		gb.short.Store(got < r.target)
		// The cap first: a lease that had ended at the home (others took
		// its part) may come back smaller than the cap, and no take may
		// use the larger one under the new expiry.
		g.setCap(gb, min(got, r.target))
		gb.expires.Store(t0 + int64(cfg.leaseTTL()))
	}
}

// wantsMore reports whether an instance whose demand is now demand
// would hold more than stickiness over what it does: its next renewal
// is then sent at once, not at its turn.
func (gb *globalBucket) wantsMore(demand int64) bool {
	c := gb.cap.Load()
	return float64(shareOf(gb.capacity.Load(), demand, max(demand, gb.world.Load()-gb.told.Load()+demand), 0)) > float64(c)*(1+stickiness)
}

// setCap sets the capacity gb's streams divide; a decrease waits for the
// takes using the larger one.
func (g *globals) setCap(gb *globalBucket, v int64) {
	if v >= gb.cap.Load() {
		gb.cap.Store(v)
		return
	}
	g.switchMu.Lock()
	gb.gate.Lock()
	gb.cap.Store(v)
	gb.gate.Unlock()
	g.switchMu.Unlock()
}

// usable reports whether a stream of gb may be given tokens at now: not
// when the lease cannot cover an assignment of a whole second.
func (g *globals) usable(cfg *compiled, gb *globalBucket, now int64) bool {
	return g.ttlAt(cfg, gb, now) >= time.Second
}
