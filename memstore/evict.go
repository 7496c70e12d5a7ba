package memstore

import (
	"math"
	"slices"
	"time"

	"github.com/sluice-io/sluice"
)

// Eviction.
//
// A key's state is worth what its loss would give away: a key that is
// evicted starts over with its whole limit, and keeps the difference until
// its old state would have read as fresh. Every key, whatever its
// algorithm, policy or limit, is ranked by one value, compared across
// them all: the share of its limit it has in use, summed over the time
// until it would be fresh (in ppm·ms):
//
//   - GCRA and TokenBucket state refills linearly: the share in use now is
//     exact, (time until full) ÷ (refill time of the whole burst), and
//     falls to 0 over that time, so the value is share × time-left ÷ 2;
//   - windows and leases keep the share of their last charge until they
//     expire: share × time-left (an upper bound: a sliding window's share
//     only falls before then, and a released lease is accounted as soon as
//     it is released).
//
// So a 5/day key used up (a day to go) outranks any key with seconds to
// go, used up or not, and among keys with as long to go the more used
// outranks the less used. A key whose state has expired is worth nothing
// (value -1) and goes first.
//
// A sweep past MaxKeys or MaxBytes samples about sampleSize values from
// both maps, in proportion to their sizes, and drops every key valued at or
// below the quantile that brings the store down to 90% of its bounds,
// checking again and repeating (at most maxPasses times) if the sample
// erred. A caller who floods the store with fresh keys of any policy thus
// evicts fresh keys (or less used ones), never a used-up key of another,
// which would start over (TestEvictionAcrossAlgorithms).
//
// What an attacker can still do: evict a key by filling the store with
// keys worth more, that is MaxKeys (or MaxBytes' worth of) keys each used
// up under a limit at least as long as the victim's remaining time, and
// holding them there. Size the store above the keys a deployment's callers
// can mint (docs/redis.md).

const (
	sampleSize = 1024
	maxPasses  = 4
	// msMax caps the time left at 2^43 ms (278 years), so that a value,
	// at most 1e6 times that, fits an int64.
	msMax = 1<<43 - 1
)

// value ranks a key for eviction at now, lowest first (see above): -1 for
// expired state, else its share in use (ppm) summed over the milliseconds
// until it is fresh. expiry is when the state reads as fresh; span the
// refill time of its whole limit if it refills linearly (GCRA,
// TokenBucket), else 0, and then used is its share at its last charge.
func value(expiry, span, used, now int64) int64 {
	left := expiry - now
	if left <= 0 {
		return -1
	}
	ms := float64(min(left/int64(time.Millisecond), msMax))
	if span > 0 {
		share := math.Min(1e6, math.Ceil(float64(left)/float64(span)*1e6))
		return int64(share * ms / 2)
	}
	return int64(float64(min(max(used, 0), 1e6)) * ms)
}

func (c *gcell) value(now int64) int64 {
	return value(c.tat.Load(), c.spanNs(), 0, now)
}

func (c *cell) value(now int64) int64 {
	return value(c.expiry.Load(), c.span.Load(), int64(c.used.Load()), now)
}

// decaySpan is the refill time of req's whole limit for the algorithms
// whose state refills linearly (GCRA, TokenBucket), else 0.
func decaySpan(req *sluice.Request) int64 {
	switch req.Algorithm {
	case sluice.GCRA, sluice.TokenBucket:
		return req.Limit.Tau()
	}
	return 0
}

// usedPPM is the share of req's limit in use after d, in parts per
// million: 1e6 for a key with nothing left.
func usedPPM(d sluice.Decision, req *sluice.Request) int64 {
	c := req.Capacity()
	if c <= 0 {
		return 1e6
	}
	rem := min(max(d.Remaining, 0), c)
	return int64(math.Ceil(float64(c-rem) / float64(c) * 1e6))
}

// added accounts a new key of size bytes.
func (s *Store) added(size int64) {
	s.count.Add(1)
	s.grew(size)
}

// grew accounts size more bytes (or fewer) and sweeps when the store is
// over a bound. Past a bound by an eighth, the caller waits for the sweep
// under way and sweeps itself if still over: a flood from many goroutines
// cannot outrun one sweeper (TestFloodHeldToBounds). It must not be called
// with sweepMu held.
func (s *Store) grew(size int64) {
	b := s.bytes.Add(size)
	n := s.count.Load()
	if n <= s.maxKeys && b <= s.maxBytes {
		return
	}
	if n > s.maxKeys+s.maxKeys/8 || b > s.maxBytes+s.maxBytes/8 {
		s.sweepMu.Lock()
	} else if !s.sweepMu.TryLock() {
		return
	}
	defer s.sweepMu.Unlock()
	if s.over(1) {
		s.sweep(true)
	}
}

