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
// of cost 1 well inside its window is decided by one plain command on the
// window's key, with no script: SET key 1 NX PX ttl when this store has
// not seen the key in this window (admitted at count 1), else, or when
// the SET finds the key, INCRBY key 1. The window is chosen by the node's
// clock estimate (redisclock.go); every admitting command is known to have
// run inside the window it counts in, by Redis's clock, or its answer is
// not used. No increment is ever taken back: a denied INCRBY stays
// counted (with cost 1 the count is then past the limit, where every
// later request is denied anyway), and so does a late one. Near a
// boundary, without a clock estimate, for costs above 1 and for every
// other op, the scripts decide, in the same layout.

const (
	// plainMargin is kept from each window's boundaries, beyond twice
	// the clock's error bound.
	plainMargin = 2 * time.Millisecond
	// plainSlack is how long a window's key outlives its window: its TTL
	// only collects garbage.
	plainSlack = time.Second
)

// plainParams are the cached parameters of the plain fast script for one
// limit and cost.
type plainParams struct {
	*fastParams
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
	return &plainParams{fastParams: p}, nil
}

// plainEligible reports whether an op on req may take the plain path: an
// OpAllow of cost 1 (a larger cost goes to the script, which checks
// before it charges).
func plainEligible(op sluice.Op, req *sluice.Request) bool {
	return op == sluice.OpAllow && req.Cost == 1 && req.MaxWait == 0 && req.ReservedAhead == 0 &&
		req.Limit.Period%time.Millisecond == 0
}

// applyPlain applies a one-key op to a fixed window in the per-window
// layout: by the plain path when it may, else by the plain fast script
// (or, for OpReset, the reset script).
func (s *Store) applyPlain(ctx context.Context, op sluice.Op, req *sluice.Request) (sluice.Decision, error) {
	if op == sluice.OpRefund && req.ReservedAhead > 0 {
		// A refund naming its charge's window: the per-window batch
		// script checks the window (fixedwindow.lua's step).
		ds, err := s.run(ctx, op, []sluice.Request{*req}, s.scripts.plainSingle)
		if err != nil {
			return sluice.Decision{}, err
		}
		return plainClamp(op, ds[0]), nil
	}
	if op == sluice.OpReset {
		ds, err := s.run(ctx, op, []sluice.Request{*req}, nil)
		if err != nil {
			return sluice.Decision{}, err
		}
		return ds[0], nil
	}
	var base string
	if plainEligible(op, req) {
		var d sluice.Decision
		var ok bool
		var err error
		if d, base, ok, err = s.plainAllow(ctx, req); ok || err != nil {
			return d, err
		}
	}
	if base == "" {
		base = s.plainBase(req.Key)
	}
	// The script decides: its ARGV, cached per limit and cost.
	p := s.plainArgs.Load()
	if p == nil || !p.matches(req) {
		var err error
		if p, err = newPlainParams(req, s.plainSlackArg); err != nil {
			return sluice.Decision{}, err
		}
		s.plainArgs.Store(p)
	}
	d, err := s.runFast(ctx, op, req, p.fastParams, base, s.scripts.plainFast)
	return plainClamp(op, d), err
}

// plainClamp clamps the Remaining of a refund at 0. In the per-window
// layout a window's count may stand above the limit after denials (they
// stay counted), where a refund that leaves it there would report a
// negative Remaining; only OpCharge and reservations report one.
func plainClamp(op sluice.Op, d sluice.Decision) sluice.Decision {
	if op == sluice.OpRefund {
		d.Remaining = max(d.Remaining, 0)
	}
	return d
}

