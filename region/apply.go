package region

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/sluice-io/sluice"
)

// Apply implements sluice.Store: a regional key goes to this region's
// store; a global key whose home is this region goes to this region's
// store too, which is its authority; any other global key is decided from
// the share this region holds (Source sluice.FromShare), fetched from its
// home in the background.
func (s *Store) Apply(ctx context.Context, op sluice.Op, req sluice.Request) (sluice.Decision, error) {
	if s.global == nil || !s.global(&req) {
		return s.local.Apply(ctx, op, req)
	}
	if err := req.Validate(op); err != nil {
		return sluice.Decision{}, fmt.Errorf("region: %w", err)
	}
	if err := supported(&req); err != nil {
		return sluice.Decision{}, err
	}
	if s.async != nil && s.async(&req) {
		return s.applyAsync(ctx, op, req)
	}
	home := s.home(req.Key)
	if home == s.region {
		return s.applyHome(ctx, op, req)
	}
	hs := s.regions[home]
	if hs == nil {
		return sluice.Decision{}, fmt.Errorf("%w: home %q of a global key", ErrUnknownRegion, home)
	}
	switch op {
	case sluice.OpAllow:
		return s.allow(ctx, hs, &req)
	case sluice.OpPeek:
		sh, err := s.led.apply(ctx, "peek", req.Key, req.Cost, "")
		if err != nil {
			return sluice.Decision{}, err
		}
		return s.shareDecision(&req, sh), nil
	case sluice.OpRefund:
		win := ""
		if req.Algorithm == sluice.FixedWindow {
			if req.ReservedAhead <= 0 {
				// A refund that names no window is not given back: it
				// could land in a share of the next window.
				return sluice.Decision{Allowed: true, Limit: req.Limit, Source: sluice.FromShare}, nil
			}
			win = refundWindow(&req, s.clk.Now())
		}
		// spend.lua gives it back only to a live share of the window its
		// charge was taken from, and drops it otherwise.
		sh, err := s.led.apply(ctx, "refund", req.Key, req.Cost, win)
		if err != nil {
			return sluice.Decision{}, err
		}
		d := s.shareDecision(&req, sh)
		d.Allowed = true
		return d, nil
	case sluice.OpCharge:
		// The charge is taken from the share, into a debt if need be,
		// which the next fetches pay first: the home is charged for it.
		sh, err := s.led.apply(ctx, "charge", req.Key, req.Cost, "")
		if err != nil {
			return sluice.Decision{}, err
		}
		if e := s.entry(&req); e != nil {
			e.note(s.clk.Now(), req.Cost)
			if sh.n < 0 {
				s.prefetch(hs, e, sh.n)
			}
		}
		d := s.shareDecision(&req, sh)
		d.Allowed = true
		return d, nil
	case sluice.OpReset:
		if _, err := s.led.take(ctx, req.Key, 0, true, -1); err != nil {
			return sluice.Decision{}, err
		}
		return hs.Apply(ctx, op, req)
	}
	return sluice.Decision{}, fmt.Errorf("region: unknown op %s", op)
}

