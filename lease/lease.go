package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
)

// Defaults for Options.
const (
	DefaultHorizon     = 50 * time.Millisecond
	DefaultMaxHorizon  = time.Second
	DefaultMaxFraction = 0.1
	DefaultMinChunk    = 4
	DefaultTTL         = 3 * time.Second
	DefaultIdleAfter   = 100 * time.Millisecond
	DefaultMaxKeys     = 10_000
	DefaultCallTimeout = time.Second
	DefaultFetchWait   = 50 * time.Millisecond
)

// Options configure a Store. Store is required.
type Options struct {
	// Store is the shared store chunks are taken from, usually a
	// redisstore.Store. Close leaves it open.
	Store sluice.Store
	// Clock is this process's clock: for rates, idleness, expiry and the
	// local times of decisions. Nil means the system clock, read through a
	// clock.Coarse by GCRA and token-bucket decisions from a lease and
	// exactly by everything else (see the package doc, Clocks).
	Clock clock.Clock
	// Horizon is how much of the instance's recent rate on a key one chunk
	// covers when the key is near its limit: DefaultHorizon (50ms) when
	// zero, so a hot key at its limit costs the store about 20 calls a
	// second per instance, and little capacity sits in leases while others
	// want it.
	Horizon time.Duration
	// MaxHorizon is how much of the rate a chunk covers when the store
	// reported the key's capacity full at the last fetch: the horizon
	// grows from Horizon to MaxHorizon with the square of the fraction of
	// the capacity left, so a key far from its limit costs the store a
	// call per MaxHorizon/2 per instance. DefaultMaxHorizon (1s) when
	// zero; at most TTL/2, and never below Horizon.
	MaxHorizon time.Duration
	// MaxFraction bounds a chunk to this fraction of the key's capacity
	// (the burst; Rate for windows), times the instance's share of the key.
	// DefaultMaxFraction (0.1) when zero; at most 0.5.
	MaxFraction float64
	// MinChunk is the smallest chunk worth taking: keys whose chunk would be
	// smaller (cold keys, small limits) go straight to the store.
	// DefaultMinChunk (4) when zero.
	MinChunk int64
	// TTL is how long GCRA and token-bucket capacity may be held after the
	// last fetch was sent (the store charged it after that) before it goes
	// back to the store: a reply read later, by a process that was stopped
	// meanwhile, holds it for less, or not at all. DefaultTTL (3s) when
	// zero.
	TTL time.Duration
	// IdleAfter is how long a key's capacity may sit unused before it goes
	// back when the key is near its limit; it grows as the horizon does, to
	// IdleAfter × MaxHorizon/Horizon when the store had the key's capacity
	// full at the last fetch (a client pausing between bursts keeps its
	// lease). DefaultIdleAfter (100ms) when zero.
	IdleAfter time.Duration
	// SweepEvery is how often a background sweep returns idle and expired
	// capacity and forgets idle keys: IdleAfter/2 when zero; negative runs
	// no sweep (call Sweep yourself, as tests with a fake clock do).
	SweepEvery time.Duration
	// MaxKeys bounds the keys tracked; keys beyond it go straight to the
	// store. DefaultMaxKeys when zero.
	MaxKeys int
	// Instances seeds each key's learnt share of the traffic (1/Instances)
	// until fetches have measured it. Zero means 1.
	Instances int
	// CallTimeout bounds the calls the Store makes on its own (prefetches
	// and refunds); the wrapped store's own deadline applies within it.
	// DefaultCallTimeout when zero. A chunk fetch waits for its reply
	// longer, up to TTL, with sluice.WaitForReply, so that a wrapped
	// store's short deadline does not lose the chunk its call charged.
	CallTimeout time.Duration
	// FetchWait is how long requests wait for a chunk fetch in flight;
	// past it they go on as after a failed fetch (to the wrapped store),
	// and the chunk is credited to the lease when its reply comes.
	// DefaultFetchWait (50ms, the guard's and redisstore's default
	// deadline) when zero.
	FetchWait time.Duration
	// All leases every request of a leased algorithm; otherwise only
	// requests with UseLease set are leased and the others pass through.
	All bool
	// Logger receives failed refunds. Nil means slog.Default(). Keys are
	// never logged.
	Logger *slog.Logger
}

