package server

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluice-io/sluice/region"
)

// This file serves the console's view of the regions (GET
// /ui/api/regions, an admin session or the admin token, as the upstreams'
// view): the region this instance decides for, whether each other
// region's store answers it and how fast (a peek across each link), the
// global policies and their homes, what decided this instance's global
// keys (home, share, denied, the failure policy), its fetches and the
// units it fetched, refunded and stranded, and the failure policies in
// force. It names regions and policies from the config, never a key.
// Without store.region it answers 404.

// regionsReuse is how long one probe of the other regions serves the
// console's callers: a probe is a call across each link.
const regionsReuse = 2 * time.Second

// regionsProbe is the last probe of the other regions.
type regionsProbe struct {
	mu    sync.Mutex
	at    time.Time
	reach []region.Reach
}

// regionStore returns the region store under the guard, nil without
// regions.
func (s *storeGuard) regionStore() *region.Store {
	rs, _ := s.g.Unwrap().(*region.Store)
	return rs
}

type regionReachJSON struct {
	Name      string  `json:"name"`
	Reachable bool    `json:"reachable"`
	RTTMS     float64 `json:"rtt_ms"`
}

type regionsJSON struct {
	Region string `json:"region"`
	// FailurePolicy answers a global key cut off from its home, its
	// share spent; StoreFailurePolicy answers when this region's own
	// store fails (the guard's).
	FailurePolicy      string            `json:"failure_policy"`
	StoreFailurePolicy string            `json:"store_failure_policy"`
	Regions            []regionReachJSON `json:"regions"`
	Policies           []globalPolicy    `json:"policies"`
	// Decisions, Fetches and Units are this instance's counters since it
	// started (sluice_region_* in /metrics).
	Decisions map[string]uint64 `json:"decisions"`
	Fetches   map[string]uint64 `json:"fetches"`
	Units     map[string]uint64 `json:"units"`
	// Keys is the global keys this instance tracks the demand of.
	Keys int64 `json:"keys"`
}

type globalPolicy struct {
	Name string `json:"name"`
	Home string `json:"home"` // "" for a home by a hash of the key
}

func (s *Server) handleRegions(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.authorizeConsole(w, r, "regions"); !ok {
		return
	}
	rs := s.guard.regionStore()
	if rs == nil {
		writeError(w, http.StatusNotFound, "no regions: store.region is not set (docs/regions.md)")
		return
	}
	cfg := s.cfg.Load()
	out := regionsJSON{Region: rs.Region(), FailurePolicy: rs.FailurePolicy().String(), StoreFailurePolicy: cfg.Store.FailurePolicy,
		Regions: []regionReachJSON{}, Policies: []globalPolicy{}}
	for _, re := range s.regionReach(r.Context(), rs) {
		out.Regions = append(out.Regions, regionReachJSON{re.Region, re.OK, float64(re.RTT.Microseconds()) / 1000})
	}
	for name, home := range cfg.Store.GlobalPolicies {
		out.Policies = append(out.Policies, globalPolicy{name, home})
	}
	slices.SortFunc(out.Policies, func(a, b globalPolicy) int { return strings.Compare(a.Name, b.Name) })
	st := rs.Stats()
	out.Decisions = map[string]uint64{"home": st.Home, "share": st.Share, "denied": st.Denied, "policy": st.Policy}
	out.Fetches = map[string]uint64{"sent": st.Fetches, "denied": st.FetchDenied, "error": st.FetchErrors}
	out.Units = map[string]uint64{"fetched": st.Fetched, "refunded": st.Refunded, "stranded": st.Stranded}
	out.Keys = st.Keys
	writeAny(w, out)
}

// regionReach probes the other regions, at most once per regionsReuse.
func (s *Server) regionReach(ctx context.Context, rs *region.Store) []region.Reach {
	p := &s.regionsProbe
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reach == nil || time.Since(p.at) > regionsReuse {
		// A region cut off does not answer: the view waits a second for
		// it, not the fetch timeout.
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		p.reach, p.at = rs.Reach(ctx), time.Now()
	}
	return p.reach
}
