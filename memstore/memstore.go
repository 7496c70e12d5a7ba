// Package memstore is sluice's embedded in-memory Store: the default when
// no Redis is configured, and the fallback of the Redis store's "local"
// failure policy.
//
// # Design
//
// Keys live in concurrent hash maps whose reads take no lock, so many keys
// do not contend and one hot key costs one clock read, one map lookup and
// one compare-and-swap. GCRA, the default algorithm, keeps its whole state
// in one atomic int64 (the theoretical arrival time), in a table of its own
// that stores each key and its state in one allocation (gtable.go), and
// never locks. The other algorithms keep an algo.State behind a per-key
// mutex, in an xsync.Map.
// A key belongs to one algorithm family: GCRA state and the other
// algorithms' state are kept apart.
//
// Memory is bounded by MaxKeys and by MaxBytes, the heap the keys and
// their state take as the store accounts it (size.go). A key whose state
// has expired (its bucket is full again, its window has passed) is worth
// nothing and is dropped by a sweep, run in the background every
// SweepInterval and whenever the store grows past a bound. If dropping
// expired keys does not bring the store under its bounds, the sweep evicts,
// down to 90% of them, the keys whose loss admits least, ranked by one
// value across every algorithm and policy: the share of its limit a key
// has in use now, then how long until it would be fresh (evict.go). A
// caller who fills the store with fresh keys thus evicts fresh keys, never
// the state of a key that has used up its limit, which would start over.
//
// The time comes from a clock.Coarse by default: one atomic load rather
// than a system clock read (half of a decision's time), lagging the
// system clock by up to a millisecond, which only delays refills
// (docs/redis.md, Memory store).
//
// A GCRA key takes 40 bytes besides its key's bytes, another algorithm's
// key 192 (docs/redis.md, TestBytesPerKey).
package memstore

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
	"github.com/sluice-io/sluice/clock"
)

// Defaults for Options.
const (
	DefaultMaxKeys       = 1 << 20
	DefaultSweepInterval = time.Minute
)

// dead marks a GCRA cell that a sweep removed from the map; an operation
// that finds it looks the key up again.
const dead = -1 << 63

// Options configure a Store. The zero value is usable.
type Options struct {
	// Clock supplies the time. Nil means clock.NewCoarse(0): the system
	// clock cached and refreshed every millisecond while the store is
	// used, which lags it by about that much (bounds exact on this clock;
	// over a wall-clock window of t, what it admits in t + the lag:
	// docs/redis.md) and costs nothing when idle. clock.NewSystem() reads
	// the system clock at each decision, exact to the nanosecond at twice
	// a decision's time. Tests inject a *clock.Fake.
	Clock clock.Clock
	// MaxKeys bounds the number of keys held. Zero means DefaultMaxKeys.
	MaxKeys int
	// MaxBytes bounds the bytes the keys and their state take on the heap,
	// as the store accounts them (see Bytes and docs/redis.md): past it,
	// the store evicts as past MaxKeys. Zero means DefaultMaxBytes.
	MaxBytes int64
	// SweepInterval is how often idle keys are dropped in the background.
	// Zero means DefaultSweepInterval; negative disables the background
	// sweep (sweeps still run when the store is full).
	SweepInterval time.Duration
}

// Store is the in-memory sluice.Store. It is safe for concurrent use. Close
// stops its background sweep.
type Store struct {
	clk      clock.Clock
	coarse   *clock.Coarse // clk, when it is a coarse clock: called directly
	sys      *clock.System // clk, when it is the system clock: called directly
	maxKeys  int64
	maxBytes int64
	gcra     *gtable
	cells    *xsync.Map[string, *cell]
	count    atomic.Int64 // keys in both maps
	bytes    atomic.Int64 // their accounted bytes (size.go)
	params   atomic.Pointer[algo.GCRAParams]
	sweepMu  sync.Mutex
	stop     chan struct{}
	done     chan struct{}
	closed   sync.Once
}