// Store is a sluice.Store that answers hot keys from leased chunks of
// capacity and everything else from the wrapped store. It is safe for
// concurrent use. See the package doc for the model and its bounds.
type Store struct {
	inner sluice.Store
	// clk is the exact clock: fetch times, window chunks, sweeps. fast is
	// what GCRA and token-bucket decisions read under the key's lock: a
	// clock.Coarse on clk when the Store made its clocks, else clk itself
	// (decisionNow; the package doc, Clocks).
	clk, fast clock.Clock
	horizon   float64 // seconds
	maxHor    float64 // seconds
	frac      float64
	minChunk  int64
	ttl       int64
	idle      int64
	maxKeys   int64
	seed      float64
	all       bool
	timeout   time.Duration
	fetchWait time.Duration
	log       *slog.Logger

	keys *xsync.Map[string, *entry]
	size atomic.Int64

	// hits and localDenials count the decisions from leases that no
	// entry counts: a batch's, and those on an entry already retired.
	// Apply's are counted in their entry (Store.count), and an entry's
	// counts move to retiredHits and retiredDenials when it leaves the map
	// (retire), under statsMu, which Stats holds while it reads them all.
	hits, localDenials, fetches, fetched, returns, returned, stranded, direct, fetchErrors, lateFetches, settled atomic.Uint64

	statsMu                     sync.Mutex
	retiredHits, retiredDenials uint64 // under statsMu

	rateWindow int64 // ns over which a key's rate is measured

	fetchLat atomic.Int64 // smoothed ns a fetch takes, for the prefetch mark

	stop     chan struct{}
	stopOnce sync.Once
	bg       sync.WaitGroup // the sweep
	closeMu  sync.RWMutex
	// isClosed is set under closeMu's write lock, so that async, under
	// its read lock, starts nothing Close does not wait for; closed reads
	// it without the lock: an RLock on every decision was an atomic add
	// on one shared word by every caller (BenchmarkLeaseHot).
	isClosed atomic.Bool
	inflight sync.WaitGroup // prefetches and refunds
}

