package region

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// scripts are the region's Lua scripts, each lib.lua and its own.
type scripts struct{ spend, credit, take, epoch, fair *rueidis.Lua }

func loadScripts() (*scripts, error) {
	lib, err := luaFiles.ReadFile("lua/lib.lua")
	if err != nil {
		return nil, fmt.Errorf("region: %w", err)
	}
	load := func(name string) (*rueidis.Lua, error) {
		b, err := luaFiles.ReadFile("lua/" + name)
		if err != nil {
			return nil, fmt.Errorf("region: %w", err)
		}
		return rueidis.NewLuaScript(string(lib) + "\n" + string(b)), nil
	}
	var s scripts
	if s.spend, err = load("spend.lua"); err != nil {
		return nil, err
	}
	if s.credit, err = load("credit.lua"); err != nil {
		return nil, err
	}
	if s.take, err = load("take.lua"); err != nil {
		return nil, err
	}
	if s.epoch, err = load("epoch.lua"); err != nil {
		return nil, err
	}
	if s.fair, err = load("fair.lua"); err != nil {
		return nil, err
	}
	return &s, nil
}

// ledger keeps the shares of global keys that this region holds, in the
// region's own Redis, so that every instance of the region spends them
// atomically: one script per decision, no matter how many instances.
type ledger struct {
	client  rueidis.Client
	prefix  string
	clk     clock.Clock // nil: Redis TIME
	gc      int64       // ms a share's hash outlives its expiry
	timeout time.Duration
	s       *scripts
}

// share is a ledger's answer: whether the operation applied, the units
// the region holds after it (negative: a debt), and the time until the
// share expires.
type share struct {
	ok   bool
	n    int64
	left time.Duration
	win  string // the share's window ("" for buckets)
}

func (l *ledger) key(k string) string { return l.prefix + k }

func (l *ledger) now() string {
	if l.clk == nil {
		return ""
	}
	return strconv.FormatInt(l.clk.Now()/int64(time.Millisecond), 10)
}

func (l *ledger) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, l.timeout)
}

// apply runs op ("allow", "peek", "refund" or "charge") on key's share;
// a refund applies only to a share of window win ("" for buckets).
func (l *ledger) apply(ctx context.Context, op, key string, cost int64, win string) (share, error) {
	ctx, cancel := l.bound(ctx)
	defer cancel()
	vs, err := l.s.spend.Exec(ctx, l.client, []string{l.key(key)}, []string{l.now(), op, strconv.FormatInt(cost, 10), strconv.FormatInt(l.gc, 10), win}).ToArray()
	if err != nil {
		return share{}, unavailable("share "+op, err)
	}
	if len(vs) != 4 {
		return share{}, fmt.Errorf("region: share reply of %d values, want 4", len(vs))
	}
	n, err := ints(vs[:3], 3)
	if err != nil {
		return share{}, err
	}
	w, err := vs[3].ToString()
	if err != nil {
		return share{}, fmt.Errorf("region: share reply window: %w", err)
	}
	return share{ok: n[0] == 1, n: n[1], left: time.Duration(n[2]) * time.Millisecond, win: w}, nil
}

// credit adds units charged at home, spendable until exp, a time in ms
// by this region's Redis (see time); exp zero puts units back without
// extending the share. win names a window share's window ("" for
// buckets). A credit whose exp has passed applies nothing (ok false).
func (l *ledger) credit(ctx context.Context, key string, units, exp int64, win string) (share, error) {
	ctx, cancel := l.bound(ctx)
	defer cancel()
	vs, err := l.s.credit.Exec(ctx, l.client, []string{l.key(key)}, []string{l.now(), strconv.FormatInt(units, 10), strconv.FormatInt(exp, 10), win, strconv.FormatInt(l.gc, 10)}).ToArray()
	if err != nil {
		return share{}, unavailable("share credit", err)
	}
	n, err := ints(vs, 3)
	if err != nil {
		return share{}, err
	}
	return share{ok: n[0] == 1, n: n[1], left: time.Duration(n[2]) * time.Millisecond}, nil
}

// time is the time by this region's Redis (the ledger's clock), in ms:
// shares expire by it.
func (l *ledger) time(ctx context.Context) (int64, error) {
	if l.clk != nil {
		return l.clk.Now() / int64(time.Millisecond), nil
	}
	ctx, cancel := l.bound(ctx)
	defer cancel()
	vs, err := l.client.Do(ctx, l.client.B().Time().Build()).ToArray()
	if err != nil {
		return 0, unavailable("time", err)
	}
	if len(vs) != 2 {
		return 0, fmt.Errorf("region: TIME reply of %d values", len(vs))
	}
	var t [2]int64
	for i := range vs {
		str, err := vs[i].ToString()
		if err != nil {
			return 0, fmt.Errorf("region: TIME reply: %w", err)
		}
		if t[i], err = strconv.ParseInt(str, 10, 64); err != nil {
			return 0, fmt.Errorf("region: TIME reply: %w", err)
		}
	}
	return t[0]*1000 + t[1]/1000, nil
}

// take takes back a bucket share's units to refund: all of them, or only
// when the share expired or went unspent for idle, or else those above
// keep (none when keep is negative).
func (l *ledger) take(ctx context.Context, key string, idle time.Duration, all bool, keep int64) (int64, error) {
	ctx, cancel := l.bound(ctx)
	defer cancel()
	a := "0"
	if all {
		a = "1"
	}
	n, err := l.s.take.Exec(ctx, l.client, []string{l.key(key)}, []string{l.now(), strconv.FormatInt(idle.Milliseconds(), 10), a, strconv.FormatInt(keep, 10)}).AsInt64()
	if err != nil {
		return 0, unavailable("share take", err)
	}
	return n, nil
}

// ints decodes a reply of want integers.
func ints(vs []rueidis.RedisMessage, want int) ([]int64, error) {
	if len(vs) != want {
		return nil, fmt.Errorf("region: share reply of %d values, want %d", len(vs), want)
	}
	out := make([]int64, want)
	for i := range vs {
		v, err := vs[i].AsInt64()
		if err != nil {
			return nil, fmt.Errorf("region: share reply value %d: %w", i, err)
		}
		out[i] = v
	}
	return out, nil
}

// unavailable wraps a Redis error: a reply error (the script failed) is a
// bug, anything else means the regional store could not answer.
func unavailable(what string, err error) error {
	var re *rueidis.RedisError
	if errors.As(err, &re) {
		return fmt.Errorf("region: %s: %w", what, err)
	}
	return fmt.Errorf("region: %s: %w: %w", what, sluice.ErrUnavailable, err)
}