// ApplyAll implements sluice.Store. A batch of keys this region's store
// decides (regional keys, and global keys whose home is this region) goes
// to it as one batch. With global keys of other homes, OpAllow is all or
// nothing still: their shares are spent first, one by one; if one is
// short, or the region's store then denies its part, the spent units go
// back to their shares (to the same window's share for a fixed window), and
// every decision says whether its limit alone would have admitted it.
// The other ops apply request by request.
func (s *Store) ApplyAll(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	var remote, async []int
	homes := 0 // exact global keys whose home this region is
	if s.global != nil {
		for i := range reqs {
			switch {
			case !s.global(&reqs[i]):
			case s.async != nil && s.async(&reqs[i]):
				async = append(async, i)
			case s.home(reqs[i].Key) != s.region:
				remote = append(remote, i)
			default:
				homes++
			}
		}
	}
	if len(async) > 0 && (len(remote) > 0 || op != sluice.OpAllow || len(reqs) == 1) {
		// Asynchronous keys with shares, or ops other than a batch's
		// allow: request by request.
		return s.oneByOne(ctx, op, reqs)
	}
	if s.global != nil && s.epochEvery > 0 && op != sluice.OpReset {
		// The global keys this region is the home of: their epochs first.
		for i := range reqs {
			if s.global(&reqs[i]) && (s.async == nil || !s.async(&reqs[i])) && s.home(reqs[i].Key) == s.region {
				if e := s.entry(&reqs[i]); e != nil {
					if err := s.checkEpoch(ctx, s.region, s.local, e); err != nil {
						return nil, err
					}
				}
			}
		}
	}
	if len(async) > 0 {
		return s.allowAllAsync(ctx, reqs, async)
	}
	if len(remote) == 0 {
		ds, err := s.local.ApplyAll(ctx, op, reqs)
		if err == nil && op == sluice.OpAllow && homes > 0 {
			s.st.home.Add(uint64(homes))
		}
		return ds, err
	}
	if op == sluice.OpRefund && len(reqs) > 1 && holdsLease(reqs) {
		return s.refundLeased(ctx, reqs, remote) // at most once per lease (refund.go)
	}
	if op != sluice.OpAllow || len(reqs) == 1 {
		return s.oneByOne(ctx, op, reqs)
	}
	for i := range reqs {
		if err := reqs[i].Validate(op); err != nil {
			return nil, fmt.Errorf("region: %w", err)
		}
	}
	out := make([]sluice.Decision, len(reqs))
	spent := make([]string, len(reqs)) // the window each spent share is of
	isRemote := make([]bool, len(reqs))
	var local []sluice.Request
	var localAt []int
	for _, i := range remote {
		isRemote[i] = true
	}
	for i := range reqs {
		if !isRemote[i] {
			local, localAt = append(local, reqs[i]), append(localAt, i)
		}
	}
	undo := func(upTo int) {
		for _, i := range remote[:upTo] {
			// Back into the share they came from; a share that expired
			// meanwhile keeps them out (under-admission only).
			if _, err := s.led.apply(context.WithoutCancel(ctx), "refund", reqs[i].Key, reqs[i].Cost, spent[i]); err != nil {
				s.st.stranded.Add(uint64(reqs[i].Cost))
			}
		}
	}
	for k, i := range remote {
		if err := supported(&reqs[i]); err != nil {
			undo(k)
			return nil, err
		}
		d, win, err := s.allowOne(ctx, &reqs[i])
		if err != nil {
			undo(k)
			return nil, err
		}
		out[i], spent[i] = d, win
		if !d.Allowed {
			undo(k)
			// The rest, and the local part, as they would decide alone.
			for _, j := range remote[k+1:] {
				sh, err := s.led.apply(ctx, "peek", reqs[j].Key, reqs[j].Cost, "")
				if err != nil {
					return nil, err
				}
				out[j] = s.shareDecision(&reqs[j], sh)
			}
			if len(local) > 0 {
				ds, err := s.local.ApplyAll(ctx, sluice.OpPeek, local)
				if err != nil {
					return nil, err
				}
				for n, j := range localAt {
					out[j] = ds[n]
				}
			}
			return out, nil
		}
	}
	if len(local) > 0 {
		ds, err := s.local.ApplyAll(ctx, op, local)
		if err != nil {
			undo(len(remote))
			return nil, err
		}
		denied := false
		for n, j := range localAt {
			out[j] = ds[n]
			denied = denied || !ds[n].Allowed
		}
		if denied {
			undo(len(remote))
		}
	}
	return out, nil
}

// refundWindow names the window of the charge a fixed window's refund
// undoes, at now (ns): the one whose end is nearest to now +
// req.ReservedAhead (the charge's ResetAfter less the time since). A
// share's ResetAfter is its expiry, a round trip to the home at most
// before its window's end (windowEnd), and the time since is late by the
// caller's round trip: the boundary nearest the estimate is the charge's
// window's end while those errors stay under half a window. The
// instance's clock stands for the region's Redis clock (one region: NTP
// keeps them within milliseconds).
func refundWindow(req *sluice.Request, now int64) string {
	t := (now + int64(req.ReservedAhead)) / int64(time.Millisecond)
	_, win := nearestEnd(req.Limit, t)
	return strconv.FormatInt(win, 10)
}

