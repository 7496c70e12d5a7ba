package region

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

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

// Held is what this region's ledger holds of the global keys an instance
// tracks, for an operator's view.
type Held struct {
	// Shares counts the live shares holding units; Units sums them.
	Shares int
	Units  int64
	// Debts counts the shares in debt (a charge learnt after the
	// response, taken beyond the share: the next fetch pays it).
	Debts int
	// Read is the number of tracked keys read, at most the max asked.
	Read int
}

// Held reads the shares this region's ledger holds for up to max of the
// keys this instance tracks (one HMGET each, pipelined; a key of a region
// whose home is elsewhere), by the ledger's clock. It is for operators'
// views, not the decision path.
func (s *Store) Held(ctx context.Context, max int) (Held, error) {
	var out Held
	if max <= 0 {
		return out, nil
	}
	var keys []string
	s.keys.Range(func(k string, _ *entry) bool {
		keys = append(keys, k)
		return len(keys) < max
	})
	if len(keys) == 0 {
		return out, nil
	}
	now, err := s.led.time(ctx)
	if err != nil {
		return out, err
	}
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = s.led.client.B().Hmget().Key(s.led.key(k)).Field("n", "exp").Build()
	}
	for _, r := range s.led.client.DoMulti(ctx, cmds...) {
		vs, err := r.ToArray()
		if err != nil {
			return out, unavailable("share read", err)
		}
		out.Read++
		if len(vs) != 2 {
			continue
		}
		n, _ := vs[0].AsInt64()
		exp, _ := vs[1].AsInt64()
		switch {
		case n < 0:
			out.Debts++
		case n > 0 && exp > now:
			out.Shares++
			out.Units += n
		}
	}
	return out, nil
}
