package overrides

import (
	"cmp"
	"slices"
	"strings"
)

// Set is an immutable, compiled collection of overrides that answers
// Lookup. The zero Set and a nil *Set hold none.
type Set struct {
	all []*Override
	// exact by identity and by key name: the policy's override, then
	// every policy's.
	exact    map[string][]*Override
	exactKey map[string][]*Override
	// wild and wildKey in precedence order.
	wild, wildKey []*Override
}

// NewSet compiles overrides, which must be valid, into a Set.
func NewSet(list []Override) *Set {
	s := &Set{exact: map[string][]*Override{}, exactKey: map[string][]*Override{}}
	for i := range list {
		o := &list[i]
		s.all = append(s.all, o)
		pat, byName := strings.CutPrefix(o.Identity, KeyNamePrefix)
		switch {
		case !strings.Contains(pat, "*") && byName:
			s.exactKey[pat] = append(s.exactKey[pat], o)
		case !strings.Contains(pat, "*"):
			s.exact[pat] = append(s.exact[pat], o)
		case byName:
			s.wildKey = append(s.wildKey, o)
		default:
			s.wild = append(s.wild, o)
		}
	}
	policyFirst := func(a, b *Override) int {
		// An override for the policy before one for every policy.
		return cmp.Compare(boolInt(a.Policy == ""), boolInt(b.Policy == ""))
	}
	for _, l := range s.exact {
		slices.SortFunc(l, policyFirst)
	}
	for _, l := range s.exactKey {
		slices.SortFunc(l, policyFirst)
	}
	byPrecedence := func(a, b *Override) int {
		return cmp.Or(
			cmp.Compare(literals(b.Identity), literals(a.Identity)),
			policyFirst(a, b),
			cmp.Compare(a.Identity, b.Identity),
		)
	}
	slices.SortFunc(s.wild, byPrecedence)
	slices.SortFunc(s.wildKey, byPrecedence)
	slices.SortFunc(s.all, func(a, b *Override) int {
		return cmp.Or(cmp.Compare(a.Identity, b.Identity), cmp.Compare(a.Policy, b.Policy))
	})
	return s
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Len is the number of overrides, expired ones included.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.all)
}

// All returns the overrides sorted by identity and policy. The caller must
// not modify them.
func (s *Set) All() []*Override {
	if s == nil {
		return nil
	}
	return s.all
}

// Lookup returns the override that applies to policy for identity (and
// keyName, the configured name of the identity's API key, or ""), at now
// (Unix ns), by the package's precedence; nil when none does.
func (s *Set) Lookup(identity, keyName, policy string, now int64) *Override {
	if s == nil || len(s.all) == 0 {
		return nil
	}
	applies := func(o *Override) bool {
		return (o.Policy == "" || o.Policy == policy) && o.Active(now)
	}
	for _, o := range s.exact[identity] {
		if applies(o) {
			return o
		}
	}
	if keyName != "" {
		for _, o := range s.exactKey[keyName] {
			if applies(o) {
				return o
			}
		}
	}
	// A wildcard for the identity and one for the key name: the more
	// specific of the first of each.
	var best *Override
	for _, o := range s.wild {
		if applies(o) && Match(o.Identity, identity) {
			best = o
			break
		}
	}
	if keyName != "" {
		for _, o := range s.wildKey {
			if best != nil && literals(o.Identity)-len(KeyNamePrefix) <= literals(best.Identity) {
				break
			}
			if applies(o) && Match(o.Identity[len(KeyNamePrefix):], keyName) {
				best = o
				break
			}
		}
	}
	return best
}

// Matching returns the overrides whose pattern matches identity or keyName,
// whatever their policy and expiry, for the console's look-up.
func (s *Set) Matching(identity, keyName string) []*Override {
	var out []*Override
	for _, o := range s.All() {
		pat, byName := strings.CutPrefix(o.Identity, KeyNamePrefix)
		if (byName && keyName != "" && Match(pat, keyName)) || (!byName && Match(pat, identity)) {
			out = append(out, o)
		}
	}
	return out
}
