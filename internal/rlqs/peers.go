package rlqs

import (
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"sync"
	"time"

	"github.com/sluice-io/sluice/clock"
)

// What one client (an IP address) and the whole server may hold, and what
// a client may spend per report interval. A client's budget is kept by its
// address, not its stream, so reconnecting does not renew it; its entry
// stays while it has a stream or a budget spent in the current interval,
// and the table holds at most max_streams + maxIdlePeers entries.
//
// Memory (docs/envoy.md#memory): a stream holds its bucket table (a
// bucket is about 200 bytes: a 16-byte hash of its id, its store key and
// counters), at most one report being answered and one read ahead
// (max_usages_per_report usages), and two goroutines; the server holds at
// most max_streams streams and max_buckets buckets in all.

// peerCalls is how many store calls one client's reports may have in
// flight at a time, over all its streams: a client's large reports queue
// behind each other, not in Redis in front of every other client's.
const peerCalls = 2

// maxIdlePeers bounds the entries of clients without a stream, kept for
// their spent budget: beyond it, the oldest interval's are forgotten.
const maxIdlePeers = 4096

// reserveShare and heavyShare keep room under max_buckets for light
// clients: once the server holds all but 1/reserveShare of its ceiling, a
// client that holds 1/heavyShare of it or more gets no new bucket. So
// clients at their budgets fill at most 3/4 of the ceiling, and it takes
// at least heavyShare/reserveShare (4) light clients to fill the rest.
const (
	reserveShare = 4
	heavyShare   = 16
)

// outcome is a bound's answer.
type outcome int

const (
	ok outcome = iota
	refusedPeer
	refusedServer
)

type peerState struct {
	calls   chan struct{} // its store calls in flight (peerCalls)
	streams int
	buckets int   // buckets of its open streams
	window  int64 // the report interval its spending counts in
	reports int   // bucket usages in that interval
	prev    int   // bucket usages in the interval before
	created int   // new buckets in that interval
}

// peerTable keeps every client's streams, buckets and budget.
type peerTable struct {
	clk clock.Clock

	mu         sync.Mutex
	peers      map[string]*peerState
	streams    int
	buckets    int
	interval   int64
	maxStreams int
	maxBuckets int
	maxPeer    int
	maxReports int
	maxNew     int
}

func newPeerTable(clk clock.Clock, c *Config) *peerTable {
	t := &peerTable{clk: clk, peers: map[string]*peerState{}}
	t.setLimits(c)
	return t
}

// setLimits applies a section's bounds; what is held beyond new ones
// stays until it is released.
func (t *peerTable) setLimits(c *Config) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.interval = int64(c.interval())
	t.maxStreams = orDefault(c.MaxStreams, defaultMaxStreams())
	t.maxBuckets = orDefault(c.MaxBuckets, DefaultMaxBuckets)
	t.maxPeer = orDefault(c.MaxStreamsPerPeer, DefaultMaxStreamsPerPeer)
	t.maxReports = orDefault(c.MaxReportsPerPeer, DefaultMaxReportsPerPeer)
	t.maxNew = orDefault(c.MaxNewBucketsPerPeer, DefaultMaxNewBucketsPerPeer)
}

// get returns host's entry with its budget of the current interval.
// t.mu is held.
func (t *peerTable) get(host string) *peerState {
	w := t.clk.Now() / t.interval
	p := t.peers[host]
	if p == nil {
		if len(t.peers) >= t.maxStreams+maxIdlePeers {
			t.forgetIdle(w)
		}
		p = &peerState{window: w, calls: make(chan struct{}, peerCalls)}
		t.peers[host] = p
	}
	if p.window != w {
		p.prev = 0
		if p.window == w-1 {
			p.prev = p.reports
		}
		p.window, p.reports, p.created = w, 0, 0
	}
	return p
}

// forgetIdle drops the entries of clients without a stream; those of the
// current interval last, so a client that reconnects at once keeps its
// spent budget unless the table is flooded. t.mu is held.
func (t *peerTable) forgetIdle(w int64) {
	for h, p := range t.peers {
		if p.streams == 0 && p.window != w {
			delete(t.peers, h)
		}
	}
	if len(t.peers) < t.maxStreams+maxIdlePeers {
		return
	}
	for h, p := range t.peers {
		if p.streams == 0 {
			delete(t.peers, h)
		}
	}
}

