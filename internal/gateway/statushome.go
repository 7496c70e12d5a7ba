package gateway

// The global remaining in /v1/status
//
// Outside a global limit's or budget's home, the region decides it from
// its share. For /v1/status the gateway reads the home's state too and
// answers what this region can still spend: what the home has left plus
// this region's share (remaining_source "home"), or the share's figure
// when the home does not answer in time (remaining_source "share").
// Package homeread keeps the homes' answers, shared with `sluice serve`'s
// /v1/status: per store key for a second, shared by every client of that
// key on this instance (an org's budget by all its keys) and by
// concurrent calls, so that a flood of status calls costs the home at
// most one read per global key per second per instance; the bounds of the
// answer are written there.

import (
	"context"
	"sync"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/homeread"
)

// Bounds of the home reads of /v1/status.
const (
	homeStatusReuse   = homeread.DefaultReuse
	homeStatusTimeout = homeread.DefaultTimeout
)

// newHomeReads returns the cache of the homes' answers for g's store
// (reading nothing without regions), aging by g.now.
func (g *Gateway) newHomeReads(st sluice.Store) *homeread.Cache {
	return homeread.New(regionLayer(st), homeread.Options{Reuse: homeStatusReuse, Timeout: homeStatusTimeout, Now: func() time.Time { return g.now() }})
}

// fromHome reads, at once, the home's state of each global row i of a
// status (specs[i], reqs[i]) that this region answered from its share
// (ds[i]); home[i] is nil where none was read.
func (g *Gateway) fromHome(ctx context.Context, specs []*spec, reqs []sluice.Request, ds []sluice.Decision) []*sluice.Decision {
	if !g.homeReads.Enabled() {
		return nil
	}
	home := make([]*sluice.Decision, len(ds))
	var wg sync.WaitGroup
	for i := range ds {
		if specs[i].mark == "" || ds[i].Source != sluice.FromShare {
			continue
		}
		wg.Go(func() {
			if d, ok := g.homeReads.Get(ctx, reqs[i]); ok {
				home[i] = &d
			}
		})
	}
	wg.Wait()
	return home
}

// withHome is what a status row answers for spec s, decided d in this
// region, with hd the home's decision when it was read (homeread.Merge);
// and the row's remaining_source, "" for a regional spec.
func withHome(s *spec, d sluice.Decision, hd *sluice.Decision, capacity int64) (sluice.Decision, string) {
	switch {
	case s.mark == "":
		return d, ""
	case d.Source != sluice.FromShare:
		return d, homeread.SourceHome
	case hd == nil:
		return d, homeread.SourceShare
	}
	return homeread.Merge(d, *hd, 0, capacity), homeread.SourceHome
}
