package lease

import (
	"context"
	"fmt"

	"github.com/sluice-io/sluice"
)

// Apply implements sluice.Store. OpAllow on a leased algorithm is answered
// from the key's lease when the key is hot; OpPeek from the lease when it
// holds the cost; OpReset drops the lease and resets the key in the store;
// everything else goes to the wrapped store.
func (s *Store) Apply(ctx context.Context, op sluice.Op, req sluice.Request) (sluice.Decision, error) {
	if (!req.UseLease && !s.all) || req.MaxWait != 0 || req.ReservedAhead != 0 {
		// A reservation is decided by the store: a lease holds capacity
		// for now, not for the future.
		return s.inner.Apply(ctx, op, req)
	}
	e := s.known(op, &req)
	if e == nil {
		if err := req.Validate(op); err != nil {
			return sluice.Decision{}, fmt.Errorf("lease: %w", err)
		}
	}
	if leasable(&req) && !s.closed() {
		switch op {
		case sluice.OpAllow:
			if e == nil {
				e = s.entry(&req)
			}
			if e != nil {
				d, _, out, err := s.take(ctx, e, req.Cost, true)
				if err != nil {
					return sluice.Decision{}, err
				}
				if out != toStore {
					return d, nil // counted in e (take)
				}
				s.direct.Add(1)
				d, err = s.inner.Apply(ctx, op, req)
				if err == nil {
					e.noteDirect(d, req.Cost)
				}
				return d, err
			}
		case sluice.OpPeek:
			if d, ok := s.peek(&req, true); ok {
				return d, nil // counted in e (peek)
			}
		case sluice.OpReset:
			s.forget(req.Key)
		}
	}
	s.direct.Add(1)
	return s.inner.Apply(ctx, op, req)
}

// known returns the lease of an OpAllow that needs no validation of its
// own: one on a key leased under the same algorithm and limit, which were
// validated with the request that created the lease. What Validate checks
// besides the limit is checked here, for OpAllow: a cost of 1 to the
// limit's capacity, no AdmittedAgo (Apply has sent a reservation,
// MaxWait or ReservedAhead, to the store already), and a leasable
// algorithm (a concurrency key, which needs a lease id, never is). It
// spares the hot path Validate's limit checks (their 128-bit refill
// times; TestLeasedKeyStillValidated).
func (s *Store) known(op sluice.Op, req *sluice.Request) *entry {
	if op != sluice.OpAllow || req.AdmittedAgo != 0 || req.Cost < 1 {
		return nil
	}
	e, ok := s.keys.Load(req.Key)
	if !ok || e.algo != req.Algorithm || e.limit != req.Limit || req.Cost > e.capacity || !Leasable(e.algo) {
		return nil
	}
	return e
}