// cell holds a non-GCRA key's state.
type cell struct {
	mu     sync.Mutex
	st     algo.State
	expiry atomic.Int64 // when st reads as fresh; read by sweeps without mu
	span   atomic.Int64 // refill time of the whole limit; 0 for windows and leases (evict.go)
	size   int64        // accounted bytes (size.go); guarded by mu
	used   atomic.Int32 // share of the limit in use at the last charge, in ppm
	dead   bool         // removed from the map; guarded by mu
	// 112 bytes: one allocation size class below 120 (TestBytesPerKey)
}

// New returns a Store. It starts a background sweep unless
// opts.SweepInterval is negative.
func New(opts Options) (*Store, error) {
	if opts.MaxKeys < 0 {
		return nil, fmt.Errorf("memstore: MaxKeys %d must not be negative", opts.MaxKeys)
	}
	if opts.MaxKeys == 0 {
		opts.MaxKeys = DefaultMaxKeys
	}
	if opts.MaxBytes < 0 {
		return nil, fmt.Errorf("memstore: MaxBytes %d must not be negative", opts.MaxBytes)
	}
	if opts.MaxBytes == 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.Clock == nil {
		opts.Clock = clock.NewCoarse(0)
	}
	if opts.SweepInterval == 0 {
		opts.SweepInterval = DefaultSweepInterval
	}
	coarse, _ := opts.Clock.(*clock.Coarse)
	sys, _ := opts.Clock.(*clock.System)
	s := &Store{
		clk:      opts.Clock,
		coarse:   coarse,
		sys:      sys,
		maxKeys:  int64(opts.MaxKeys),
		maxBytes: opts.MaxBytes,
		gcra:     newGtable(),
		cells:    xsync.NewMap[string, *cell](),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	if opts.SweepInterval > 0 {
		t := time.NewTicker(opts.SweepInterval)
		go func() {
			defer t.Stop()
			s.sweepLoop(t.C)
		}()
	} else {
		close(s.done)
	}
	return s, nil
}

// Close stops the background sweep. The store stays usable.
func (s *Store) Close() error {
	s.closed.Do(func() { close(s.stop) })
	<-s.done
	return nil
}

// Len returns the number of keys held.
func (s *Store) Len() int { return int(s.count.Load()) }

// Apply implements sluice.Store.
func (s *Store) Apply(ctx context.Context, op sluice.Op, req sluice.Request) (d sluice.Decision, err error) {
	if req.Algorithm == sluice.GCRA && op == sluice.OpAllow && req.MaxWait == 0 && req.Cost == 1 {
		// The hot path: a cost of 1 on a key held, under the limit seen
		// last, with one clock read, one table lookup and one
		// compare-and-swap; the decision's arithmetic comes after the
		// swap, written straight into the result. Everything else is in
		// apply1, so that this frame stays small.
		if p := s.params.Load(); p != nil && p.Limit == req.Limit {
			if c, _ := s.gcra.load(req.Key); c != nil {
				var now int64
				if s.coarse != nil {
					now = s.coarse.Now() // inlined: one atomic load
				} else {
					now = s.now()
				}
				for {
					old := c.tat.Load()
					if old == dead {
						break // removed by a sweep: gcraAllow looks it up again
					}
					tat := max(old, now)
					if tat+p.Interval-p.Tau > now {
						return algo.GCRADenied(p, tat, p.Interval, now), nil
					}
					if c.tat.CompareAndSwap(old, tat+p.Interval) {
						c.setSpan(p.Tau)
						algo.GCRAAdmittedTo(&d, p, tat+p.Interval, now)
						return d, nil
					}
				}
			}
		}
	}
	return s.apply1(op, &req)
}

// apply1 is Apply off its hot path.
func (s *Store) apply1(op sluice.Op, req *sluice.Request) (sluice.Decision, error) {
	if req.Algorithm == sluice.GCRA && op == sluice.OpAllow {
		if req.MaxWait != 0 {
			return s.gcraReserve(*req) // reserve.go
		}
		return s.gcraAllow(*req)
	}
	if err := req.Validate(op); err != nil {
		return sluice.Decision{}, fmt.Errorf("memstore: %w", err)
	}
	if req.Algorithm != sluice.GCRA && op != sluice.OpReset {
		return s.applyCell(op, *req), nil
	}
	ds, err := s.apply(op, []sluice.Request{*req})
	if err != nil {
		return sluice.Decision{}, err
	}
	return ds[0], nil
}

// ApplyAll implements sluice.Store.
func (s *Store) ApplyAll(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	for i := range reqs {
		if err := reqs[i].Validate(op); err != nil {
			return nil, fmt.Errorf("memstore: request %d: %w", i, err)
		}
	}
	if len(reqs) == 0 {
		return nil, nil
	}
	if len(reqs) == 1 && op != sluice.OpReset {
		// One request is atomic by itself: Apply's paths, without the
		// batch's ordering, locking and pending-state maps (an Envoy
		// request of one descriptor: 8 allocations fewer).
		d, err := s.Apply(ctx, op, reqs[0])
		if err != nil {
			return nil, err
		}
		return []sluice.Decision{d}, nil
	}
	return s.apply(op, reqs)
}

// gcraParams returns the parameters of l, from a one-entry cache: callers
// mostly repeat one limit.
func (s *Store) gcraParams(l sluice.Limit) (*algo.GCRAParams, error) {
	if p := s.params.Load(); p != nil && p.Limit == l {
		return p, nil
	}
	p, err := algo.NewGCRAParams(l)
	if err != nil {
		return nil, err
	}
	s.params.Store(&p)
	return &p, nil
}

// Now reads the store's clock (Unix ns): Reservation.Cancel measures
// with it how long ago a reservation was made.
func (s *Store) Now() int64 { return s.now() }

// now reads the store's clock, calling the coarse or system clock directly.
func (s *Store) now() int64 {
	if s.coarse != nil {
		return s.coarse.Now()
	}
	if s.sys != nil {
		return s.sys.Now()
	}
	return s.clk.Now()
}

// gcraAllow is the lock-free path: one clock read, one map lookup,
// one compare-and-swap.
func (s *Store) gcraAllow(req sluice.Request) (sluice.Decision, error) {
	p, err := s.gcraParams(req.Limit)
	if err != nil || req.Key == "" || req.Cost < 1 || req.Cost > req.Limit.Capacity() {
		if err == nil {
			err = req.Validate(sluice.OpAllow)
		}
		return sluice.Decision{}, fmt.Errorf("memstore: %w", err)
	}
	for {
		c := s.gcraCell(req.Key, p.Tau)
		for {
			now := s.now()
			old := c.tat.Load()
			if old == dead {
				break
			}
			d, tat := algo.GCRAAllow(old, p, req.Cost, now)
			if !d.Allowed || c.tat.CompareAndSwap(old, tat) {
				if d.Allowed {
					c.setSpan(p.Tau)
				}
				return d, nil
			}
		}
	}
}

// applyCell runs op on one non-GCRA key under its lock, allocating nothing
// beyond what the algorithm's new state needs.
func (s *Store) applyCell(op sluice.Op, req sluice.Request) sluice.Decision {
	for {
		c := s.cell(req.Key)
		c.mu.Lock()
		if c.dead {
			c.mu.Unlock()
			continue
		}
		d, next, _ := algo.Apply(op, c.st, req, s.now()) // validated by the caller
		var grown int64
		if op != sluice.OpPeek && (d.Allowed || op == sluice.OpTake) { // a take of nothing releases
			grown = c.commit(next, d, &req)
		}
		c.mu.Unlock()
		if grown != 0 {
			s.grew(grown)
		}
		return d
	}
}

// commit makes st, reached by decision d on req, c's state. It returns by
// how many bytes c's accounted size changed. c.mu must be held.
func (c *cell) commit(st algo.State, d sluice.Decision, req *sluice.Request) int64 {
	c.st = st
	c.expiry.Store(algo.Expiry(&st, req))
	c.used.Store(int32(usedPPM(d, req)))
	c.span.Store(decaySpan(req))
	size := cellBytes(len(req.Key), &st)
	grown := size - c.size
	c.size = size
	return grown
}

// gcraCell returns key's GCRA cell, created for a limit whose whole burst
// refills in span if the key is new.
func (s *Store) gcraCell(key string, span int64) *gcell {
	// The key is copied into the cell: a caller's key may be a slice of a
	// larger buffer (a request body), which would otherwise stay alive
	// unaccounted.
	c, added := s.gcra.loadOrCreate(key, span)
	if added {
		s.added(gcraBytes(len(key)))
	}
	return c
}

func (s *Store) cell(key string) *cell {
	if c, ok := s.cells.Load(key); ok {
		return c
	}
	// The size is accounted as computed here: once stored, the cell is
	// another goroutine's to lock and charge, which changes c.size (read
	// after the store, a charge's growth was accounted twice).
	size := cellBytes(len(key), nil)
	c, loaded := s.cells.LoadOrStore(strings.Clone(key), &cell{size: size})
	if !loaded {
		s.added(size)
	}
	return c
}

// member is one request's part in an apply: its cell and pending state.
type member struct {
	gcra *gcell // GCRA keys
	old  int64
	cell *cell // other keys
}

// apply runs op on validated requests atomically. Non-GCRA cells are locked
// in key order for the whole step; GCRA cells are read, then updated by
// compare-and-swap, and the step is retried if any of them changed meanwhile.
func (s *Store) apply(op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	if op == sluice.OpReset {
		for _, r := range reqs {
			s.reset(r)
		}
		ds := make([]sluice.Decision, len(reqs))
		for i, r := range reqs {
			ds[i] = sluice.Decision{Allowed: true, Limit: r.Limit, Remaining: r.Capacity()}
		}
		return ds, nil
	}
	order := make([]int, len(reqs))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return reqs[order[a]].Key < reqs[order[b]].Key })
	for {
		members, locked, ok := s.lockMembers(reqs, order)
		if !ok {
			continue
		}
		ds, grown, retry := s.step(op, reqs, order, members)
		for _, c := range locked {
			c.mu.Unlock()
		}
		if grown != 0 {
			s.grew(grown)
		}
		if !retry {
			return ds, nil
		}
	}
}

