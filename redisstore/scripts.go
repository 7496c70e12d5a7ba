package redisstore

import (
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
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

// fastFiles names the lean one-key scripts; TokenBucket runs GCRA's.
var fastFiles = map[sluice.Algorithm]string{
	sluice.GCRA:        "gcra_fast.lua",
	sluice.FixedWindow: "fixedwindow_fast.lua",
}

// scripts holds one script per algorithm, for Apply, and one with every
// algorithm, for ApplyAll. Each is lib.lua, the algorithm files and
// main.lua, run with EVALSHA (EVAL on NOSCRIPT).
type scripts struct {
	single [sluice.Concurrency + 1]*rueidis.Lua
	// fast holds the lean one-key scripts of GCRA, TokenBucket and
	// FixedWindow, the hot paths, which take fastArgs and reply with two
	// or three numbers.
	fast    [sluice.Concurrency + 1]*rueidis.Lua
	fastSrc [sluice.Concurrency + 1]string
	batch   *rueidis.Lua
	// calendar is the script of FixedWindow with a calendar limit.
	calendar *rueidis.Lua
	// sources, for redis-benchmark and tests
	singleSrc   [sluice.Concurrency + 1]string
	batchSrc    string
	calendarSrc string

	// The scripts of Options.PlainWindows: the fast one-key script, the
	// one-algorithm and the batch scripts with fixed windows in
	// per-window keys too (ALGOS[7]), and the reset script.
	plainFast, plainSingle, plainBatch, resetPlain        *rueidis.Lua
	plainFastSrc, plainSingleSrc, plainBatchSrc, resetSrc string

	// sha is each script's SHA-1, for EVALSHA in groups (commit.go).
	sha map[*rueidis.Lua]string
}

// plainSrcs are the sources of the PlainWindows scripts.
func (s *scripts) plainSrcs() []string {
	return []string{s.plainFastSrc, s.plainSingleSrc, s.plainBatchSrc, s.resetSrc}
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
	cal, err := read(calendarFile)
	if err != nil {
		return nil, err
	}
	s.calendarSrc = lib + "\n" + cal + "\n" + main
	s.calendar = rueidis.NewLuaScript(s.calendarSrc)
	all += "\n" + cal
	s.batchSrc = all + "\n" + main
	s.batch = rueidis.NewLuaScript(s.batchSrc)
	if err := s.loadPlain(read, lib, main, all); err != nil {
		return nil, err
	}
	for a, name := range fastFiles {
		if s.fastSrc[a], err = read(name); err != nil {
			return nil, err
		}
	}
	// A token bucket is a GCRA whose level is tau − (TAT − now): one script.
	s.fastSrc[sluice.TokenBucket] = s.fastSrc[sluice.GCRA]
	for a := range s.fastSrc {
		if s.fastSrc[a] != "" {
			s.fast[a] = rueidis.NewLuaScript(s.fastSrc[a])
		}
	}
	s.sha = map[*rueidis.Lua]string{}
	add := func(l *rueidis.Lua, src string) {
		if l != nil {
			sum := sha1.Sum([]byte(src))
			s.sha[l] = hex.EncodeToString(sum[:])
		}
	}
	for a := range s.single {
		add(s.single[a], s.singleSrc[a])
		add(s.fast[a], s.fastSrc[a])
	}
	add(s.calendar, s.calendarSrc)
	add(s.batch, s.batchSrc)
	add(s.plainFast, s.plainFastSrc)
	add(s.plainSingle, s.plainSingleSrc)
	add(s.plainBatch, s.plainBatchSrc)
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
	if !req.Limit.Calendar.IsZero() {
		argv, err = appendArgs([]string{opArg(sluice.OpAllow), "", ""}, &req, time.Now().UnixNano())
		return s.calendarSrc, argv, err
	}
	if s.fast[req.Algorithm] != nil {
		p, err := newFastParams(&req)
		if err != nil {
			return "", nil, err
		}
		return s.fastSrc[req.Algorithm], fastArgs(sluice.OpAllow, p, -1), nil
	}
	argv, err = appendArgs([]string{opArg(sluice.OpAllow), "", ""}, &req, 0)
	return s.singleSrc[req.Algorithm], argv, err
}

// fastParams are the ARGV values of a fast script after op, for one
// algorithm, limit and cost: for GCRA and TokenBucket, tau and the
// intervals of the effective cost and of the cost (gcra_fast.lua); for
// FixedWindow, the period (whole seconds, or nanoseconds negated), the
// rate and the cost (fixedwindow_fast.lua). Callers mostly repeat one
// limit, so the store keeps the last one of each algorithm rather than
// format the numbers on every call.
type fastParams struct {
	algo    sluice.Algorithm
	limit   sluice.Limit
	cost    int64
	maxWait time.Duration
	tau     int64 // GCRA and TokenBucket, with maxWait (see reserveTau)
	args    []string
	// argv is the whole ARGV of each op with Redis TIME, shared read-only.
	argv [sluice.OpCharge + 1][]string
}

func newFastParams(req *sluice.Request) (*fastParams, error) {
	l := req.Limit
	p := &fastParams{algo: req.Algorithm, limit: l, cost: req.Cost, maxWait: req.MaxWait}
	eff := max(req.Cost, 1)
	itoa := func(v int64) string { return strconv.FormatInt(v, 10) }
	if req.Algorithm == sluice.FixedWindow {
		ps, err := wholeSeconds(req)
		if err != nil {
			return nil, err
		}
		period := -int64(l.Period)
		if ps > 0 {
			period = ps
		}
		p.args = []string{itoa(period), itoa(l.Rate), itoa(req.Cost)}
	} else {
		p.tau = reserveTau(req)
		p.args = []string{itoa(p.tau), itoa(l.CostInterval(eff)), itoa(l.CostInterval(req.Cost))}
	}
	for _, op := range []sluice.Op{sluice.OpAllow, sluice.OpPeek, sluice.OpRefund, sluice.OpCharge} {
		p.argv[op] = fastArgs(op, p, -1)
	}
	return p, nil
}

// matches reports whether p holds req's parameters.
func (p *fastParams) matches(req *sluice.Request) bool {
	return p != nil && p.algo == req.Algorithm && p.limit == req.Limit && p.cost == req.Cost && p.maxWait == req.MaxWait
}

// fastArgs is the ARGV of a fast script: op, p's values, then, when now
// is not negative (a test's clock), now as seconds and nanoseconds. With
// Redis TIME, GCRA's last value, the interval of the cost, is left out
// when it is the effective cost's (gcra_fast.lua): each value costs Redis
// a string and a tonumber.
func fastArgs(op sluice.Op, p *fastParams, now int64) []string {
	vals := p.args
	if now < 0 && p.algo != sluice.FixedWindow && len(vals) == 3 && vals[1] == vals[2] {
		vals = vals[:2]
	}
	args := append(append(make([]string, 0, 3+len(vals)), opArg(op)), vals...)
	if now >= 0 {
		ts, tn := timeArgs(now)
		args = append(args, ts, tn)
	}
	return args
}

// wholeSeconds is req's period in whole seconds, or 0 when it is not whole
// (which the window algorithms support below maxExactNS/10 only).
func wholeSeconds(req *sluice.Request) (int64, error) {
	l := req.Limit
	p := int64(l.Period)
	if p%int64(time.Second) == 0 {
		return p / int64(time.Second), nil
	}
	if (req.Algorithm == sluice.FixedWindow || req.Algorithm == sluice.SlidingWindowCounter) && p >= maxExactNS/10 {
		return 0, fmt.Errorf("redisstore: %w: %s: a window period that is not whole seconds must be under %s", ErrUnsupportedLimit, l, time.Duration(maxExactNS/10))
	}
	return 0, nil
}

// argsPerKey is the number of ARGV values per key after the three leading ones.
const argsPerKey = 10

// maxExactNS is 2^53: durations below it are exact in a Lua double.
const maxExactNS = 1 << 53

// appendArgs appends req's ARGV values. hint is the time (Unix ns) around
// which a calendar limit's window boundaries are computed.
func appendArgs(args []string, req *sluice.Request, hint int64) ([]string, error) {
	l := req.Limit
	if !l.Calendar.IsZero() {
		return appendCalendarArgs(args, req, hint), nil
	}
	p := int64(l.Period)
	ps, err := wholeSeconds(req)
	if err != nil {
		return nil, err
	}
	eff := max(req.Cost, 1)
	tau := int64(0)
	switch req.Algorithm {
	case sluice.GCRA, sluice.TokenBucket:
		tau = reserveTau(req) // reserve.go
	case sluice.SlidingWindowLog:
		// the log has no tau: the slot carries its granularity in whole
		// milliseconds (main.lua, slidinglog.lua)
		tau = int64(l.Granularity / time.Millisecond)
	}
	inc, chg := l.CostInterval(eff), l.CostInterval(req.Cost)
	if req.Algorithm == sluice.SlidingWindowLog {
		// the log has no interval: the inc slot carries a refund's
		// AdmittedAgo in ns, capped as algo caps it (main.lua,
		// slidinglog.lua); 0 refunds the newest units
		inc = min(max(int64(req.AdmittedAgo), 0), algo.MaxAdmittedAgo(l))
	}
	if req.ReservedAhead > 0 && (req.Algorithm == sluice.GCRA || req.Algorithm == sluice.TokenBucket || req.Algorithm == sluice.FixedWindow) {
		// a refund of a reservation, or of a window's charge: the inc
		// slot, unused by refunds, carries its reserved-ahead time,
		// negated (gcra.lua, tokenbucket.lua, fixedwindow.lua)
		inc = -int64(req.ReservedAhead)
	}
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
	case sluice.OpTake:
		return "5"
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

// loadPlain makes the scripts of Options.PlainWindows; all is lib.lua
// with every algorithm.
func (s *scripts) loadPlain(read func(string) (string, error), lib, main, all string) error {
	var fw, plain, reset string
	for _, f := range []struct {
		name string
		src  *string
	}{{algoFiles[sluice.FixedWindow], &fw}, {"fixedwindow_plainbatch.lua", &plain}, {"resetplain.lua", &reset}, {"fixedwindow_plain.lua", &s.plainFastSrc}} {
		var err error
		if *f.src, err = read(f.name); err != nil {
			return err
		}
	}
	s.plainSingleSrc = lib + "\n" + fw + "\n" + plain + "\n" + main
	s.plainBatchSrc = all + "\n" + plain + "\n" + main
	s.resetSrc = lib + "\n" + reset
	s.plainFast = rueidis.NewLuaScript(s.plainFastSrc)
	s.plainSingle = rueidis.NewLuaScript(s.plainSingleSrc)
	s.plainBatch = rueidis.NewLuaScript(s.plainBatchSrc)
	s.resetPlain = rueidis.NewLuaScript(s.resetSrc)
	return nil
}