// over reports whether the store holds more than frac of MaxKeys or of
// MaxBytes.
func (s *Store) over(frac float64) bool {
	return float64(s.count.Load()) > frac*float64(s.maxKeys) || float64(s.bytes.Load()) > frac*float64(s.maxBytes)
}

// sweepLoop sweeps on every tick until Close.
func (s *Store) sweepLoop(tick <-chan time.Time) {
	defer close(s.done)
	for {
		select {
		case <-s.stop:
			return
		case <-tick:
			s.Sweep()
		}
	}
}

// Sweep drops every key whose state has expired, and, if the store is
// still over MaxKeys or MaxBytes, the keys whose loss admits least (see
// evict.go). It returns how many keys it dropped. It runs by itself; call
// it to free memory at once.
func (s *Store) Sweep() int {
	s.sweepMu.Lock()
	defer s.sweepMu.Unlock()
	return s.sweep(s.over(1))
}

// sweep must be called with sweepMu held. It drops expired keys and, if
// full, evicts down to 90% of the bounds.
func (s *Store) sweep(full bool) int {
	now := s.clk.Now()
	if !full {
		return s.evict(-1, 1, now)
	}
	n := 0
	sample := make([]int64, 0, sampleSize+2)
	for range maxPasses {
		if !s.over(0.9) {
			break
		}
		cut, ties, ok := s.cut(sample[:0], now)
		if !ok {
			break
		}
		n += s.evict(cut, ties, now)
	}
	return n
}

// cut samples the values of both maps in proportion to their sizes and
// returns the one at or below which the store's excess over 88% of its
// bounds lies, and the share of the keys valued at it that are to go: many
// keys can share one value (a fixed window's keys with the same share used
// all expire at its end), and evicting them all would empty the store.
func (s *Store) cut(sample []int64, now int64) (cut int64, ties float64, ok bool) {
	count := max(s.count.Load(), 1)
	// Aim at 88%, under the 90% that ends the sweep, so that a sample's
	// error rarely costs another pass over the store.
	frac := max(1-0.88*float64(s.maxKeys)/float64(count), 1-0.88*float64(s.maxBytes)/float64(max(s.bytes.Load(), 1)))
	ncells := s.cells.Size()
	ng := int(math.Ceil(sampleSize * float64(max(count-int64(ncells), 0)) / float64(count)))
	nc := int(math.Ceil(sampleSize * float64(ncells) / float64(count)))
	start := len(sample)
	s.gcra.rangeCells(func(c *gcell) bool {
		if v := c.tat.Load(); v != dead {
			sample = append(sample, c.value(now))
		}
		return len(sample)-start < ng
	})
	start = len(sample)
	s.cells.Range(func(_ string, c *cell) bool {
		sample = append(sample, c.value(now))
		return len(sample)-start < nc
	})
	if len(sample) == 0 {
		return 0, 0, false
	}
	slices.Sort(sample)
	want := max(int(math.Ceil(frac*float64(len(sample)))), 1)
	cut = sample[min(want, len(sample))-1]
	below, _ := slices.BinarySearch(sample, cut)
	at, _ := slices.BinarySearch(sample, cut+1)
	return cut, float64(want-below) / float64(at-below), true
}

// evict drops every key valued below cut and the share ties of those
// valued at it, every 1/ties-th in map order (cut -1, ties 1: the expired
// ones). A non-GCRA key in use (its lock held) is kept.
func (s *Store) evict(cut int64, ties float64, now int64) int {
	var freed int64
	credit := 0.0
	drop := func(v int64) bool {
		if v != cut {
			return v < cut
		}
		if credit += ties; credit >= 1 {
			credit--
			return true
		}
		return false
	}
	n := s.gcra.deleteMatching(func(c *gcell) bool {
		v := c.tat.Load()
		if v == dead || !drop(value(v, c.spanNs(), 0, now)) || !c.tat.CompareAndSwap(v, dead) {
			return false
		}
		freed += gcraBytes(int(c.klen))
		return true
	})
	n += s.cells.DeleteMatching(func(_ string, c *cell) (bool, bool) {
		if c.value(now) > cut || !c.mu.TryLock() {
			return false, false
		}
		defer c.mu.Unlock()
		if !drop(c.value(now)) {
			return false, false
		}
		c.dead = true
		freed += c.size
		return true, false
	})
	s.count.Add(-int64(n))
	s.bytes.Add(-freed)
	return n
}
