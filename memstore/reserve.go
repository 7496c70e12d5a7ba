package memstore

import (
	"fmt"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
)

// gcraReserve is a GCRA reservation (Request.MaxWait) on one key, lock-free
// like gcraAllow: one clock read, one map lookup, one compare-and-swap.
func (s *Store) gcraReserve(req sluice.Request) (sluice.Decision, error) {
	if err := req.Validate(sluice.OpAllow); err != nil {
		return sluice.Decision{}, fmt.Errorf("memstore: %w", err)
	}
	p, err := s.gcraParams(req.Limit)
	if err != nil {
		return sluice.Decision{}, fmt.Errorf("memstore: %w", err)
	}
	for {
		c := s.gcraCell(req.Key, p.Tau)
		for {
			now := s.now()
			old := c.tat.Load()
			if old == dead {
				break
			}
			d, tat := algo.GCRAReserve(old, p, req.Cost, req.MaxWait, now)
			if !d.Allowed || c.tat.CompareAndSwap(old, tat) {
				if d.Allowed {
					c.setSpan(p.Tau)
				}
				return d, nil
			}
		}
	}
}
