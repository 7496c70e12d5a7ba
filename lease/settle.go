package lease

// Settling into the lease: a refund or an overshoot charge of a leased key
// applied to the key's chunk, with no store call.

import (
	"github.com/sluice-io/sluice"
)

// SettleLocal applies what it can of an OpRefund or OpCharge batch to the
// leases this instance holds, with no store call, and returns the rest,
// for the caller to send to the store: the members it did not settle, and
// for members it settled in part, the part left (Cost reduced). It
// returns reqs itself when it settled nothing, and nil when it settled
// everything. Any other op is returned whole.
//
// A member is settled locally when it is a leased request (UseLease, or
// Options.All) of a leased algorithm, with no Lease, MaxWait or
// ReservedAhead, on a key whose lease has the same algorithm and limit and
// is live (before its expiry: for windows, the end of the window its chunk
// was charged in). A GCRA or token-bucket refund goes back into the chunk
// up to what the chunk's generation lent (admitted or charged since it was
// last dropped, at its expiry, Sweep, OpReset or Close, and not settled
// back): units are put back only into the lease they came from, while it
// is live, never twice; the rest goes to the store. (A refund of units
// the store admitted directly may thus go into the chunk in place of
// units it lent, whose own refund then goes to the store: the same
// capacity, given back once.) A window algorithm's
// refund always goes to the store: the request does not say which window
// it was admitted in, and a refund into the chunk of the next window
// would free capacity there. A charge (of any leased algorithm) is drawn
// from the chunk's units first, as an admission now would be, and the
// rest from the store.
//
// Each call settles once: the local part is applied when SettleLocal
// returns, so a caller that retries the store's part must not call it
// again for the same batch. SettleLocal knows nothing of a batch's
// condition in the store (a concurrency lease that makes the store apply
// a refund batch only while it is held): a caller whose batch has one
// must settle locally only what no other settler can settle (its own
// reservation), as internal/gateway does for reservations taken ahead.
func (s *Store) SettleLocal(op sluice.Op, reqs []sluice.Request) []sluice.Request {
	if (op != sluice.OpRefund && op != sluice.OpCharge) || s.closed() {
		return reqs
	}
	var rest []sluice.Request
	copied := false
	for i := range reqs {
		left := s.settleOne(op, &reqs[i])
		if left == reqs[i].Cost && !copied {
			continue // untouched so far
		}
		if !copied {
			copied = true
			if i > 0 {
				rest = append(make([]sluice.Request, 0, len(reqs)), reqs[:i]...) // untouched members before i
			}
		}
		if left > 0 {
			if rest == nil {
				rest = make([]sluice.Request, 0, len(reqs)-i) // made only for a member left: none when all settled here
			}
			r := reqs[i]
			r.Cost = left
			rest = append(rest, r)
		}
	}
	if !copied {
		return reqs
	}
	if len(rest) == 0 {
		return nil
	}
	return rest
}

// settleOne settles req into its key's lease as far as it can and returns
// the cost left for the store.
func (s *Store) settleOne(op sluice.Op, req *sluice.Request) int64 {
	if req.Cost < 1 || (!req.UseLease && !s.all) || req.Lease != "" || req.MaxWait != 0 || req.ReservedAhead != 0 || !leasable(req) {
		return req.Cost
	}
	e, ok := s.keys.Load(req.Key)
	if !ok || e.algo != req.Algorithm || e.limit != req.Limit {
		return req.Cost
	}
	e.mu.Lock()
	if s.closed() {
		// Read under the lock: Close marks the Store closed before it
		// drops the leases (each under its lock), so a unit put back here
		// either is given back by Close's drop or not put back at all.
		e.mu.Unlock()
		return req.Cost
	}
	now := s.clk.Now() // under the lock, as in take
	var expired, k int64
	if e.tokens > 0 && now >= e.expiry {
		expired = e.drop()
	}
	if now < e.expiry {
		if op == sluice.OpRefund && !e.window() {
			k = min(req.Cost, e.lent)
			e.tokens += k
			e.lent -= k
		} else if op == sluice.OpCharge {
			k = min(req.Cost, e.tokens)
			e.tokens -= k
			e.lent += k
		}
	}
	e.mu.Unlock()
	s.returnAsync(e, expired)
	if k > 0 {
		s.settled.Add(uint64(k))
	}
	return req.Cost - k
}
