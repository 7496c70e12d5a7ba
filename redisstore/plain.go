package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-io/sluice"
)

// The plain path of Options.PlainWindows: a one-key fixed-window OpAllow
// well inside its window is decided by a pipelined INCRBY + PEXPIRE of the
// window's key, with no script. The window is chosen by the node's clock
// estimate (redisclock.go); every admitting INCRBY is known to have run
// inside the window it counts in, by Redis's clock, or its answer is not
// used. Near a boundary, without a clock estimate, and for every other
// op, the scripts decide, in the same layout.

const (
	// plainMargin is kept from each window's boundaries, beyond twice
	// the clock's error bound.
	plainMargin = 2 * time.Millisecond
	// plainSlack is how long a window's key outlives its window: its TTL
	// only collects garbage.
	plainSlack = time.Second
)

// plainParams are the cached parameters of the plain path and of the
// plain fast script for one limit and cost.
type plainParams struct {
	*fastParams
	cost string // the INCRBY/DECRBY amount
}

func newPlainParams(req *sluice.Request, slack string) (*plainParams, error) {
	p, err := newFastParams(req)
	if err != nil {
		return nil, err
	}
	p.args = append(p.args, slack)
	for _, op := range []sluice.Op{sluice.OpAllow, sluice.OpPeek, sluice.OpRefund, sluice.OpCharge} {
		p.argv[op] = fastArgs(op, p, -1)
	}
	return &plainParams{fastParams: p, cost: strconv.FormatInt(req.Cost, 10)}, nil
}

// plainEligible reports whether an op on req may take the plain path.
func plainEligible(op sluice.Op, req *sluice.Request) bool {
	return op == sluice.OpAllow && req.Cost >= 1 && req.MaxWait == 0 && req.ReservedAhead == 0 &&
		req.Limit.Period%time.Millisecond == 0
}

// applyPlain applies a one-key op to a fixed window in the per-window
// layout: by the plain path when it may, else by the plain fast script
// (or, for OpReset, the reset script).
func (s *Store) applyPlain(ctx context.Context, op sluice.Op, req *sluice.Request) (sluice.Decision, error) {
	if op == sluice.OpReset {
		ds, err := s.run(ctx, op, []sluice.Request{*req}, nil)
		if err != nil {
			return sluice.Decision{}, err
		}
		return ds[0], nil
	}
	p := s.plainArgs.Load()
	if p == nil || !p.matches(req) {
		var err error
		if p, err = newPlainParams(req, s.plainSlackArg); err != nil {
			return sluice.Decision{}, err
		}
		s.plainArgs.Store(p)
	}
	base := s.plainBase(req.Key)
	if plainEligible(op, req) {
		d, ok, err := s.plainAllow(ctx, req, p, base)
		if ok || err != nil {
			return d, err
		}
	}
	return s.runFast(ctx, op, req, p.fastParams, base, s.scripts.plainFast)
}

