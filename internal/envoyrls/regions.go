package envoyrls

import (
	"slices"
	"strings"

	"github.com/sluice-io/sluice/region"
)

// One limit across regions
//
// A rate_limit may say `scope: global` (sluice's extension; docs/regions.md),
// and `home: <region>`: its counters are then one limit for every region
// together, each region's instances answering Envoy from their own
// region's Redis. The rule's store keys carry region.GlobalKey's mark,
// which serve's region store reads: at the key's home the home's Redis
// decides, elsewhere a share of the limit charged at home in advance
// does, never a call across regions on the check's path. A descriptor
// that carries its own limit (an override) stays regional. A rule whose
// scope or home changes on reload counts from fresh keys, as one whose
// algorithm or unit changes.

// Scopes of a rate_limit.
const (
	scopeRegional = "regional"
	scopeGlobal   = "global"
)

// scope reads rl's scope and home into r, or records the first problem
// and returns false.
func (l *loader) scope(r *rule, rl *yamlRateLimit, path string) bool {
	switch strings.ToLower(rl.Scope) {
	case "", scopeRegional:
		if rl.Home != "" {
			l.fail(path+".home", "only a rate_limit with scope: global has a home")
			return false
		}
		return true
	case scopeGlobal:
	default:
		l.fail(path+".scope", "unknown scope '%s'; valid: regional, global", rl.Scope)
		return false
	}
	if len(l.regions) == 0 {
		l.fail(path+".scope", "scope global needs serve's store.region and store.regions (docs/regions.md)")
		return false
	}
	if rl.Home != "" && !slices.Contains(l.regions, rl.Home) {
		l.fail(path+".home", "unknown region '%s'; valid: %s", rl.Home, strings.Join(l.regions, ", "))
		return false
	}
	if !rl.Unlimited {
		if err := region.SupportsGlobal(r.algorithm, r.limit); err != nil {
			l.fail(path+".scope", "rule '%s' cannot be global: %s", r.fullKey, strings.TrimPrefix(err.Error(), "region: "))
			return false
		}
	}
	r.mark = region.GlobalPrefix(rl.Home)
	return true
}