// open counts a new stream of host, or refuses it.
func (t *peerTable) open(host string) outcome {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.streams >= t.maxStreams {
		return refusedServer
	}
	p := t.get(host)
	if p.streams >= t.maxPeer {
		return refusedPeer
	}
	p.streams++
	t.streams++
	return ok
}

// close releases a stream of host and its buckets.
func (t *peerTable) close(host string, buckets int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.streams--
	t.buckets -= buckets
	if p := t.peers[host]; p != nil {
		p.streams--
		p.buckets -= buckets
	}
}

// spend takes n bucket usages from host's budget of this interval; false
// means the report is over it (and nothing is taken).
func (t *peerTable) spend(host string, n int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.get(host)
	if p.reports+n > t.maxReports {
		return false
	}
	p.reports += n
	return true
}

// heavy says whether host reported more than lightSpent usages in this
// interval or the one before: its reports are planned one at a time
// server-wide (Server.heavyWork).
func (t *peerTable) heavy(host string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.get(host)
	return p.reports > lightSpent || p.prev > lightSpent
}

// overBudget is the time until the next interval if host has spent its
// report budget of this one, else 0.
func (t *peerTable) overBudget(host string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.get(host).reports < t.maxReports {
		return 0
	}
	now := t.clk.Now()
	return time.Duration(t.interval - now%t.interval)
}

// callSlots returns host's semaphore of store calls (peerCalls) and its
// usages reported in the current interval. The entry stays while host
// has a stream, so the channel is the one other streams of host use.
func (t *peerTable) callSlots(host string) (chan struct{}, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.get(host)
	return p.calls, p.reports
}

// newBucket counts a new bucket of host against its budget and the
// server's ceiling.
func (t *peerTable) newBucket(host string) outcome {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.buckets >= t.maxBuckets {
		return refusedServer
	}
	p := t.get(host)
	if p.created >= t.maxNew {
		return refusedPeer
	}
	// The last reserveShare of the ceiling is kept for the clients that
	// hold little: a few clients creating buckets as fast as their
	// budgets allow fill the rest, never the room another client's next
	// bucket needs.
	if t.buckets >= t.maxBuckets-t.maxBuckets/reserveShare && p.buckets >= t.maxBuckets/heavyShare {
		return refusedServer
	}
	p.created++
	p.buckets++
	t.buckets++
	return ok
}

// untilNext is the time until the next interval's budgets.
func (t *peerTable) untilNext() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clk.Now()
	return time.Duration(t.interval - now%t.interval)
}

func (t *peerTable) held() Held {
	t.mu.Lock()
	defer t.mu.Unlock()
	return Held{Streams: t.streams, Buckets: t.buckets, Peers: len(t.peers)}
}

// hashPeer names a client in logs without its address.
func hashPeer(host string) string {
	h := sha256.Sum256([]byte(host))
	return hex.EncodeToString(h[:6])
}

// logPeriod is how often one kind of warning is logged at most.
const logPeriod = 10 * time.Second

// rateLog logs each kind of warning at most once per period, saying how
// many of its kind were suppressed since the last line.
type rateLog struct {
	out    *slog.Logger
	clk    clock.Clock
	period int64

	mu    sync.Mutex
	kinds map[string]*logKind
}

type logKind struct {
	last       int64
	suppressed int
}

func newRateLog(log *slog.Logger, clk clock.Clock, period time.Duration) *rateLog {
	return &rateLog{out: log, clk: clk, period: int64(period), kinds: map[string]*logKind{}}
}

// log writes msg unless a line of kind was written less than a period ago.
// Kinds are the code's own strings, so the map stays small.
func (r *rateLog) log(kind, msg string, args ...any) {
	now := r.clk.Now()
	r.mu.Lock()
	k := r.kinds[kind]
	if k == nil {
		k = &logKind{last: now - r.period}
		r.kinds[kind] = k
	}
	if now-k.last < r.period {
		k.suppressed++
		r.mu.Unlock()
		return
	}
	n := k.suppressed
	k.last, k.suppressed = now, 0
	r.mu.Unlock()
	r.out.Warn(msg, append(args, "suppressed_since_last", n)...)
}