// plainAllow tries the plain path. ok is false when the script must
// decide instead: no clock estimate, too near a boundary, or an answer
// that came back too late to be known to lie in its window.
func (s *Store) plainAllow(ctx context.Context, req *sluice.Request, p *plainParams, base string) (d sluice.Decision, ok bool, err error) {
	client := s.client()
	if client == nil {
		return d, false, s.notConnected()
	}
	// now returns Redis's time and the error bound of the estimate.
	var now func() (int64, int64, bool)
	margin := int64(plainMargin)
	if s.testClk != nil {
		now = func() (int64, int64, bool) { return s.testClk.Now(), 0, true }
		margin = 0 // the scripts are sent the same time
	} else {
		nc := s.clocks.node(s.NodeOf(req.Key))
		if nc == nil {
			return d, false, nil
		}
		now = func() (int64, int64, bool) { return nc.at(s.clocks.local()) }
	}
	per := int64(req.Limit.Period)
	t, eps, ok := now()
	if !ok {
		return d, false, nil
	}
	start := t - mod(t, per)
	end := start + per
	if t-eps-eps-margin < start || t+eps+eps+margin >= end {
		return d, false, nil
	}
	key := base + ":" + strconv.FormatInt(start, 10)
	ttl := (end-t)/1e6 + 1 + s.plainSlackMS
	cctx, cancel := s.bound(ctx)
	defer cancel()
	s.plainCalls.Add(1)
	rs := client.DoMulti(cctx,
		client.B().Incrby().Key(key).Increment(req.Cost).Build(),
		client.B().Pexpire().Key(key).Milliseconds(ttl).Build())
	n, err := rs[0].AsInt64()
	if err == nil {
		err = rs[1].Error()
	}
	if err != nil {
		return d, false, s.failed(ctx, fmt.Errorf("plain window: %w", err))
	}
	t2, eps2, ok := now()
	if !ok || t2+eps2 >= end {
		// The INCRBY may have run after the window ended (Redis paused,
		// a long queue): undo it, and let the script decide on TIME.
		s.plainLate.Add(1)
		s.giveBack(cctx, client, key, req.Cost, ttl)
		return d, false, nil
	}
	e := min(max(t+(t2-t)/2-start, 0), per-1)
	if n > req.Limit.Rate {
		// Over the limit: give the cost back, so that denied traffic does
		// not hide capacity from the requests that fit.
		s.giveBack(cctx, client, key, req.Cost, ttl)
		return decideOp(sluice.OpAllow, req, reply{ok: false, x: n - req.Cost, y: e}), true, nil
	}
	return decideOp(sluice.OpAllow, req, reply{ok: true, x: n, y: e}), true, nil
}

// giveBack takes an INCRBY of the plain path back. When it fails the
// window only counts more than it admitted, so it is not an error.
func (s *Store) giveBack(ctx context.Context, client rueidis.Client, key string, cost, ttl int64) {
	for _, r := range client.DoMulti(ctx,
		client.B().Decrby().Key(key).Decrement(cost).Build(),
		client.B().Pexpire().Key(key).Milliseconds(ttl).Build()) {
		if err := r.Error(); err != nil {
			s.errs.Add(1)
			s.log.Debug("redisstore: could not give a plain window's charge back", "err", err)
			return
		}
	}
}

// mod is a modulo b, in [0, b).
func mod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

// plainID is the scripts' number for a fixed window in per-window keys
// (fixedwindow_plainbatch.lua), clear of sluice.Algorithm's values.
const plainID = "7"

// scriptOf returns the script for one-algorithm batches of req's kind.
func (c *core) scriptOf(req *sluice.Request) *rueidis.Lua {
	if c.plainLayout(req) {
		return c.scripts.plainSingle
	}
	return c.scripts.of(req)
}

// reset deletes the keys of reqs; keys are their names in the scripts. In
// the per-window layout a fixed window's current window key goes too,
// with its key of the old layout, by one script that reads Redis TIME
// (now, when not negative, for tests).
func (s *Store) reset(ctx context.Context, client rueidis.Client, reqs []sluice.Request, keys []string, now int64) error {
	if !s.plainOn {
		return del(ctx, client, keys)
	}
	names := make([]string, 0, 2*len(reqs))
	args := make([]string, 3, 3+4*len(reqs))
	args[0] = opArg(sluice.OpReset)
	args[1], args[2] = timeArgs(now)
	for i := range reqs {
		names = append(names, reqs[i].Key)
		args = append(args, "0", "0")
		if !s.plainLayout(&reqs[i]) {
			continue
		}
		ps, err := wholeSeconds(&reqs[i])
		if err != nil {
			return err
		}
		names = append(names, keys[i])
		args = append(args, strconv.FormatInt(int64(reqs[i].Limit.Period), 10), strconv.FormatInt(ps, 10))
	}
	if err := s.scripts.resetPlain.Exec(ctx, client, names, args).Error(); err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	return nil
}
