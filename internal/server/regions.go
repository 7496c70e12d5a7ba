package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"strings"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/metrics"
	"github.com/sluice-io/sluice/redisstore"
	"github.com/sluice-io/sluice/region"
)

// openRegions puts a region.Store over this region's store (local, over
// the Redis store ledger) when store.region is set: the policies with
// scope global are held to one limit across the regions of store.regions,
// whose stores it opens here, and the rest pass through. The scopes are
// the starting configuration's (restart-only).
func openRegions(ctx context.Context, sc config.StoreSection, local sluice.Store, ledger *redisstore.Store, localCloser io.Closer, log *slog.Logger) (sluice.Store, io.Closer, error) {
	closers := []io.Closer{localCloser}
	closeAll := func() error {
		var errs []error
		for i := len(closers) - 1; i >= 0; i-- {
			errs = append(errs, closers[i].Close())
		}
		return errors.Join(errs...)
	}
	fetchTimeout := sc.Global.FetchTimeout
	if fetchTimeout == 0 {
		fetchTimeout = region.DefaultFetchTimeout
	}
	stores := map[string]sluice.Store{sc.Region: local}
	names := []string{sc.Region}
	for name, r := range sc.Regions {
		// Calls across regions are fetches and refunds, each with its own
		// deadline (FetchTimeout); no deny cache: a denied fetch is asked
		// again for what is left.
		s, err := redisstore.New(ctx, redisstore.Options{URL: r.URL, Timeout: fetchTimeout, DisableDenyCache: true, Logger: log})
		if err != nil {
			_ = closeAll()
			return nil, nil, fmt.Errorf("server: open the store of region %s: %w", name, err)
		}
		closers = append(closers, s)
		stores[name] = s
		names = append(names, name)
	}
	policy, err := region.ParsePolicy(sc.Global.FailurePolicy)
	if err != nil {
		_ = closeAll()
		return nil, nil, fmt.Errorf("server: %w", err)
	}
	globals, async := maps.Clone(sc.GlobalPolicies), maps.Clone(sc.AsyncPolicies)
	hash := region.HashHome(names)
	rs, err := region.New(region.Options{
		Region:  sc.Region,
		Regions: stores,
		Ledger:  ledger.Client(),
		Global:  func(req *sluice.Request) bool { return isGlobal(globals, req.Key) },
		// mode: async is a policy's (the HTTP API's); the other doors'
		// global keys are exact.
		Async:        func(req *sluice.Request) bool { return async[policyOfKey(req.Key)] },
		Home:         func(key string) string { return homeOf(globals, hash, key) },
		Horizon:      sc.Global.Horizon,
		TTL:          sc.Global.TTL,
		FetchTimeout: fetchTimeout,
		ClockSkew:    sc.Global.ClockSkew,
		TrustHistory: sc.Global.TrustHistory,
		SyncInterval: sc.Global.SyncInterval,
		StaleAfter:   sc.Global.StaleAfter,
		Policy:       policy,
		Logger:       log,
	})
	if err != nil {
		_ = closeAll()
		return nil, nil, fmt.Errorf("server: %w", err)
	}
	closers = append(closers, closerFunc(rs.Close))
	return rs, closerFunc(closeAll), nil
}

// isGlobal reports whether key is held to one limit across regions: a
// key of a policy with scope global (the HTTP API's), or a key another
// door marked global (region.GlobalKey: the Envoy rate limit service's
// rules and the AI gateway's limits and budgets with scope global).
func isGlobal(globals map[string]string, key string) bool {
	if _, ok := region.KeyScope(key); ok {
		return true
	}
	_, ok := globals[policyOfKey(key)]
	return ok
}

// homeOf is a global key's home region: the one its policy or its mark
// names, else hash's.
func homeOf(globals map[string]string, hash func(string) string, key string) string {
	if h, ok := region.KeyScope(key); ok {
		if h != "" {
			return h
		}
		return hash(key)
	}
	if h := globals[policyOfKey(key)]; h != "" {
		return h
	}
	return hash(key)
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// policyOfKey is the policy a key of storeKey's form belongs to, or ""
// for a key of another form (the other doors').
func policyOfKey(key string) string {
	rest, ok := strings.CutPrefix(key, "sluice:{")
	if !ok {
		return ""
	}
	// The identity's tag holds no '}' (tagIdentity), and a policy's name
	// and an algorithm's no ':'.
	i := strings.Index(rest, "}:")
	if i < 0 {
		return ""
	}
	rest = rest[i+2:]
	j := strings.LastIndexByte(rest, ':')
	if j < 0 {
		return ""
	}
	if _, err := sluice.ParseAlgorithm(rest[j+1:]); err != nil {
		return "" // not a policy's key (the console's and overrides' keys share the prefix)
	}
	return rest[:j]
}

// regionStats exports a region.Store's counters.
func regionStats(rs *region.Store) *metrics.RegionStats {
	st := rs.Stats()
	return &metrics.RegionStats{
		Region: rs.Region(), Home: st.Home, Share: st.Share, Denied: st.Denied, Policy: st.Policy,
		Fetches: st.Fetches, FetchDenied: st.FetchDenied, FetchErrors: st.FetchErrors,
		Fetched: st.Fetched, Refunded: st.Refunded, Stranded: st.Stranded, Allotted: st.Allotted,
		Async: st.Async, Synced: st.Synced, SyncErrors: st.SyncErrors, Quarantines: st.Quarantines,
	}
}

// DecidedByHeader names, on a forward-auth answer (/v1/authz) that a
// global policy took part in, the tier that decided it: "home", "share" or
// "policy" (appendDecidedBy). With several global policies, the one that
// denied names it, else the weakest tier (policy, then share, then home).
// The gateway sets the same header (gateway.DecidedByHeader).
const DecidedByHeader = "Sluice-Decided-By"

// decidedBy is the tier that decided d, a global policy's decision.
func decidedBy(d sluice.Decision) string {
	switch {
	case d.Degraded:
		return "policy"
	case d.Source == sluice.FromShare:
		return "share"
	}
	return "home"
}

// setDecidedBy sets DecidedByHeader when a global policy took part in res.
func setDecidedBy(h http.Header, res *outcome) {
	rank := map[string]int{"home": 1, "region": 1, "share": 2, "policy": 3}
	by, denied := "", false
	for i, t := range res.targets {
		d := res.decisions[i]
		if !t.policy.Global && d.Source != sluice.FromShare {
			continue
		}
		tier := decidedBy(d)
		if tier == "home" && t.policy.Async {
			tier = "region"
		}
		switch {
		case denied:
		case !d.Allowed:
			by, denied = tier, true
		case rank[tier] > rank[by]:
			by = tier
		}
	}
	if by != "" {
		h.Set(DecidedByHeader, by)
	}
}
