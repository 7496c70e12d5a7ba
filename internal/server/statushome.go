package server

// The global remaining in /v1/status: outside a global policy's home, the
// region decides it from its share, and /v1/status reads the home's state
// too (package homeread, shared with the gateway's /v1/status: one read
// per key per second per instance, shared by concurrent calls, bounded by
// a timeout, failures kept as long), answering the home's remaining plus
// this region's share with remaining_source "home", or the share's figure
// with remaining_source "share" when the home did not answer in time.

import (
	"context"
	"sync"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/homeread"
)

// newHomeReads returns the cache of the homes' answers for s's store
// (reading nothing without regions), aging by s's clock.
func (s *Server) newHomeReads() *homeread.Cache {
	return homeread.New(s.guard.regionStore(), homeread.Options{Now: func() time.Time { return time.Unix(0, s.clk.Now()) }})
}

// withHome sets res's remaining_source for each exact global policy of a
// status, and for those this region answered from its share, adds the
// home's remaining when the home answered (homeread.Merge), then combines
// the decisions again.
func (s *Server) withHome(ctx context.Context, res *outcome) {
	var wg sync.WaitGroup
	for i := range res.targets {
		t, d := &res.targets[i], res.decisions[i]
		if !t.policy.Global || t.policy.Async || d.Degraded {
			continue
		}
		if res.sources == nil {
			res.sources = make([]string, len(res.targets))
		}
		res.sources[i] = homeread.SourceHome
		if d.Source != sluice.FromShare {
			continue // decided at home, in this region
		}
		res.sources[i] = homeread.SourceShare
		if !s.homeReads.Enabled() {
			continue
		}
		wg.Go(func() {
			if hd, ok := s.homeReads.Get(ctx, t.req); ok {
				res.decisions[i] = homeread.Merge(d, hd, t.req.Cost, t.req.Capacity())
				res.sources[i] = homeread.SourceHome
			}
		})
	}
	wg.Wait()
	if res.sources != nil {
		s.combine(res)
	}
}