// storeSlots is how many store calls the quota service has in flight at
// a time, over all clients; lightSlots of them are kept for the calls of
// clients that have reported at most lightSpent usages in the interval.
const (
	storeSlots = 4
	lightSlots = 3
	lightSpent = 2 * chunkBuckets
)

// fairSlots hands out the service's store calls in flight (storeSlots):
// when all are busy, the next free one goes to the waiting call of the
// client that has reported least in the current interval, so that a
// client reporting at its caps waits behind its own calls, and a client
// reporting once an interval waits for at most the calls in flight. The
// calls of heavy clients (more than lightSpent usages this interval) hold
// at most storeSlots - lightSlots slots together, so a light client's
// call finds a slot free at once, in Redis behind at most those.
type fairSlots struct {
	mu      sync.Mutex
	free    int
	heavy   int // slots held by heavy clients' calls
	seq     uint64
	waiting []*slotWaiter
}

type slotWaiter struct {
	spent int
	seq   uint64
	ready chan struct{}
}

func newFairSlots(n int) *fairSlots { return &fairSlots{free: n} }

// fits says whether a call of a client that spent so much may take a free
// slot. f.mu is held.
func (f *fairSlots) fits(spent int) bool {
	return f.free > 0 && (spent <= lightSpent || f.heavy < storeSlots-lightSlots)
}

// take takes a free slot that fits spent. f.mu is held.
func (f *fairSlots) take(spent int) {
	f.free--
	if spent > lightSpent {
		f.heavy++
	}
}

// acquire takes a slot for a client that has reported spent usages in
// this interval, or returns false when done is closed first. The slot is
// given back with release(spent).
func (f *fairSlots) acquire(done <-chan struct{}, spent int) bool {
	f.mu.Lock()
	if f.fits(spent) {
		f.take(spent)
		f.mu.Unlock()
		return true
	}
	f.seq++
	w := &slotWaiter{spent: spent, seq: f.seq, ready: make(chan struct{})}
	f.waiting = append(f.waiting, w)
	f.mu.Unlock()
	select {
	case <-w.ready:
		return true
	case <-done:
		f.mu.Lock()
		defer f.mu.Unlock()
		for i, x := range f.waiting {
			if x == w {
				f.waiting = append(f.waiting[:i], f.waiting[i+1:]...)
				return false
			}
		}
		// handed a slot meanwhile: give it on
		f.give(spent)
		return false
	}
}

// release gives back a slot taken with acquire(spent), to the waiting
// call that comes first.
func (f *fairSlots) release(spent int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.give(spent)
}

// give frees a slot held for spent and hands free slots on: each to the
// waiter that has spent least (the earliest among equals) whose call
// fits. f.mu is held.
func (f *fairSlots) give(spent int) {
	f.free++
	if spent > lightSpent {
		f.heavy--
	}
	for len(f.waiting) > 0 {
		best := -1
		for i, w := range f.waiting {
			if !f.fits(w.spent) {
				continue
			}
			if best < 0 {
				best = i
				continue
			}
			b := f.waiting[best]
			if w.spent < b.spent || (w.spent == b.spent && w.seq < b.seq) {
				best = i
			}
		}
		if best < 0 {
			return
		}
		w := f.waiting[best]
		f.waiting = append(f.waiting[:best], f.waiting[best+1:]...)
		f.take(w.spent)
		close(w.ready)
	}
}

// MaxPendingBytes bounds the reports, in their wire bytes, that the
// server holds read and not yet answered, over all streams: a report
// decoded takes a few times its wire size.
const MaxPendingBytes = 16 << 20

// budget is a count of bytes that can be taken and given back.
type budget struct {
	mu   sync.Mutex
	left int64
}

// take takes n if that much is left.
func (b *budget) take(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > b.left {
		return false
	}
	b.left -= n
	return true
}

// give gives n back.
func (b *budget) give(n int64) {
	b.mu.Lock()
	b.left += n
	b.mu.Unlock()
}
