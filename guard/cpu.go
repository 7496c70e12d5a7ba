package guard

import (
	"math"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// A call or probe that misses its deadline says the store is slow only
// when this process was not the slow one. A flood of requests can starve
// the process of CPU: its goroutines then wait to run, the store's
// answers are read late, and calls and probes miss their deadlines while
// the store answers at once. Counted as store failures, they opened the
// circuit, and fail_open admitted everything. starvation reads how long
// the process's goroutines waited to run (the runtime's scheduling
// latencies) and says whether it was starved since the last reading.

// schedLatencies is the runtime metric starvation reads.
const schedLatencies = "/sched/latencies:seconds"

// starvation tells whether the process was starved of CPU lately: whether
// the 90th percentile of the time its goroutines waited to run, over one
// of the readings of the last hold, was above limit. It reads the runtime
// at most once per every. The verdict holds for a while because a late
// answer is judged after the fact: the call or probe waited up to its
// deadline, and a reading taken as it returns covers only the last few
// milliseconds, in which a process given the CPU again may run calmly,
// or barely run at all (a reading with no waits says nothing).
type starvation struct {
	limit time.Duration
	every int64 // ns
	hold  int64 // ns

	origin    time.Time    // readings are spaced on the monotonic clock since
	at        atomic.Int64 // when last read, ns since origin; 0 before
	starvedAt atomic.Int64 // 1 + when a reading last said starved, ns since origin; 0 never

	mu     sync.Mutex
	sample [1]metrics.Sample
	prev   []uint64
}

// newStarvation returns a starvation with the given limit, whose verdict
// holds for 8 × limit: twice the guard's deadline, the probe's floor.
func newStarvation(limit time.Duration) *starvation {
	s := &starvation{limit: limit, every: int64(10 * time.Millisecond), hold: 8 * int64(limit), origin: time.Now()}
	s.sample[0].Name = schedLatencies
	return s
}

// check returns whether the process was starved of CPU since the last
// reading, reading anew when the last reading is older than every. The
// readings are spaced on the real monotonic clock, not the guard's: they
// measure the machine, and a test's fake clock must not freeze them.
func (s *starvation) check() bool {
	if s == nil {
		return false
	}
	now := int64(time.Since(s.origin))
	if now-s.at.Load() < s.every || !s.mu.TryLock() {
		return s.recent(now)
	}
	defer s.mu.Unlock()
	s.at.Store(now)
	metrics.Read(s.sample[:])
	if s.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return false // a runtime without the metric: never starved
	}
	h := s.sample[0].Value.Float64Histogram()
	if s.tail(h, 0.9) > s.limit.Seconds() {
		s.starvedAt.Store(now + 1)
	}
	s.prev = append(s.prev[:0], h.Counts...)
	return s.recent(now)
}

// recent reports whether a reading within hold of now said starved.
func (s *starvation) recent(now int64) bool {
	at := s.starvedAt.Load()
	return at != 0 && now-(at-1) < s.hold
}

// tail returns the upper bound, in seconds, of the bucket that holds the
// q quantile of the waits counted since the last reading (0 with none).
func (s *starvation) tail(h *metrics.Float64Histogram, q float64) float64 {
	var total uint64
	for i, n := range h.Counts {
		total += n - s.before(i)
	}
	if total == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(total)))
	var seen uint64
	for i, n := range h.Counts {
		if seen += n - s.before(i); seen >= want {
			return h.Buckets[i+1]
		}
	}
	return h.Buckets[len(h.Buckets)-1]
}

func (s *starvation) before(i int) uint64 {
	if i < len(s.prev) {
		return s.prev[i]
	}
	return 0
}
