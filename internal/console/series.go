package console

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Totals are cumulative counts of one series, as counters hold them.
type Totals struct {
	Decisions, Denials float64
}

// SeriesKey names a series: a policy under a tier.
type SeriesKey struct {
	Policy string `json:"policy"`
	Tier   string `json:"tier"`
}

// Point is one sample: per-second rates over the interval before At.
type Point struct {
	At        int64   `json:"t"` // Unix ms
	Decisions float64 `json:"d"`
	Denials   float64 `json:"x"`
}

// maxSeries bounds the series kept: policies × tiers of the config.
const maxSeries = 512

// Series keeps the last Window of per-second decision and denial rates of
// every series, sampled from cumulative counts. It is safe for concurrent
// use.
type Series struct {
	read     func() map[SeriesKey]Totals
	interval time.Duration
	keep     int
	mu       sync.Mutex
	last     map[SeriesKey]Totals
	lastAt   time.Time
	points   map[SeriesKey][]Point
}

// NewSeries samples read every interval, keeping Window of points.
func NewSeries(read func() map[SeriesKey]Totals, interval time.Duration) *Series {
	return &Series{read: read, interval: interval, keep: max(2, int(Window/interval)), points: map[SeriesKey][]Point{}}
}

// Interval is the time between points.
func (s *Series) Interval() time.Duration { return s.interval }

// Sample takes one point at now.
func (s *Series) Sample(now time.Time) {
	cur := s.read()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last != nil {
		secs := now.Sub(s.lastAt).Seconds()
		if secs <= 0 {
			return
		}
		for k, t := range cur {
			p := s.last[k]
			pts, ok := s.points[k]
			if !ok && len(s.points) >= maxSeries {
				continue
			}
			pt := Point{At: now.UnixMilli(), Decisions: max(0, t.Decisions-p.Decisions) / secs, Denials: max(0, t.Denials-p.Denials) / secs}
			pts = append(pts, pt)
			if len(pts) > s.keep {
				pts = slices.Delete(pts, 0, len(pts)-s.keep)
			}
			s.points[k] = pts
		}
	}
	s.last, s.lastAt = cur, now
}

// Run samples every interval until ctx is done.
func (s *Series) Run(ctx context.Context) error {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	s.Sample(time.Now())
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			s.Sample(now)
		}
	}
}

// SeriesPoints is one series and its points, oldest first.
type SeriesPoints struct {
	SeriesKey
	Points []Point `json:"points"`
}

// Snapshot returns a copy of every series, sorted by policy and tier.
func (s *Series) Snapshot() []SeriesPoints {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]SeriesPoints, 0, len(s.points))
	for k, pts := range s.points {
		out = append(out, SeriesPoints{k, slices.Clone(pts)})
	}
	slices.SortFunc(out, func(a, b SeriesPoints) int {
		if a.Policy != b.Policy {
			if a.Policy < b.Policy {
				return -1
			}
			return 1
		}
		if a.Tier < b.Tier {
			return -1
		} else if a.Tier > b.Tier {
			return 1
		}
		return 0
	})
	return out
}
