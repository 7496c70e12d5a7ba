package upstream

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/sluice-io/sluice"
)

// Leases where hot. A provider limit is a log whose admissions are stamped
// at the end of their slot (Pool.slot, 1/200 of the period): everything
// admitted in one slot counts, in the store, from the admission until the
// slot's end plus a period. So a replica may take a chunk of a hot upstream
// model's limits in one store call and hand it out itself until that slot
// ends: each request it admits from the chunk is admitted before the stamp
// the store gave the chunk, and counts in the store for at least a period
// from its own admission, as if it had gone to the store itself. Nothing
// of a chunk is used past its slot's end; what is left then is stranded
// (counted, unused until its minute is over): a chunk is sized at the
// previous slot's pace for what is left of this one, so little is, and
// giving it back would cost a store call per chunk.
//
// The slot's end comes from the store's answer, as a duration (the log's
// ResetAfter less a period), measured from when the fetch was sent: a
// clock skew between this host and the store's cannot make a chunk
// outlive its slot. A cooldown, a failure or a tightening drops this
// replica's chunk; another replica's cooldown reaches it when its chunk's
// slot ends, at most one slot later.

// slot is the provider logs' granularity.
func (p *Pool) slot() time.Duration { return slotOf(p.period) }

// slotOf is the granularity of a log of period d: 1/200 of it, in whole
// milliseconds (Limit.Granularity).
func slotOf(d time.Duration) time.Duration {
	return max((d / 200).Truncate(time.Millisecond), time.Millisecond)
}

// hotPerSlot is how many admissions on one upstream model this replica
// must have seen in the previous slot for it to lease a chunk.
const hotPerSlot = 4

// maxChunkShare bounds a chunk to a share of each limit.
const maxChunkShare = 20 // 1/20, 5%

// chunk is a replica's leased share of one upstream model's limits.
type chunk struct {
	mu sync.Mutex
	// until is the local time the chunk's slot ends; left is what is left
	// of it per limit kind (rpm, tpm, itpm, otpm).
	until time.Time
	left  [4]int64
	// sent is when the chunk's store call was sent and rtt how long it
	// took: its grants' refunds take back units admitted that long ago.
	sent time.Time
	rtt  time.Duration
	// slot (unix nanos / slot) and its admissions, and the previous
	// slot's, for the heat; refused is the last slot the store refused a
	// chunk in (no other is asked for in it).
	slot, seen, prev, refused int64
	// phase is where the store's slots end on this host's clock (unix
	// nanos modulo the slot), learned from the last chunk: the two
	// clocks differ.
	phase int64
}

// drop empties t's chunk: a cooldown, failure or tightening happened.
func (t *TargetState) drop() {
	t.chunk.mu.Lock()
	t.chunk.left = [4]int64{}
	t.chunk.until = time.Time{}
	t.chunk.mu.Unlock()
}

// costs is a reservation's cost per limit kind.
func costs(in, out int64) [4]int64 { return [4]int64{1, in + out, in, out} }

// fromChunk admits a reservation from t's chunk, counting the admission
// toward t's heat; it reports whether the chunk had room, and then when
// the chunk's store call was sent, and when not, how many reservations of
// this size a new chunk should hold (0: t is not hot).
func (p *Pool) fromChunk(t *TargetState, in, out int64, now time.Time) (bool, time.Time, time.Duration, int64) {
	c := &t.chunk
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := now.UnixNano() / int64(p.slot()); s != c.slot {
		if s == c.slot+1 {
			c.prev = c.seen
		} else {
			c.prev = 0
		}
		c.slot, c.seen = s, 0
	}
	c.seen++
	if now.Before(c.until) {
		cost := costs(in, out)
		fits := true
		for i, v := range cost {
			if t.limit(i) > 0 && v > c.left[i] {
				fits = false
			}
		}
		if fits {
			for i, v := range cost {
				c.left[i] -= v
			}
			return true, c.sent, c.rtt, 0
		}
	}
	if c.prev < hotPerSlot || c.refused == c.slot {
		return false, time.Time{}, 0, 0
	}
	// The previous slot's pace, for what is left of the store's slot; at
	// its very end, nothing.
	slot := int64(p.slot())
	left := ((c.phase-now.UnixNano())%slot + slot) % slot
	if left == 0 {
		return false, time.Time{}, 0, 0
	}
	return false, time.Time{}, 0, max(int64(math.Ceil(float64(c.prev)*float64(left)/float64(slot))), 2)
}

// fetchChunk takes a chunk of n reservations of in and out tokens (the
// first of them the caller's) on t in one store call. It reports whether
// the store granted it, and when the call was sent; when not, the caller
// admits its reservation alone.
func (p *Pool) fetchChunk(ctx context.Context, t *TargetState, in, out, n int64) (bool, time.Time, time.Duration, error) {
	cost := costs(in, out)
	reqs, kinds, fits := p.requests(t, in, out, n)
	if !fits || len(reqs) == 1 { // nothing but the cooldown key
		return false, time.Time{}, 0, nil
	}
	var take [4]int64
	for j, k := range kinds {
		if k >= 0 {
			take[k] = reqs[j].Cost
		}
	}
	sent := p.now()
	ds, err := p.store.ApplyAll(ctx, sluice.OpAllow, reqs)
	if err != nil {
		return false, time.Time{}, 0, fmt.Errorf("upstream %s model %s: chunk: %w", t.Up.Name, t.Model, err)
	}
	answered := p.now()
	t.note(reqs, ds, answered)
	rtt := answered.Sub(sent)
	if !sluice.Combine(ds).Allowed {
		// Full: single admissions until the next slot, not a refused
		// chunk and then a call each.
		c := &t.chunk
		c.mu.Lock()
		c.refused = c.slot
		c.mu.Unlock()
		return false, time.Time{}, 0, nil
	}
	// Each log's slot ends its ResetAfter less its period after the store
	// decided, which was after it was sent; the chunk lasts until the
	// first ends.
	slotLeft := time.Duration(math.MaxInt64)
	for j, k := range kinds {
		if k >= 0 {
			slotLeft = min(slotLeft, ds[j].ResetAfter-reqs[j].Limit.Period)
		}
	}
	c := &t.chunk
	c.mu.Lock()
	defer c.mu.Unlock()
	c.phase = sent.UnixNano() + int64(max(slotLeft, 0))
	if slotLeft <= 0 {
		return true, sent, rtt, nil // the caller's reservation only
	}
	for i := range 4 {
		c.left[i] = max(take[i]-cost[i], 0)
	}
	c.until, c.sent, c.rtt = sent.Add(slotLeft), sent, rtt
	if p.metrics != nil {
		p.metrics.chunks.WithLabelValues(t.Up.Name, t.Model).Inc()
	}
	return true, sent, rtt, nil
}