// New validates opts and returns a Store; it starts the background sweep
// unless SweepEvery is negative.
func New(opts Options) (*Store, error) {
	if opts.Store == nil {
		return nil, errors.New("lease: Options.Store is required")
	}
	if opts.Horizon < 0 || opts.MaxHorizon < 0 || opts.MinChunk < 0 || opts.TTL < 0 || opts.IdleAfter < 0 || opts.MaxKeys < 0 || opts.Instances < 0 || opts.CallTimeout < 0 || opts.FetchWait < 0 {
		return nil, errors.New("lease: negative option")
	}
	if opts.MaxFraction < 0 || opts.MaxFraction > 0.5 || math.IsNaN(opts.MaxFraction) {
		return nil, fmt.Errorf("lease: MaxFraction %v must be in (0, 0.5]", opts.MaxFraction)
	}
	s := &Store{
		inner:     opts.Store,
		clk:       opts.Clock,
		horizon:   def(opts.Horizon, DefaultHorizon).Seconds(),
		frac:      opts.MaxFraction,
		minChunk:  opts.MinChunk,
		ttl:       int64(def(opts.TTL, DefaultTTL)),
		idle:      int64(def(opts.IdleAfter, DefaultIdleAfter)),
		maxKeys:   int64(opts.MaxKeys),
		seed:      1 / float64(max(opts.Instances, 1)),
		all:       opts.All,
		timeout:   def(opts.CallTimeout, DefaultCallTimeout),
		fetchWait: def(opts.FetchWait, DefaultFetchWait),
		log:       opts.Logger,
		keys:      xsync.NewMap[string, *entry](),
		stop:      make(chan struct{}),
	}
	if s.clk == nil {
		c := clock.NewCoarse(0)
		s.clk, s.fast = c.Source(), c
	} else {
		s.fast = s.clk
	}
	s.maxHor = min(max(def(opts.MaxHorizon, DefaultMaxHorizon).Seconds(), s.horizon), float64(s.ttl)/2e9)
	s.maxHor = max(s.maxHor, s.horizon)
	s.rateWindow = max(int64(time.Millisecond), int64(s.horizon*1e9)/2)
	if s.frac == 0 {
		s.frac = DefaultMaxFraction
	}
	if s.minChunk == 0 {
		s.minChunk = DefaultMinChunk
	}
	if s.maxKeys == 0 {
		s.maxKeys = DefaultMaxKeys
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if every := opts.SweepEvery; every >= 0 {
		if every == 0 {
			every = time.Duration(s.idle / 2)
		}
		s.bg.Go(func() { s.sweepLoop(every) })
	}
	return s, nil
}

func def(v, d time.Duration) time.Duration {
	if v == 0 {
		return d
	}
	return v
}

// Unwrap returns the wrapped store.
func (s *Store) Unwrap() sluice.Store { return s.inner }

// Leasable reports whether the Store leases algorithm a; the others always
// go to the wrapped store.
func Leasable(a sluice.Algorithm) bool {
	switch a {
	case sluice.GCRA, sluice.TokenBucket, sluice.FixedWindow, sluice.SlidingWindowCounter:
		return true
	}
	return false
}

// Stats are a Store's counters since New, for metrics.
type Stats struct {
	// Hits is the number of decisions made from a lease, allowed or not.
	Hits uint64
	// LocalDenials is the part of Hits that denied: a key the store had
	// no chunk for, until the store's RetryAfter.
	LocalDenials uint64
	// Fetches is the number of chunk requests sent to the store, and
	// FetchedUnits the capacity they obtained.
	Fetches, FetchedUnits uint64
	// FetchErrors is the number of fetches that failed or were answered by
	// the store's failure policy.
	FetchErrors uint64
	// LateFetches is the number of fetches whose reply came after
	// FetchWait: their takers went on without them, and a chunk they got
	// was credited when it came.
	LateFetches uint64
	// Returns is the number of refunds of unused capacity sent to the
	// store, and ReturnedUnits the capacity they gave back.
	Returns, ReturnedUnits uint64
	// Stranded is capacity that lapsed unused: window chunks at their
	// window's end, and returns that failed.
	Stranded uint64
	// Direct is the number of decisions passed to the wrapped store
	// (unleased algorithms, cold keys, small limits, empty leases).
	Direct uint64
	// SettledUnits is the capacity refunds and charges settled into
	// leases by SettleLocal, with no store call.
	SettledUnits uint64
	// Keys is the number of keys tracked.
	Keys int64
}

// Stats returns the Store's counters.
func (s *Store) Stats() Stats {
	// Each part only grows, and an entry's counts move from it to the
	// retired ones under statsMu: the sums never go back (they are
	// exported as counters).
	s.statsMu.Lock()
	hits, denials := s.retiredHits, s.retiredDenials
	s.keys.Range(func(_ string, e *entry) bool {
		e.mu.Lock()
		hits, denials = hits+e.hits, denials+e.denials
		e.mu.Unlock()
		return true
	})
	s.statsMu.Unlock()
	return Stats{
		Hits: hits + s.hits.Load(), LocalDenials: denials + s.localDenials.Load(),
		Fetches: s.fetches.Load(), FetchedUnits: s.fetched.Load(), FetchErrors: s.fetchErrors.Load(), LateFetches: s.lateFetches.Load(),
		Returns: s.returns.Load(), ReturnedUnits: s.returned.Load(),
		Stranded: s.stranded.Load(), Direct: s.direct.Load(), SettledUnits: s.settled.Load(), Keys: s.size.Load(),
	}
}

// Close stops the sweep, waits for the fetches and refunds in flight, and
// gives every held GCRA and token-bucket chunk back to the wrapped store,
// which it leaves open. Decisions after Close go straight to the wrapped
// store.
func (s *Store) Close() error {
	s.stopOnce.Do(func() { close(s.stop) })
	s.bg.Wait()
	s.closeMu.Lock()
	s.isClosed.Store(true)
	s.closeMu.Unlock()
	s.inflight.Wait()
	var wg sync.WaitGroup
	s.keys.Range(func(_ string, e *entry) bool {
		e.mu.Lock()
		n := e.drop()
		e.mu.Unlock()
		if n > 0 {
			wg.Go(func() { s.giveBack(e, n) })
		}
		return true
	})
	wg.Wait()
	return nil
}

func (s *Store) closed() bool { return s.isClosed.Load() }

func (s *Store) sweepLoop(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sweep()
		}
	}
}

