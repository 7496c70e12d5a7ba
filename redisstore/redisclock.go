package redisstore

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// The per-node estimate of Redis TIME that the plain path of
// Options.PlainWindows decides by. Every clockEvery the store reads TIME
// on each master, anchored on the local monotonic clock, and keeps the
// offset of the sample with the smallest error among the recent ones. The
// error bound of an estimate is half the sample's round trip, plus the
// resolution of TIME, plus clockDrift of the time since the sample. A
// local clock off by any amount is measured away by the offset.

const (
	// clockEvery spaces the samples of each node.
	clockEvery = time.Second
	// clockStale is how old the latest sample may be before the plain
	// path is off for the node.
	clockStale = 3 * time.Second
	// clockKeep is how many recent samples the best is chosen among.
	clockKeep = 8
	// clockMaxErr caps the error bound: above it the plain path is off.
	clockMaxErr = 20 * time.Millisecond
	// clockDriftPPM is the assumed worst drift between the local and
	// Redis clocks, in parts per million.
	clockDriftPPM = 100
)

// clockSample is one TIME reading.
type clockSample struct {
	mid    int64 // local ns halfway through the round trip
	offset int64 // Redis ns − mid
	half   int64 // half the round trip, plus TIME's µs resolution
}

// errAt is the sample's error bound at local time now.
func (c clockSample) errAt(now int64) int64 {
	return c.half + max(now-c.mid, 0)/1e6*clockDriftPPM
}

// nodeClock holds the samples of one node. Its estimate is read without a
// lock, from the snapshot the sampler stores.
type nodeClock struct {
	mu      sync.Mutex // the sampler's
	samples []clockSample
	best    atomic.Pointer[clockEstimate]
}

// clockEstimate is the best sample and when the latest one was taken.
type clockEstimate struct {
	clockSample
	latest int64 // local ns of the latest sample
}

// add records a sample taken at local time now.
func (n *nodeClock) add(s clockSample, now int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if b := n.best.Load(); b != nil {
		// The offset jumped by more than both bounds (a failover to a
		// host with another clock, a clock step): the old samples are of
		// another clock.
		if d := s.offset - b.offset; d > b.errAt(now)+s.half || -d > b.errAt(now)+s.half {
			n.samples = n.samples[:0]
		}
	}
	n.samples = append(n.samples, s)
	if len(n.samples) > clockKeep {
		n.samples = append(n.samples[:0], n.samples[len(n.samples)-clockKeep:]...)
	}
	best := n.samples[0]
	for _, x := range n.samples[1:] {
		if x.errAt(now) < best.errAt(now) {
			best = x
		}
	}
	n.best.Store(&clockEstimate{clockSample: best, latest: now})
}

// at estimates Redis's time at local time now, with its error bound; ok
// is false without a fresh sample or when the bound is above the cap.
func (n *nodeClock) at(now int64) (t, eps int64, ok bool) {
	b := n.best.Load()
	if b == nil || now-b.latest > int64(clockStale) {
		return 0, 0, false
	}
	eps = b.errAt(now)
	return now + b.offset, eps, eps <= int64(clockMaxErr)
}

// clocks are the store's node clocks and its sampler.
type clocks struct {
	local func() int64 // the local monotonic clock, ns
	nodes nodeMap[nodeClock]
	stop  context.CancelFunc
	done  sync.WaitGroup
}

// monotonic returns a clock that reads the wall time at its creation
// plus the monotonic time since.
func monotonic() func() int64 {
	base := time.Now()
	at := base.UnixNano()
	return func() int64 { return at + int64(time.Since(base)) }
}

// node returns the clock of node, nil when it has none yet.
func (cs *clocks) node(name string) *nodeClock { return cs.nodes.get(name) }

// startClocks starts the sampler; stopClocks (by Close) ends it.
func (s *Store) startClocks() {
	stopped, stop := context.WithCancel(context.Background())
	s.clocks.stop = stop
	s.clocks.done.Add(1)
	go func() {
		defer s.clocks.done.Done()
		t := time.NewTicker(clockEvery)
		defer t.Stop()
		for {
			ctx, cancel := context.WithTimeout(stopped, clockEvery)
			s.sampleClocks(ctx)
			cancel()
			select {
			case <-stopped.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// stopClocks ends the sampler, cancelling a round under way, and waits
// for it.
func (s *Store) stopClocks() {
	if s.clocks.stop != nil {
		s.clocks.stop()
		s.clocks.done.Wait()
	}
}

// sampleClocks reads TIME once on each node: on Cluster each master that
// owns slots, named as NodeOf names it, else the deployment.
func (s *Store) sampleClocks(ctx context.Context) {
	client := s.client()
	if client == nil {
		return
	}
	if !s.cluster {
		s.sampleClock(ctx, s.name, client)
		return
	}
	names, err := s.Nodes(ctx)
	if err != nil {
		return
	}
	nodes := client.Nodes()
	for _, name := range names {
		if nc, ok := nodes[name]; ok {
			s.sampleClock(ctx, name, nc)
		}
	}
}

// sampleClock reads TIME on one node and records it.
func (s *Store) sampleClock(ctx context.Context, name string, client rueidis.Client) {
	ctx, cancel := context.WithTimeout(ctx, clockMaxErr*4)
	defer cancel()
	t0 := s.clocks.local()
	v, err := client.Do(ctx, client.B().Time().Build()).AsStrSlice()
	t1 := s.clocks.local()
	if err != nil || len(v) != 2 {
		return
	}
	sec, err1 := strconv.ParseInt(v[0], 10, 64)
	usec, err2 := strconv.ParseInt(v[1], 10, 64)
	if err1 != nil || err2 != nil {
		return
	}
	mid := t0 + (t1-t0)/2
	smp := clockSample{mid: mid, offset: sec*1e9 + usec*1e3 - mid, half: (t1-t0+1)/2 + 1000}
	s.clocks.nodes.getOrAdd(name, func(int) *nodeClock { return &nodeClock{} }).add(smp, t1)
}