// applyHome decides a global key whose home is this region on this
// region's store, its authority, once its epoch is checked (epoch.go):
// on its first decision here, EpochEvery after the last check, and after
// a call failed. A bucket key at its limit is decided from this region's
// share of it instead (fair.go).
func (s *Store) applyHome(ctx context.Context, op sluice.Op, req sluice.Request) (sluice.Decision, error) {
	e := s.entry(&req)
	if e != nil && s.epochEvery > 0 && op != sluice.OpReset {
		now := s.clk.Now()
		e.mu.Lock()
		e.lastUse = now
		due := s.epochDue(e, now)
		e.mu.Unlock()
		if due {
			if err := s.checkEpoch(ctx, s.region, s.local, e); err != nil {
				return sluice.Decision{}, err
			}
		}
	}
	if e != nil && op == sluice.OpAllow && s.fairClient(&req) != nil {
		// Sharing by demand (fair.go): at its limit, the key's refill
		// is shared by the regions' demand, and this region's calls
		// spend their part from a share, as the far regions' do.
		now := s.clk.Now()
		if s.reportHome(e, &req, now) {
			d, err := s.allow(ctx, s.local, &req) // notes the demand
			if err != nil {
				// The share is on the home's own Redis: a failed call
				// there may be its failover (epoch.go).
				e.mu.Lock()
				e.epochStale = true
				e.mu.Unlock()
			}
			return d, err
		}
		e.note(now, req.Cost)
	}
	d, err := s.local.Apply(ctx, op, req)
	if err == nil && e != nil && op == sluice.OpAllow {
		e.homeShort.Store(!d.Allowed)
	}
	if err != nil && e != nil {
		e.mu.Lock()
		e.epochStale = true
		e.mu.Unlock()
	}
	if err == nil && op == sluice.OpAllow {
		s.st.home.Add(1)
	}
	return d, err
}

// oneByOne applies op to reqs one by one.
func (s *Store) oneByOne(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	out := make([]sluice.Decision, len(reqs))
	for i := range reqs {
		d, err := s.Apply(ctx, op, reqs[i])
		if err != nil {
			return nil, err
		}
		out[i] = d
	}
	return out, nil
}

// allowAllAsync decides a batch of keys of this region's store, some of
// them asynchronous, all or nothing on the store, and counts what it
// admitted of the asynchronous ones. A batch with an asynchronous key
// whose counts are stale is denied whole by the failure policy.
func (s *Store) allowAllAsync(ctx context.Context, reqs []sluice.Request, async []int) ([]sluice.Decision, error) {
	for i := range reqs {
		if err := reqs[i].Validate(sluice.OpAllow); err != nil {
			return nil, fmt.Errorf("region: %w", err)
		}
	}
	now := s.clk.Now()
	cs := make([]*counts, len(async))
	for k, i := range async {
		if err := supported(&reqs[i]); err != nil {
			return nil, err
		}
		cs[k] = s.asyncEntry(&reqs[i])
		stale := cs[k] == nil // untracked (MaxKeys): its counts would not be delivered
		if !stale {
			cs[k].mu.Lock()
			stale = cs[k].stale(now, s.staleAfter)
			cs[k].mu.Unlock()
		}
		if stale && s.policy == FailClosed {
			s.st.policy.Add(1)
			out := make([]sluice.Decision, len(reqs))
			for j := range reqs {
				out[j] = sluice.Decision{Limit: reqs[j].Limit, Degraded: true, Fallback: s.policy.String(), Source: sluice.FromStore, RetryAfter: s.syncEvery}
			}
			return out, nil
		}
	}
	for _, c := range cs {
		s.startAsyncEpoch(c) // epoch.go
	}
	ds, err := s.local.ApplyAll(ctx, sluice.OpAllow, reqs)
	if err != nil {
		s.asyncCallFailed(cs)
		return nil, err
	}
	for _, d := range ds {
		if !d.Allowed {
			// Not admitted: each decision says what its limit alone
			// would have done, and nothing was charged.
			return ds, nil
		}
	}
	for k, i := range async {
		if cs[k] == nil {
			continue
		}
		s.st.async.Add(1)
		cs[k].mu.Lock()
		cs[k].add(now, reqs[i].Cost, windowOf(&reqs[i], now, ds[i]))
		cs[k].mu.Unlock()
	}
	return ds, nil
}

// supported checks that shares can decide req.
func supported(req *sluice.Request) error {
	switch {
	case req.MaxWait != 0:
		return fmt.Errorf("%w: a reservation (max wait %s)", ErrUnsupported, req.MaxWait)
	case req.Algorithm == sluice.GCRA, req.Algorithm == sluice.TokenBucket:
		return nil
	case req.Algorithm == sluice.FixedWindow:
		return nil // periodic or calendar windows (windowEnd)
	}
	return fmt.Errorf("%w: algorithm %s (GCRA, token_bucket and fixed_window are)", ErrUnsupported, req.Algorithm)
}