// lockMembers finds or creates each request's cell and locks the non-GCRA
// ones in key order, each once, returning them as locked. It reports false,
// with nothing locked, when it met a cell a sweep had just removed.
func (s *Store) lockMembers(reqs []sluice.Request, order []int) (members []member, locked []*cell, ok bool) {
	members = make([]member, len(reqs))
	for _, i := range order {
		r := &reqs[i]
		if r.Algorithm == sluice.GCRA {
			members[i].gcra = s.gcraCell(r.Key, decaySpan(r))
			continue
		}
		c := s.cell(r.Key)
		if n := len(locked); n > 0 && locked[n-1] == c {
			members[i].cell = c
			continue
		}
		c.mu.Lock()
		if c.dead {
			c.mu.Unlock()
			for _, l := range locked {
				l.mu.Unlock()
			}
			return nil, nil, false
		}
		members[i].cell = c
		locked = append(locked, c)
	}
	return members, locked, true
}

// step computes every decision and commits the new states if the batch may
// be charged. It returns by how many bytes the cells' accounted sizes
// changed, and reports retry when a GCRA cell changed underneath.
func (s *Store) step(op sluice.Op, reqs []sluice.Request, order []int, members []member) ([]sluice.Decision, int64, bool) {
	now := s.now()
	ds := make([]sluice.Decision, len(reqs))
	// pending state per cell, so that repeated keys see each other's charge
	gcraSeen := map[*gcell]int64{}
	cellSeen := map[*cell]algo.State{}
	allowed := true
	for _, i := range order {
		m := &members[i]
		var st algo.State
		if m.gcra != nil {
			v, ok := gcraSeen[m.gcra]
			if !ok {
				v = m.gcra.tat.Load()
				if v == dead {
					return nil, 0, true
				}
				m.old = v
			}
			st.A = v
		} else {
			var ok bool
			if st, ok = cellSeen[m.cell]; !ok {
				st = m.cell.st
			}
		}
		d, next, err := algo.Apply(op, st, reqs[i], now)
		if err != nil { // validated already; keep the state as it is
			continue
		}
		ds[i] = d
		allowed = allowed && d.Allowed
		if m.gcra != nil {
			gcraSeen[m.gcra] = next.A
		} else {
			cellSeen[m.cell] = next
		}
	}
	if op == sluice.OpAllow && !allowed {
		// Nothing is charged: report each member's state as it stands.
		for _, i := range order {
			if ds[i].Allowed {
				m := &members[i]
				st := algo.State{A: m.old}
				if m.cell != nil {
					st = m.cell.st
				}
				ds[i], _, _ = algo.Apply(sluice.OpPeek, st, reqs[i], now)
			}
		}
		return ds, 0, false
	}
	if op == sluice.OpPeek || (op == sluice.OpRefund && !allowed) {
		return ds, 0, false // a refund batch with a lease not held refunds nothing
	}
	// Commit: GCRA cells by compare-and-swap, rolled back on conflict.
	var done []*gcell
	for _, i := range order {
		m := &members[i]
		if m.gcra == nil || slices.Contains(done, m.gcra) {
			continue
		}
		if !m.gcra.tat.CompareAndSwap(m.old, gcraSeen[m.gcra]) {
			for _, c := range done {
				rollback(c, gcraSeen[c], members, order)
			}
			return nil, 0, true
		}
		done = append(done, m.gcra)
	}
	var grown int64
	for _, i := range order {
		if g := members[i].gcra; g != nil {
			g.setSpan(decaySpan(&reqs[i]))
		}
		if c := members[i].cell; c != nil {
			grown += c.commit(cellSeen[c], ds[i], &reqs[i]) // the last of a key's in order is its final state
		}
	}
	return ds, grown, false
}