// Sweep gives back the capacity of keys idle for IdleAfter or held for
// TTL, drops window chunks whose window has ended, and forgets keys idle
// for long. The background sweep calls it; tests with a fake clock call it
// themselves. It waits for the refunds it sends.
func (s *Store) Sweep() {
	now := s.clk.Now()
	var wg sync.WaitGroup
	s.keys.Range(func(k string, e *entry) bool {
		e.mu.Lock()
		var n int64
		if e.tokens > 0 && !e.fetching && (now >= e.expiry || (now-e.lastUse >= s.idleFor(e) && !e.window())) {
			n = e.drop()
		}
		forget := e.tokens == 0 && !e.fetching && now-e.lastUse >= 20*s.idle
		e.mu.Unlock()
		if n > 0 {
			wg.Go(func() { s.giveBack(e, n) })
		}
		if forget {
			s.statsMu.Lock()
			deleted := false
			s.keys.Compute(k, func(old *entry, loaded bool) (*entry, xsync.ComputeOp) {
				if loaded && old == e {
					s.size.Add(-1)
					deleted = true
					return nil, xsync.DeleteOp
				}
				return old, xsync.CancelOp
			})
			if deleted {
				e.mu.Lock()
				s.retire(e)
				e.mu.Unlock()
			}
			s.statsMu.Unlock()
		}
		return true
	})
	wg.Wait()
}

// idleFor is how long e's capacity may sit unused before it goes back:
// IdleAfter near the limit, growing with the horizon (horizonFor) to
// IdleAfter × MaxHorizon/Horizon when the store had the capacity full at
// the last fetch, where what one instance holds keeps nobody from the
// limit, so that a client pausing between bursts does not start its next
// one on the store, on its requests' path. TTL bounds it still. e.mu is
// held.
func (s *Store) idleFor(e *entry) int64 {
	return int64(float64(s.idle) * s.horizonFor(e) / s.horizon)
}

// giveBack refunds n units of e's key to the store (GCRA and the token
// bucket), or counts them stranded (windows).
func (s *Store) giveBack(e *entry, n int64) {
	if e.window() {
		s.stranded.Add(uint64(n))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	s.returns.Add(1)
	d, err := s.inner.Apply(ctx, sluice.OpRefund, sluice.Request{Key: e.key, Algorithm: e.algo, Limit: e.limit, Cost: n})
	if err != nil || d.Degraded {
		// Lost, not misplaced: the store keeps it charged until it refills.
		s.stranded.Add(uint64(n))
		s.log.Debug("lease: refund failed; the capacity returns when the limit refills", "err", err, "degraded", d.Degraded)
		return
	}
	s.returned.Add(uint64(n))
}