// SupportsGlobal reports whether a key of algorithm a and limit l can be
// global; config validation calls it.
func SupportsGlobal(a sluice.Algorithm, l sluice.Limit) error {
	return supported(&sluice.Request{Algorithm: a, Limit: l})
}

// allowOne is allow for a request of a batch, also naming the window of
// the share it spent.
func (s *Store) allowOne(ctx context.Context, req *sluice.Request) (sluice.Decision, string, error) {
	hs := s.regions[s.home(req.Key)]
	if hs == nil {
		return sluice.Decision{}, "", fmt.Errorf("%w: home %q of a global key", ErrUnknownRegion, s.home(req.Key))
	}
	return s.allowWin(ctx, hs, req)
}

// allow decides req from the region's share, fetching more in the
// background, and waits for a fetch in flight when the share is spent.
func (s *Store) allow(ctx context.Context, hs sluice.Store, req *sluice.Request) (sluice.Decision, error) {
	d, _, err := s.allowWin(ctx, hs, req)
	return d, err
}

// allowWin is allow, also naming the window of the share it spent.
func (s *Store) allowWin(ctx context.Context, hs sluice.Store, req *sluice.Request) (sluice.Decision, string, error) {
	now := s.clk.Now()
	e := s.entry(req)
	if e != nil {
		e.note(now, req.Cost)
	}
	sh, err := s.led.apply(ctx, "allow", req.Key, req.Cost, "")
	if err != nil {
		return sluice.Decision{}, "", err
	}
	if sh.ok {
		s.st.share.Add(1)
		if e != nil && float64(sh.n) < e.lowWater(s) {
			s.prefetch(hs, e, sh.n)
		}
		return s.shareDecision(req, sh), sh.win, nil
	}
	if e == nil {
		s.st.denied.Add(1)
		return s.denial(req, sh, int64(s.downRetry)), "", nil
	}
	// The share ran out: wait for a fetch, up to FetchWait (a cold key
	// waits for its first one), unless the last fetch came back short or
	// empty: the home is near its limit, and waiting would only stall the
	// callers of a key over its limit by a round trip each.
	e.mu.Lock()
	short := e.short || e.down
	e.mu.Unlock()
	if ch := s.prefetch(hs, e, sh.n); ch != nil && !short && s.fetchWait >= 0 {
		t := time.NewTimer(s.fetchWait)
		select {
		case <-ch:
			t.Stop()
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return sluice.Decision{}, "", fmt.Errorf("region: waiting for a share: %w", ctx.Err())
		}
		if sh, err = s.led.apply(ctx, "allow", req.Key, req.Cost, ""); err != nil {
			return sluice.Decision{}, "", err
		}
		if sh.ok {
			s.st.share.Add(1)
			return s.shareDecision(req, sh), sh.win, nil
		}
	}
	e.mu.Lock()
	down, retryAt := e.down, e.retryAt
	e.mu.Unlock()
	if down {
		s.st.policy.Add(1)
		d := sluice.Decision{Limit: req.Limit, Degraded: true, Fallback: s.policy.String(), Source: sluice.FromStore}
		if s.policy == FailOpen {
			d.Allowed = true
		} else {
			d.RetryAfter = time.Duration(max(retryAt-s.clk.Now(), int64(time.Millisecond)))
		}
		return d, "", nil
	}
	s.st.denied.Add(1)
	return s.denial(req, sh, retryAt-s.clk.Now()), "", nil
}

// shareDecision describes the share as a Decision.
func (s *Store) shareDecision(req *sluice.Request, sh share) sluice.Decision {
	return sluice.Decision{Allowed: sh.ok, Limit: req.Limit, Remaining: sh.n, ResetAfter: sh.left, Source: sluice.FromShare}
}

// denial is a Decision denying req until the next fetch may bring units.
func (s *Store) denial(req *sluice.Request, sh share, wait int64) sluice.Decision {
	d := s.shareDecision(req, sh)
	d.Allowed = false
	d.RetryAfter = time.Duration(max(wait, int64(time.Millisecond)))
	return d
}