// rollback undoes a committed GCRA update after a later one in the batch
// lost its race. If another request charged the cell since, its charge is
// kept: the difference is subtracted rather than the old value restored.
func rollback(c *gcell, committed int64, members []member, order []int) {
	var old int64
	for _, i := range order {
		if members[i].gcra == c {
			old = members[i].old
			break
		}
	}
	if !c.tat.CompareAndSwap(committed, old) {
		c.tat.Add(old - committed)
	}
}

func (s *Store) reset(r sluice.Request) {
	if r.Algorithm == sluice.GCRA {
		if c, _ := s.gcra.load(r.Key); c != nil {
			// Not a cell a sweep removed: brought back to life, it took
			// charges outside the map.
			for {
				v := c.tat.Load()
				if v == dead || c.tat.CompareAndSwap(v, 0) {
					break
				}
			}
		}
		return
	}
	if c, ok := s.cells.Load(r.Key); ok {
		c.mu.Lock()
		if c.dead { // removed, its bytes freed already
			c.mu.Unlock()
			return
		}
		c.st = algo.State{}
		c.expiry.Store(0)
		c.used.Store(0)
		size := cellBytes(len(r.Key), nil)
		grown := size - c.size
		c.size = size
		c.mu.Unlock()
		s.bytes.Add(grown) // a reset only shrinks
	}
}

var _ sluice.Store = (*Store)(nil)