// peek answers an OpPeek from the lease if it holds req's cost; with
// count, the decision is counted in the lease's Stats.
func (s *Store) peek(req *sluice.Request, count bool) (sluice.Decision, bool) {
	e, ok := s.keys.Load(req.Key)
	if !ok || e.algo != req.Algorithm || e.limit != req.Limit {
		return sluice.Decision{}, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := s.decisionNow(e) // under the lock, as in take
	if now >= e.expiry || e.tokens < max(req.Cost, 1) {
		return sluice.Decision{}, false
	}
	if count {
		s.count(e, false)
	}
	return e.allowed(now), true
}

// ApplyAll implements sluice.Store. An OpAllow batch takes what it can
// from its members' leases and sends the rest to the wrapped store in one
// ApplyAll; if that denies, the units taken locally go back to their
// leases, so the batch stays all or nothing. A member whose key the store
// has no chunk for denies the batch at once, charging nothing: the other
// members are peeked (from their leases, else in one store call), which is
// what a denied batch reports for them.
func (s *Store) ApplyAll(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	if (!s.all && !anyLeased(reqs)) || anyReserves(reqs) {
		return s.inner.ApplyAll(ctx, op, reqs)
	}
	for i := range reqs {
		if err := reqs[i].Validate(op); err != nil {
			return nil, fmt.Errorf("lease: request %d: %w", i, err)
		}
	}
	if op != sluice.OpAllow || s.closed() {
		if op == sluice.OpReset {
			for i := range reqs {
				s.forget(reqs[i].Key)
			}
		}
		s.direct.Add(uint64(len(reqs)))
		return s.inner.ApplyAll(ctx, op, reqs)
	}
	if len(reqs) == 1 {
		d, err := s.Apply(ctx, op, reqs[0])
		if err != nil {
			return nil, err
		}
		return []sluice.Decision{d}, nil
	}
	type taken struct {
		e    *entry
		gen  uint64
		cost int64
	}
	var localBuf [4]taken // on the stack for a batch of up to 4 leased members
	local := localBuf[:0]
	undo := func() {
		for _, t := range local {
			s.putBack(t.e, t.gen, t.cost)
		}
	}
	ds := make([]sluice.Decision, len(reqs))
	rest := make([]int, 0, len(reqs))
	restE := make([]*entry, 0, len(reqs)) // the lease of each of rest, or nil
	for i := range reqs {
		r := &reqs[i]
		var e *entry
		if leasable(r) && (r.UseLease || s.all) {
			e = s.entry(r)
		}
		if e == nil {
			rest, restE = append(rest, i), append(restE, nil)
			continue
		}
		d, gen, out, err := s.take(ctx, e, r.Cost, false)
		if err != nil {
			undo()
			return nil, err
		}
		switch out {
		case fromLease:
			ds[i] = d
			local = append(local, taken{e, gen, r.Cost})
		case toStore:
			rest, restE = append(rest, i), append(restE, e)
		case denied:
			undo()
			s.hits.Add(1)
			s.localDenials.Add(1)
			return s.deniedBatch(ctx, reqs, i, d)
		}
	}
	s.hits.Add(uint64(len(local)))
	if len(rest) == 0 {
		return ds, nil
	}
	sub := make([]sluice.Request, len(rest))
	for j, i := range rest {
		sub[j] = reqs[i]
	}
	s.direct.Add(uint64(len(rest)))
	sds, err := s.inner.ApplyAll(ctx, op, sub)
	if err != nil {
		undo()
		return nil, err
	}
	if len(sds) != len(sub) {
		undo()
		return nil, fmt.Errorf("lease: store gave %d decisions for %d requests", len(sds), len(sub))
	}
	ok := true
	for j, i := range rest {
		ds[i] = sds[j]
		ok = ok && sds[j].Allowed
	}
	for j, e := range restE {
		if e != nil {
			c := reqs[rest[j]].Cost
			if !ok {
				c = 0 // the batch charged nothing
			}
			e.noteDirect(sds[j], c)
		}
	}
	if !ok {
		undo() // the leased members' limits alone would admit: Allowed stays true
	}
	return ds, nil
}

// deniedBatch completes a batch denied by member i's lease: the others are
// peeked, from their leases when these hold their cost, else in one
// OpPeek batch on the store.
func (s *Store) deniedBatch(ctx context.Context, reqs []sluice.Request, i int, d sluice.Decision) ([]sluice.Decision, error) {
	ds := make([]sluice.Decision, len(reqs))
	ds[i] = d
	var rest []int
	for j := range reqs {
		if j == i {
			continue
		}
		if leasable(&reqs[j]) {
			if pd, ok := s.peek(&reqs[j], false); ok {
				ds[j] = pd
				continue
			}
		}
		rest = append(rest, j)
	}
	if len(rest) == 0 {
		return ds, nil
	}
	sub := make([]sluice.Request, len(rest))
	for k, j := range rest {
		sub[k] = reqs[j]
	}
	pds, err := s.inner.ApplyAll(ctx, sluice.OpPeek, sub)
	if err != nil {
		return nil, err
	}
	if len(pds) != len(sub) {
		return nil, fmt.Errorf("lease: store gave %d decisions for %d requests", len(pds), len(sub))
	}
	for k, j := range rest {
		ds[j] = pds[k]
	}
	return ds, nil
}

func anyLeased(reqs []sluice.Request) bool {
	for i := range reqs {
		if reqs[i].UseLease {
			return true
		}
	}
	return false
}

// anyReserves reports a reservation (sluice.Request.MaxWait) or its refund
// (ReservedAhead) in reqs: the batch goes to the store whole.
func anyReserves(reqs []sluice.Request) bool {
	for i := range reqs {
		if reqs[i].MaxWait != 0 || reqs[i].ReservedAhead != 0 {
			return true
		}
	}
	return false
}

// leasable reports whether req may be answered from a lease: a leased
// algorithm, and not a calendar window (whose windows the lease's
// epoch-aligned chunk sizing does not know; they go to the store).
func leasable(req *sluice.Request) bool {
	return Leasable(req.Algorithm) && req.Limit.Calendar.IsZero()
}
