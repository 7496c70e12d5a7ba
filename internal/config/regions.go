package config

import (
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sluice-io/sluice/region"
)

// Scopes of a policy.
const (
	ScopeRegional = "regional"
	ScopeGlobal   = "global"
)

// Modes of a global policy.
const (
	ModeExact = "exact"
	ModeAsync = "async"
)

// compileRegions checks store.region, store.regions and store.global.
func (v *validator) compileRegions(s *StoreSection) {
	if s.Region == "" {
		if len(s.Regions) > 0 {
			v.addf("store.regions", "needs store.region, the region this instance runs in")
		}
		return
	}
	if !nameRE.MatchString(s.Region) {
		v.addf("store.region", "region name must be 1-64 letters, digits, '_', '-' or '.'")
	}
	if s.IsMemory() {
		v.addf("store.region", "regions need a Redis store.url, this region's store")
	}
	for _, name := range sortedKeys(s.Regions) {
		r := s.Regions[name]
		path := "store.regions." + name
		switch {
		case !nameRE.MatchString(name):
			v.addf(path, "region name must be 1-64 letters, digits, '_', '-' or '.'")
		case name == s.Region:
			v.addf(path, "is this instance's own region, whose store is store.url; list only the others")
		}
		if r.URLEnv != "" {
			if r.URL = os.Getenv(r.URLEnv); r.URL == "" {
				v.addf(path+".url_env", "environment variable %s is not set", r.URLEnv)
				continue
			}
		}
		if !isRedisURL(r.URL) {
			v.addf(path+".url", "want a redis://, rediss://, redis+cluster:// or redis+sentinel:// URL, not %q", redactURL(r.URL))
		}
		s.Regions[name] = r
	}
	if _, err := region.ParsePolicy(s.Global.FailurePolicy); err != nil {
		v.addf("store.global.failure_policy", "unknown policy %q; valid: fail_closed, fail_open", s.Global.FailurePolicy)
	}
	for path, d := range map[string]int64{"horizon": int64(s.Global.Horizon), "ttl": int64(s.Global.TTL), "fetch_timeout": int64(s.Global.FetchTimeout), "clock_skew": int64(s.Global.ClockSkew), "sync_interval": int64(s.Global.SyncInterval), "stale_after": int64(s.Global.StaleAfter)} {
		if d < 0 {
			v.addf("store.global."+path, "must not be negative")
		}
	}
	interval, stale := def(s.Global.SyncInterval, region.DefaultSyncInterval), def(s.Global.StaleAfter, region.DefaultStaleAfter)
	if s.Global.SyncInterval > 0 && s.Global.SyncInterval < 10*time.Millisecond {
		v.addf("store.global.sync_interval", "must be at least 10ms (a round of deliveries per key and region each)")
	}
	if stale < 2*interval {
		v.addf("store.global.stale_after", "%s must be at least twice sync_interval (%s), plus two round trips to the farthest region", stale, interval)
	}
}

func def(v, d time.Duration) time.Duration {
	if v == 0 {
		return d
	}
	return v
}

// compileScope reads a policy's scope and home.
func (v *validator) compileScope(path string, p *PolicySection, pol *Policy, s *StoreSection) {
	switch strings.ToLower(p.Scope) {
	case "", ScopeRegional:
		if p.Home != "" {
			v.addf(path+".home", "only a policy with scope: global has a home")
		}
		if p.Mode != "" {
			v.addf(path+".mode", "only a policy with scope: global has a mode")
		}
		return
	case ScopeGlobal:
	default:
		v.addf(path+".scope", "unknown scope %q; valid: regional, global", p.Scope)
		return
	}
	if s.Region == "" {
		v.addf(path+".scope", "global needs store.region and store.regions (docs/regions.md)")
		return
	}
	if err := region.SupportsGlobal(pol.Algorithm, pol.Limit); err != nil {
		v.addf(path+".scope", "%s", strings.TrimPrefix(err.Error(), "region: "))
	}
	if pol.MaxWait != 0 || pol.HasDelay {
		v.addf(path+".scope", "a global policy takes no max_wait or delay: shares decide at once")
	}
	if p.Home != "" && p.Home != s.Region {
		if _, ok := s.Regions[p.Home]; !ok {
			names := sortedKeys(s.Regions)
			if !slices.Contains(names, s.Region) {
				names = append([]string{s.Region}, names...)
			}
			v.addf(path+".home", "unknown region %q; valid: %s", p.Home, strings.Join(names, ", "))
		}
	}
	pol.Global, pol.Home = true, p.Home
	if s.GlobalPolicies == nil {
		s.GlobalPolicies = map[string]string{}
	}
	s.GlobalPolicies[pol.Name] = p.Home
	switch strings.ToLower(p.Mode) {
	case "", ModeExact:
	case ModeAsync:
		if p.Home != "" {
			v.addf(path+".home", "an async policy has no home: every region decides on its own store")
		}
		pol.Async = true
		if s.AsyncPolicies == nil {
			s.AsyncPolicies = map[string]bool{}
		}
		s.AsyncPolicies[pol.Name] = true
	default:
		v.addf(path+".mode", "unknown mode %q; valid: exact, async", p.Mode)
	}
}

// RegionNames names every region, this instance's (store.region) first,
// then store.regions' in name order; nil without store.region. The doors
// check a global limit's home against them.
func (s *StoreSection) RegionNames() []string {
	if s.Region == "" {
		return nil
	}
	return append([]string{s.Region}, sortedKeys(s.Regions)...)
}
