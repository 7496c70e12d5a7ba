package region

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluice-io/sluice"
)

// ErrNotHomed means PeekHome was asked for a key that has no home: a
// regional key, or an asynchronous one (decided in each region).
var ErrNotHomed = errors.New("region: the key has no home")

// PeekHome reads an exact global key's state at its home store, changing
// nothing: the home's OpPeek decision for req, what the home has left of
// the key's capacity (the units regions hold in their shares are charged
// there already and not counted). A key whose home is this region is read
// from this region's store. When the home is another region's, the call
// crosses regions: it is for views such as a status answer, never for a
// decision's path; bound it with ctx. ErrNotHomed for a regional or an
// asynchronous key.
func (s *Store) PeekHome(ctx context.Context, req sluice.Request) (sluice.Decision, error) {
	if s.global == nil || !s.global(&req) || (s.async != nil && s.async(&req)) {
		return sluice.Decision{}, ErrNotHomed
	}
	home := s.home(req.Key)
	hs := s.regions[home]
	if hs == nil {
		return sluice.Decision{}, fmt.Errorf("%w: home %q of a global key", ErrUnknownRegion, home)
	}
	req.MaxWait, req.Lease, req.UseLease, req.ReservedAhead = 0, "", false, 0
	d, err := hs.Apply(ctx, sluice.OpPeek, req)
	if err != nil {
		return sluice.Decision{}, fmt.Errorf("region: peek at home %s: %w", home, err)
	}
	return d, nil
}
