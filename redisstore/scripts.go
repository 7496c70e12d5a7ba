package redisstore

import (
	"embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-io/sluice"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// algoFiles names the Lua file of each algorithm; the script numbers them
// by sluice.Algorithm's value.
var algoFiles = map[sluice.Algorithm]string{
	sluice.GCRA:                 "gcra.lua",
	sluice.TokenBucket:          "tokenbucket.lua",
	sluice.SlidingWindowLog:     "slidinglog.lua",
	sluice.SlidingWindowCounter: "slidingcounter.lua",
	sluice.FixedWindow:          "fixedwindow.lua",
	sluice.Concurrency:          "concurrency.lua",
}

// scripts holds one script per algorithm, for Apply, and one with every
// algorithm, for ApplyAll. Each is lib.lua, the algorithm files and
// main.lua, run with EVALSHA (EVAL on NOSCRIPT).
type scripts struct {
	single [sluice.Concurrency + 1]*rueidis.Lua
	// fast holds the lean one-key scripts of GCRA and TokenBucket, the hot
	// path, which take fastArgs and reply with two numbers.
	fast    [sluice.Concurrency + 1]*rueidis.Lua
	fastSrc [sluice.Concurrency + 1]string
	batch   *rueidis.Lua
	// sources, for redis-benchmark and tests
	singleSrc [sluice.Concurrency + 1]string
	batchSrc  string
}

func loadScripts() (*scripts, error) {
	read := func(name string) (string, error) {
		b, err := luaFiles.ReadFile("lua/" + name)
		if err != nil {
			return "", fmt.Errorf("redisstore: embedded script %s: %w", name, err)
		}
		return string(b), nil
	}
	lib, err := read("lib.lua")
	if err != nil {
		return nil, err
	}
	main, err := read("main.lua")
	if err != nil {
		return nil, err
	}
	s := &scripts{}
	all := lib
	for _, a := range sluice.Algorithms() {
		body, err := read(algoFiles[a])
		if err != nil {
			return nil, err
		}
		s.singleSrc[a] = lib + "\n" + body + "\n" + main
		s.single[a] = rueidis.NewLuaScript(s.singleSrc[a])
		all += "\n" + body
	}
	s.batchSrc = all + "\n" + main
	s.batch = rueidis.NewLuaScript(s.batchSrc)
	for a, name := range map[sluice.Algorithm]string{sluice.GCRA: "gcra_fast.lua", sluice.TokenBucket: "tokenbucket_fast.lua"} {
		if s.fastSrc[a], err = read(name); err != nil {
			return nil, err
		}
		s.fast[a] = rueidis.NewLuaScript(s.fastSrc[a])
	}
	return s, nil
}

// Script returns the Lua source that Apply runs for algorithm a, and the
// ARGV it sends for an OpAllow of req reading Redis TIME, so that
// benchmarks can run it directly (for example with redis-benchmark).
func Script(req sluice.Request) (src string, argv []string, err error) {
	if err := req.Validate(sluice.OpAllow); err != nil {
		return "", nil, fmt.Errorf("redisstore: %w", err)
	}
	s, err := loadScripts()
	if err != nil {
		return "", nil, err
	}
	if s.fast[req.Algorithm] != nil {
		return s.fastSrc[req.Algorithm], fastArgs(sluice.OpAllow, &req, -1), nil
	}
	argv, err = appendArgs([]string{opArg(sluice.OpAllow), "", ""}, &req)
	return s.singleSrc[req.Algorithm], argv, err
}

// fastArgs is the ARGV of a fast script: op, time, tau, and the intervals
// of the effective cost and of the cost.
func fastArgs(op sluice.Op, req *sluice.Request, now int64) []string {
	l := req.Limit
	ts, tn := timeArgs(now)
	return []string{
		opArg(op), ts, tn,
		strconv.FormatInt(l.CostInterval(l.Capacity()), 10),
		strconv.FormatInt(l.CostInterval(max(req.Cost, 1)), 10),
		strconv.FormatInt(l.CostInterval(req.Cost), 10),
	}
}

// argsPerKey is the number of ARGV values per key after the three leading ones.
const argsPerKey = 10

// maxExactNS is 2^53: durations below it are exact in a Lua double.
const maxExactNS = 1 << 53

// appendArgs appends req's ARGV values.
func appendArgs(args []string, req *sluice.Request) ([]string, error) {
	l := req.Limit
	p := int64(l.Period)
	ps := int64(0)
	if p%int64(time.Second) == 0 {
		ps = p / int64(time.Second)
	} else if (req.Algorithm == sluice.FixedWindow || req.Algorithm == sluice.SlidingWindowCounter) && p >= maxExactNS/10 {
		return nil, fmt.Errorf("redisstore: %w: %s: a window period that is not whole seconds must be under %s", ErrUnsupportedLimit, l, time.Duration(maxExactNS/10))
	}
	eff := max(req.Cost, 1)
	tau := int64(0)
	if req.Algorithm == sluice.GCRA || req.Algorithm == sluice.TokenBucket {
		tau = l.CostInterval(l.Capacity())
	}
	inc, chg := l.CostInterval(eff), l.CostInterval(req.Cost)
	return append(args,
		strconv.Itoa(int(req.Algorithm)),
		strconv.FormatInt(p, 10),
		strconv.FormatInt(ps, 10),
		strconv.FormatInt(l.Rate, 10),
		strconv.FormatInt(tau, 10),
		strconv.FormatInt(inc, 10),
		strconv.FormatInt(chg, 10),
		strconv.FormatInt(eff, 10),
		strconv.FormatInt(req.Cost, 10),
		req.Lease,
	), nil
}

// opArg is the op's number in the scripts.
func opArg(op sluice.Op) string {
	switch op {
	case sluice.OpAllow:
		return "1"
	case sluice.OpPeek:
		return "2"
	case sluice.OpRefund:
		return "3"
	}
	return "4"
}

// timeArgs returns the script's time arguments: empty for Redis TIME, or
// the test clock's now as seconds and nanoseconds.
func timeArgs(now int64) (string, string) {
	if now < 0 {
		return "", ""
	}
	return strconv.FormatInt(now/int64(time.Second), 10), strconv.FormatInt(now%int64(time.Second), 10)
}
