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

// regionsProbe is the last probe of the other regions and of the shares
// held.
type regionsProbe struct {
	mu    sync.Mutex
	at    time.Time
	reach []region.Reach
	held  region.Held
	err   bool // the shares could not be read
}

// maxHeldRead bounds the tracked keys whose shares one view reads.
const maxHeldRead = 1000

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
	// Held is what this region's Redis holds in shares of those keys (up
	// to maxHeldRead of them: Read says how many were read), live now:
	// charged at their homes, not spent yet. Null when it could not be
	// read.
	Held *heldJSON `json:"held"`
}

type heldJSON struct {
	Shares int   `json:"shares"`
	Units  int64 `json:"units"`
	Debts  int   `json:"debts"`
	Read   int   `json:"read"`
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
	reach, held, heldErr := s.regionProbe(r.Context(), rs)
	for _, re := range reach {
		out.Regions = append(out.Regions, regionReachJSON{re.Region, re.OK, float64(re.RTT.Microseconds()) / 1000})
	}
	if !heldErr {
		out.Held = &heldJSON{held.Shares, held.Units, held.Debts, held.Read}
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

// regionProbe probes the other regions and reads the shares held, at
// most once per regionsReuse.
func (s *Server) regionProbe(ctx context.Context, rs *region.Store) ([]region.Reach, region.Held, bool) {
	p := &s.regionsProbe
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reach == nil || time.Since(p.at) > regionsReuse {
		// A region cut off does not answer: the view waits a second for
		// it, not the fetch timeout.
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		var err error
		p.held, err = rs.Held(ctx, maxHeldRead)
		p.err = err != nil
		if err != nil {
			s.log.Warn("console: reading the region's shares failed", "err", err)
		}
		p.reach, p.at = rs.Reach(ctx), time.Now()
	}
	return p.reach, p.held, p.err
}
