package redisstore

import (
	"fmt"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/sluice-io/sluice"
)

// A group of the group commit (commit.go) sends its calls of the one-key
// scripts gcra_fast.lua (GCRA's and the token bucket's decisions) and
// fixedwindow_fast.lua as calls of up to fastGroup keys each: one
// EVALSHA, one read of Redis TIME, and each limit's values once, for many
// decisions. Redis's work per decision is most of what bounds the store's
// decisions per second when Redis and the callers share a machine, and a
// call's own cost (EVALSHA's setup, its ARGV, TIME) was over half of a
// one-key call's (callgrind, docs/BENCHMARKS.md). The decisions are those
// the one-key calls would make, in some order: the group's callers each
// waited for their own answer, none for another's, so no order among
// them was promised. A key holding another type fails its own decision
// only (WRONGTYPE).
//
// Only where a call's keys may lie in different slots: not on a Cluster.

// fastGroup bounds the keys of one gathered call: it shares the call's
// own cost among many (GCRA, 32 keys: 0.41× redis_rate's instructions
// per decision, 8 keys: 0.47×) and keeps one script's run short (Redis
// serves no one else meanwhile; 64 keys take about 0.2 ms).
const fastGroup = 64

// gatherable reports whether a call of the script with sha on keys with
// args may be gathered, and whether it is fixedwindow_fast.lua's:
// gcra_fast.lua or fixedwindow_fast.lua on one key with Redis TIME (a
// test's time is not gathered), not on a Cluster.
func (s *Store) gatherable(sha string, keys, args []string) (ok, window bool) {
	if s.cluster || len(keys) != 1 || len(args) > 4 {
		return false, false
	}
	switch sha {
	case s.scripts.sha[s.scripts.fast[sluice.GCRA]]:
		return true, false
	case s.scripts.sha[s.scripts.fast[sluice.FixedWindow]]:
		return true, true
	}
	return false, false
}

// fastParts splits a group into its gathered calls, each of one script
// and of 2 to fastGroup keys, ordered by byRun, and the rest. A call
// left alone (a script's only call in the group, or one past a multiple
// of fastGroup) goes with the rest: a gathered call of one key would read
// as a one-key call, whose ARGV differ.
func fastParts(group []*pending) (parts [][]*pending, rest []*pending) {
	var gcra, window []*pending
	for _, p := range group {
		switch {
		case p.fast.key == "":
			rest = append(rest, p)
		case p.fast.window:
			window = append(window, p)
		default:
			gcra = append(gcra, p)
		}
	}
	for _, calls := range [][]*pending{gcra, window} {
		if len(calls) < 2 {
			rest = append(rest, calls...)
			continue
		}
		for i := 0; i < len(calls); i += fastGroup {
			part := calls[i:min(i+fastGroup, len(calls))]
			if len(part) == 1 {
				rest = append(rest, part[0])
				break
			}
			byRun(part)
			parts = append(parts, part)
		}
	}
	return parts, rest
}

// byRun orders part so that the calls with the same ARGV (the same
// cached slice: one limit, cost and op) are next to each other, in their
// first one's place.
func byRun(part []*pending) {
	for i := 0; i < len(part); {
		a := &part[i].fast.args[0]
		j := i + 1
		for k := i + 1; k < len(part); k++ {
			if &part[k].fast.args[0] == a {
				part[j], part[k] = part[k], part[j]
				j++
			}
		}
		i = j
	}
}

// fastGroupCmd is the gathered call of part (one script's, ordered by
// byRun): EVALSHA, or EVAL of the source with eval. Each run is count and
// four values: GCRA's op, tau and intervals (the cost's repeated when
// left out), or the fixed window's op, period, rate and cost.
func (s *Store) fastGroupCmd(client rueidis.Client, part []*pending, eval bool) rueidis.Completed {
	keys := make([]string, len(part))
	args := make([]string, 0, 5)
	for i := 0; i < len(part); {
		a := part[i].fast.args
		j := i
		for ; j < len(part) && &part[j].fast.args[0] == &a[0]; j++ {
			keys[j] = part[j].fast.key
		}
		chg := a[2]
		if len(a) > 3 {
			chg = a[3]
		}
		args = append(args, strconv.Itoa(j-i), a[0], a[1], a[2], chg)
		i = j
	}
	a := sluice.GCRA
	if part[0].fast.window {
		a = sluice.FixedWindow
	}
	fast := s.scripts.fast[a]
	if eval {
		return client.B().Eval().Script(s.scripts.fastSrc[a]).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	}
	return client.B().Evalsha().Sha1(s.scripts.sha[fast]).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

// answerFast hands each call of part its part of res, the gathered
// call's reply: one reply per key, or the call's error for all.
func answerFast(part []*pending, res rueidis.RedisResult) {
	arr, err := res.ToArray()
	if err == nil && len(arr) != len(part) {
		err = fmt.Errorf("redisstore: a gathered call of %d keys replied %d values", len(part), len(arr))
	}
	for i, p := range part {
		if err != nil {
			p.res = rueidis.NewErrorResult(err)
		} else {
			p.res = rueidis.NewResult(arr[i], nil)
		}
		p.done <- struct{}{}
	}
}
