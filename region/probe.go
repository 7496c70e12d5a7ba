package region

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluice-io/sluice"
)

// Reach is whether another region's store answered this instance, for
// an operator's view (the console).
type Reach struct {
	// Region names the region.
	Region string
	// OK reports that its store answered within the probe's deadline.
	OK bool
	// RTT is how long its answer took, the round trip of a fetch.
	RTT time.Duration
}

// probeKey is the key Reach peeks: a peek changes nothing.
const probeKey = "sluice:region-probe"

// Reach asks every other region's store at once for a peek of a probe key
// and reports, by region name, which answered before ctx ended and how
// fast. Each call costs one call across each link: it is for operators'
// views, not the decision path.
func (s *Store) Reach(ctx context.Context) []Reach {
	var mu sync.Mutex
	var out []Reach
	var wg sync.WaitGroup
	req := sluice.Request{Key: probeKey, Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 1, Period: time.Second}}
	for name, st := range s.regions {
		if name == s.region {
			continue
		}
		wg.Go(func() {
			t0 := time.Now()
			_, err := st.Apply(ctx, sluice.OpPeek, req)
			r := Reach{Region: name, OK: err == nil, RTT: time.Since(t0)}
			mu.Lock()
			out = append(out, r)
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b Reach) int { return strings.Compare(a.Region, b.Region) })
	return out
}

// FailurePolicy is what this Store answers for a global key when its home
// cannot be reached and the region's share is spent (Options.Policy).
func (s *Store) FailurePolicy() Policy { return s.policy }