// plainAllow tries the plain path for an OpAllow of cost 1. ok is false
// when the script must decide instead: no clock estimate, too near a
// boundary, or an answer that came back too late to be known to lie in
// its window. base is req.Key's base name once the window's key was
// built (empty before), for the script.
func (s *Store) plainAllow(ctx context.Context, req *sluice.Request) (d sluice.Decision, base string, ok bool, err error) {
	client := s.client()
	if client == nil {
		return d, "", false, s.notConnected()
	}
	// now returns Redis's time and the error bound of the estimate.
	var now func() (int64, int64, bool)
	margin := int64(plainMargin)
	node := s.NodeOf(req.Key)
	if s.testClk != nil {
		now = func() (int64, int64, bool) { return s.testClk.Now(), 0, true }
		margin = 0 // the scripts are sent the same time
	} else {
		nc := s.clocks.node(node)
		if nc == nil {
			return d, base, false, nil
		}
		now = func() (int64, int64, bool) { return nc.at(s.clocks.local()) }
	}
	per := int64(req.Limit.Period)
	t, eps, ok := now()
	if !ok {
		return d, base, false, nil
	}
	start := t - mod(t, per)
	end := start + per
	if t-eps-eps-margin < start || t+eps+eps+margin >= end {
		return d, base, false, nil
	}
	// The window's key, base:START, in one allocation; base is its prefix.
	var buf [96]byte
	kb := s.appendPlainBase(buf[:0], req.Key)
	nb := len(kb)
	kb = strconv.AppendInt(append(kb, ':'), start, 10)
	key := string(kb)
	base = key[:nb]
	ttl := (end-t)/1e6 + 1 + s.plainSlackMS
	cctx, cancel := s.bound(ctx)
	defer cancel()
	s.plainCalls.Add(1)
	group := s.groupOf(node)
	var n int64
	if !s.seen.has(base, start) {
		// Not seen in this window: create the key at 1, with its TTL.
		err := plainDo(cctx, client, group, client.B().Set().Key(key).Value("1").Nx().PxMilliseconds(ttl).Build()).Error()
		switch {
		case err == nil:
			n = 1
		case rueidis.IsRedisNil(err): // the key exists: INCRBY below
			// A later send: the end side of the check again.
			if t, eps, ok = now(); !ok || t+eps+eps+margin >= end {
				s.seen.add(base, start)
				return d, base, false, nil
			}
		default:
			return d, base, false, s.failed(ctx, fmt.Errorf("plain window: %w", err))
		}
		s.seen.add(base, start)
	}
	if n == 0 {
		if n, err = plainDo(cctx, client, group, client.B().Incrby().Key(key).Increment(1).Build()).AsInt64(); err != nil {
			return d, base, false, s.failed(ctx, fmt.Errorf("plain window: %w", err))
		}
		if n == 1 {
			// The key had vanished (a reset, a refund to 0, eviction,
			// FLUSH) and INCRBY made it without a TTL: give it one.
			s.seen.add(base, start)
			if err := s.plainExpire(cctx, client, key, ttl); err != nil {
				return d, base, false, s.failed(ctx, fmt.Errorf("plain window: %w", err))
			}
		}
	}
	if s.plainHook != nil {
		s.plainHook(key, n)
	}
	t2, eps2, ok := now()
	if !ok || t2+eps2 >= end {
		// The command may have run after the window ended (Redis paused,
		// a long queue): its count stays in that window (stricter), and
		// the script decides the request on TIME.
		s.plainLate.Add(1)
		return d, base, false, nil
	}
	e := min(max(t+(t2-t)/2-start, 0), per-1)
	if n > req.Limit.Rate {
		// Over the limit: the count stays (cost 1: every later request of
		// the window is denied anyway). Reported as the script reports
		// the state before it: the count n-1, Remaining 0.
		return decideOp(sluice.OpAllow, req, reply{ok: false, x: n - 1, y: e}), base, true, nil
	}
	return decideOp(sluice.OpAllow, req, reply{ok: true, x: n, y: e}), base, true, nil
}

// plainExpire gives a window key that INCRBY created the TTL of the
// plain path, ttl, computed at sending: Redis runs the PEXPIRE later, so
// the key outlives its window still.
func (s *Store) plainExpire(ctx context.Context, client rueidis.Client, key string, ttl int64) error {
	return client.Do(ctx, client.B().Pexpire().Key(key).Milliseconds(ttl).Build()).Error()
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
	err := s.scripts.resetPlain.Exec(ctx, client, names, args).Error()
	// The plain path would find a forgotten key anyway (INCRBY → 1): this
	// spares it the extra PEXPIRE.
	for i := range reqs {
		if s.plainLayout(&reqs[i]) {
			s.seen.forget(keys[i])
		}
	}
	if err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	return nil
}
