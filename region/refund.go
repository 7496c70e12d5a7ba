package region

import (
	"context"
	"fmt"

	"github.com/sluice-io/sluice"
)

// A refund outside a global key's home goes back to this region's share
// (spend.lua), one script per key, apart from the batch's other keys. A
// caller that sends a refund batch again after an error whose first
// attempt went through (a reply lost: the store ran it) would give a
// share its units twice: over-admission. sluice.Store's contract has the
// answer: a refund batch is applied only while every Concurrency lease in
// it is held. The gateway's settlement relies on it to retry while the
// store is unavailable (and to settle once among instances): an attempt
// that applied released the lease, and the next one is refused whole.
// refundLeased keeps that contract across regions: the batch's keys of
// this region's store (the leases among them) go first, as one batch, and
// the shares get their units only when every lease in it was held, that
// is, from the one call that released them. A share's refund that then
// fails is not reported as the batch's failure: the leases are released
// already, so a retry would be refused anyway; its units, given back or
// not (its reply may be what was lost), are counted stranded. Each
// share's refund is thus applied at most once per lease; lost at worst
// (the share keeps fewer units than it might: under-admission).
//
// A lone refund, or a batch without a lease, has no such guard, on any
// store: a caller must not send it again after an error that may have
// come after the store applied it (only errors saying it was never sent,
// such as guard.ErrCircuitOpen, allow a retry).

// holdsLease reports whether reqs hold a Concurrency lease.
func holdsLease(reqs []sluice.Request) bool {
	for i := range reqs {
		if reqs[i].Algorithm == sluice.Concurrency && reqs[i].Lease != "" {
			return true
		}
	}
	return false
}

// refundLeased applies a refund batch holding Concurrency leases, with
// global keys of other homes at remote: the rest on this region's store
// as one batch first, then each remote key's refund to its share, only if
// every lease was held.
func (s *Store) refundLeased(ctx context.Context, reqs []sluice.Request, remote []int) ([]sluice.Decision, error) {
	isRemote := make([]bool, len(reqs))
	for _, i := range remote {
		if err := reqs[i].Validate(sluice.OpRefund); err != nil {
			return nil, fmt.Errorf("region: %w", err)
		}
		if err := supported(&reqs[i]); err != nil {
			return nil, err
		}
		isRemote[i] = true
	}
	local := make([]sluice.Request, 0, len(reqs)-len(remote))
	localAt := make([]int, 0, len(reqs)-len(remote))
	for i := range reqs {
		if !isRemote[i] {
			local, localAt = append(local, reqs[i]), append(localAt, i)
		}
	}
	ds, err := s.local.ApplyAll(ctx, sluice.OpRefund, local)
	if err != nil {
		return nil, err
	}
	if len(ds) != len(local) {
		return nil, fmt.Errorf("region: the store answered %d decisions for %d refunds", len(ds), len(local))
	}
	out := make([]sluice.Decision, len(reqs))
	held := true
	for n, j := range localAt {
		out[j] = ds[n]
		if reqs[j].Algorithm == sluice.Concurrency && !ds[n].Allowed {
			held = false
		}
	}
	for _, i := range remote {
		if !held {
			// Refused with the batch: a lease was not held (released by
			// an earlier attempt or another settlement, or lapsed).
			out[i] = sluice.Decision{Limit: reqs[i].Limit, Source: sluice.FromShare}
			continue
		}
		d, err := s.Apply(context.WithoutCancel(ctx), sluice.OpRefund, reqs[i])
		if err != nil {
			s.st.stranded.Add(uint64(reqs[i].Cost))
			s.log.Debug("region: a refund to a share failed after its lease was released; not sent again", "err", err)
			d = sluice.Decision{Allowed: true, Limit: reqs[i].Limit, Source: sluice.FromShare}
		}
		out[i] = d
	}
	return out, nil
}
