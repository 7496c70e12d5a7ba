package region

import "github.com/sluice-io/sluice"

// StoreOf returns the store of region name as this instance reaches it
// (Options.Regions: this region's own for Region(), the others' across
// regions), or nil for a region it does not know. A door that keeps its
// own escrow of a global limit at the limit's home (the Envoy quota
// service's region leases, internal/rlqs) takes its capacity there with
// it; nothing it does passes through the shares.
func (s *Store) StoreOf(name string) sluice.Store { return s.regions[name] }

// Find returns the region Store that store is or wraps (through
// Unwrap() sluice.Store methods, as guard.Guard's), or nil when there is
// none: a deployment without regions.
func Find(store sluice.Store) *Store {
	for range 16 { // wrappers are a few deep; a cycle is not followed
		if rs, ok := store.(*Store); ok {
			return rs
		}
		u, ok := store.(interface{ Unwrap() sluice.Store })
		if !ok {
			return nil
		}
		store = u.Unwrap()
	}
	return nil
}
