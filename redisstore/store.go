package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
)

// Errors of the Redis store. They work with errors.Is.
var (
	// ErrUnavailable is sluice.ErrUnavailable: Redis could not answer in
	// time (a network error, a timeout, a failover in progress, not
	// connected yet). Every such error of the store wraps it; package guard
	// answers them by a failure policy.
	ErrUnavailable = sluice.ErrUnavailable
	// ErrBadURL means Options.URL cannot be used.
	ErrBadURL = errors.New("redisstore: bad redis url")
	// ErrUnsupportedLimit means a limit is valid for sluice but cannot be
	// computed exactly in Redis's Lua, which has only doubles: a fixed or
	// sliding-counter window whose period is not whole seconds and is
	// longer than 10 days. It wraps sluice.ErrInvalidLimit.
	ErrUnsupportedLimit = fmt.Errorf("%w: not supported in redis", sluice.ErrInvalidLimit)
	// ErrCrossSlot means an ApplyAll batch on Redis Cluster has keys in
	// different hash slots. Give them a common hash tag, such as
	// "{tenant:42}:rpm" and "{tenant:42}:tpm". It wraps
	// sluice.ErrInvalidRequest.
	ErrCrossSlot = fmt.Errorf("%w: keys of one batch must share a cluster hash slot", sluice.ErrInvalidRequest)
)

// Defaults for Options.
const (
	DefaultTimeout       = 50 * time.Millisecond
	DefaultDenyCacheSize = 65536
	DefaultFlushDelay    = 20 * time.Microsecond
	DefaultInstancesKey  = "{sluice}:instances"
)

// Options configure a Store. URL (or Client) is required.
type Options struct {
	// URL selects the deployment; see New for the schemes.
	URL string
	// Username and Password are used when the URL carries none. When they
	// are empty too, SLUICE_REDIS_USERNAME and SLUICE_REDIS_PASSWORD are
	// read. They are never logged.
	Username, Password string
	// Client, if set, is used instead of dialling URL, so that one pooled
	// client serves the whole process. Close leaves it open.
	Client rueidis.Client
	// FlushDelay is how long the connection's write loop may wait after a
	// flush, while other calls are waiting, to send more of them in one
	// write (rueidis' MaxFlushDelay). Under concurrent load this halves the
	// write system calls and raises throughput; a lone caller never waits.
	// DefaultFlushDelay (20µs) when zero; negative sends at once. It does
	// not apply to Options.Client.
	FlushDelay time.Duration

	// Timeout is the deadline of every call to Redis, DefaultTimeout (50ms)
	// when zero. A call that misses it fails with ErrUnavailable. A refund
	// or a charge whose context has a deadline, and any call whose context
	// is marked by sluice.WaitForReply (a lease's chunk fetch), has that
	// one instead, even a later one: Redis applies it whether or not its reply comes in
	// time, so a caller that can wait learns that it was applied rather
	// than sending it again (the guard settles Local's charges so). A call
	// with context.Background shares a context with the others made at
	// about the same time, and so may wait up to 9/8 of Timeout. Wrap the
	// store in package guard for a failure policy, a circuit per node and
	// a hard deadline while the client reconnects.
	Timeout time.Duration
	// InstancesKey is the sorted set in which each instance (each
	// guard.Guard around this store) keeps its heartbeat, so that they
	// count each other. DefaultInstancesKey when empty. Deployments that
	// share one Redis but not their limits use different keys.
	InstancesKey string

	// DisableDenyCache turns off the local over-limit cache: by default a
	// key denied with RetryAfter d is denied locally, without asking Redis,
	// until d has passed (or this store refunds or resets the key).
	DisableDenyCache bool
	// DenyCacheSize bounds the over-limit cache. DefaultDenyCacheSize when zero.
	DenyCacheSize int

	// Logger receives connection changes (rate-limited). Nil means
	// slog.Default(). Keys and credentials are never logged.
	Logger *slog.Logger

	// LocalClock is this process's clock, which only the over-limit cache
	// reads. Nil means Clock, or the system clock.
	LocalClock clock.Clock

	// Clock is for tests only. Production leaves it nil, and every script
	// reads the time from Redis TIME, so instances with skewed clocks agree.
	// When set, its time is sent with every call instead (storetest drives
	// the store this way), and the over-limit cache reads it.
	Clock clock.Clock

	// PlainWindows keeps fixed-window counts (not calendar ones) in one
	// key per window holding a plain integer, so that a one-key OpAllow
	// of cost 1 well inside its window is decided by one plain command
	// (SET NX PX for a key this store has not seen in the window, else
	// INCRBY) instead of a script. The window is chosen by an estimate of
	// each node's TIME, sampled every second, and the scripts decide near
	// window boundaries, without a fresh estimate, for larger costs and
	// for every other op, in the same layout; see docs/redis.md. One
	// semantic difference: a request the plain path denies stays counted
	// in its window (the count stands above the limit), so a later refund
	// in that window frees less than without it: stricter, never looser. Rolling upgrade: the counts move to new keys, so
	// instances with and without it count apart for up to one window
	// (up to 2× the limit). Turn it on for the whole fleet at once, or
	// accept that for one window.
	PlainWindows bool
	// PlainLayoutOnly, with PlainWindows, keeps that layout of the
	// counts but decides every op by the scripts, and samples no clock:
	// for a store across a slow link whose counts must be those of the
	// instances near it (a region.Store's store of another region, whose
	// calls are fetches of many units). The sampler's TIME reads expect a
	// Redis a few milliseconds away: across regions each read missed its
	// deadline, and rueidis closed the connection under the calls on it.
	PlainLayoutOnly bool

	// localMono replaces the local monotonic clock of the plain path's
	// estimates, and plainSlack how long a window's key outlives its
	// window (plainSlack when zero), for tests.
	localMono  func() int64
	plainSlack time.Duration
	// noGroupCommit sends every command alone, without the group commit
	// (commit.go), for benchmarks.
	noGroupCommit bool
}

// Store is the Redis sluice.Store: every operation is one Lua script run in
// one round trip, atomically, with the time read from Redis (but see
// Options.PlainWindows). It is safe for concurrent use.
type Store struct {
	*core
}

// Now reads the client's clock (Unix ns; Options.Clock when set), which
// runs at the pace of Redis TIME: Reservation.Cancel measures with it how
// long ago a reservation was made.
func (s *Store) Now() int64 { return s.localClk.Now() }

// core is the store's state.
type core struct {
	conn     // the client, connected now or later
	scripts  *scripts
	timeout  time.Duration
	testClk  clock.Clock
	localClk clock.Clock
	log      *slog.Logger
	cache    *denyCache // nil when disabled
	beatKey  string

	calls, errs, cacheHits atomic.Uint64

	// params caches the last fast-script parameters of each algorithm.
	params [sluice.Concurrency + 1]atomic.Pointer[fastParams]

	// Options.PlainWindows (plain.go, plainkey.go, redisclock.go)
	plainOn               bool
	layoutOnly            bool // Options.PlainLayoutOnly: no clock sampler
	plainArgs             atomic.Pointer[plainParams]
	plainCalls, plainLate atomic.Uint64
	clocks                clocks
	tagTable              slotTagTable
	plainSlackMS          int64  // a window key's TTL past its window
	plainSlackArg         string // the same in decimal, for the scripts
	seen                  *plainSeen
	noGroupCommit         bool
	commit                committers     // every decision's group commit (commit.go)
	shared                sharedDeadline // bounds the calls with context.Background (deadline.go)
	// commitHook, for tests, sees each command sent alone ("direct", 1),
	// queued ("queued", the queue's length after it) and each group sent
	// ("group", its size) and answered ("answered", its size).
	commitHook func(what string, n int)
	// plainHook, for tests, runs when the plain path's command has
	// answered, with the key and its count.
	plainHook func(key string, n int64)
}

// New returns a Store for the Redis that opts name. URL schemes:
//
//	redis://[user:password@]host[:port][/db]            standalone
//	rediss://...                                        standalone over TLS
//	redis+cluster://[user:password@]h1:p1,h2:p2,...      Cluster, any seeds
//	redis+sentinel://[user:password@]s1:p1,s2:p2/master  Sentinel
//
// rediss+cluster:// and rediss+sentinel:// use TLS. See the package doc for
// the query parameters. New fails with ErrBadURL for a malformed URL, and
// with an error wrapping ErrUnavailable when Redis refuses the connection
// (a wrong password, an untrusted certificate). When Redis cannot be
// reached now, New does not fail: the store connects in the background,
// and its calls fail with ErrUnavailable until Redis appears.
func New(ctx context.Context, opts Options) (*Store, error) {
	if opts.Timeout < 0 || opts.DenyCacheSize < 0 {
		return nil, errors.New("redisstore: negative option")
	}
	c := &core{
		timeout:       cmp(opts.Timeout, DefaultTimeout),
		testClk:       opts.Clock,
		localClk:      opts.LocalClock,
		log:           opts.Logger,
		beatKey:       opts.InstancesKey,
		plainOn:       opts.PlainWindows,
		layoutOnly:    opts.PlainLayoutOnly,
		noGroupCommit: opts.noGroupCommit,
	}
	if c.plainOn {
		c.seen = newPlainSeen()
	}
	c.plainSlackMS = cmp(opts.plainSlack, plainSlack).Milliseconds()
	c.plainSlackArg = strconv.FormatInt(c.plainSlackMS, 10)
	c.clocks.local = opts.localMono
	if c.clocks.local == nil {
		c.clocks.local = monotonic()
	}
	if c.beatKey == "" {
		c.beatKey = DefaultInstancesKey
	}
	if c.localClk == nil {
		c.localClk = opts.Clock
	}
	if c.localClk == nil {
		c.localClk = clock.NewSystem()
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	if !opts.DisableDenyCache {
		c.cache = newDenyCache(int(cmp(int64(opts.DenyCacheSize), DefaultDenyCacheSize)))
	}
	var err error
	if c.scripts, err = loadScripts(); err != nil {
		return nil, err
	}
	c.conn.log = c.log
	c.conn.onConnect = c.preload
	if opts.Client != nil {
		c.conn.set(opts.Client)
		c.cluster = len(opts.Client.Nodes()) > 1
		c.preload(ctx, opts.Client)
		return c.started(), nil
	}
	copt, mode, err := clientOption(opts.URL, opts.Username, opts.Password)
	if err != nil {
		return nil, err
	}
	copt.Dialer.Timeout = cmp(copt.Dialer.Timeout, time.Second)
	copt.DisableCache = true
	if opts.FlushDelay >= 0 {
		copt.MaxFlushDelay = cmp(opts.FlushDelay, DefaultFlushDelay)
	}
	copt.ConnWriteTimeout = max(c.timeout*4, time.Second)
	// The dedicated connections (execDedicated: a lease's chunk fetches)
	// come from rueidis' blocking pool, which grew to the most fetches
	// ever in flight (44-160 in the gateway's tail benchmark) and kept
	// them: ~1.5 MB each, buffers the GC marks, 110 MB of a 75-115 MB
	// live heap there and mark phases of 15-57 ms that every request in
	// flight waited through. A fetch past the cap waits for a connection
	// (a round trip, sub-millisecond); idle ones close after a while.
	copt.BlockingPoolSize = dedicatedPoolSize
	copt.BlockingPoolCleanup = dedicatedPoolCleanup
	copt.BlockingPoolMinSize = 1
	c.conn.opt, c.conn.mode, c.conn.owns = copt, mode, true
	c.cluster = mode == "cluster"
	c.name = strings.Join(copt.InitAddress, ",")
	if err := c.connect(ctx); err != nil {
		if refused(err) {
			return nil, err
		}
		c.log.Warn("redisstore: redis unreachable; connecting in the background", "mode", mode, "addrs", c.name, "err", err)
	}
	return c.started(), nil
}

// started returns the Store of c, with its clock sampler running when
// the plain path needs one.
func (c *core) started() *Store {
	s := &Store{core: c}
	if c.plainOn && c.testClk == nil && !c.layoutOnly {
		s.startClocks() // else no estimate: the scripts decide (plainAllow)
	}
	return s
}

// preload loads every script on every node, so that no first call of a
// script pays a NOSCRIPT round trip. It is best effort: a call that finds
// its script missing (after a restart or SCRIPT FLUSH) loads it anyway.
func (c *core) preload(ctx context.Context, client rueidis.Client) {
	ctx, cancel := context.WithTimeout(ctx, max(c.timeout*4, time.Second))
	defer cancel()
	var srcs []string
	all := append(append(c.scripts.singleSrc[:], c.scripts.fastSrc[:]...), c.scripts.batchSrc, c.scripts.calendarSrc)
	if c.plainOn {
		all = append(all, c.scripts.plainSrcs()...)
	}
	for _, src := range all {
		if src != "" && !slices.Contains(srcs, src) {
			srcs = append(srcs, src)
		}
	}
	for addr, node := range client.Nodes() {
		cmds := make(rueidis.Commands, len(srcs)) // a command is sent once
		for i, src := range srcs {
			cmds[i] = node.B().ScriptLoad().Script(src).Build()
		}
		for _, r := range node.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				c.log.Debug("redisstore: could not preload a script", "node", addr, "err", err)
				break
			}
		}
		if info, err := node.Do(ctx, node.B().Info().Section("memory").Build()).ToString(); err == nil {
			if policy, evicts := evictsKeys(info); evicts {
				c.log.Warn("redisstore: redis may evict rate-limit state when it reaches maxmemory, and an evicted key's limit starts over; set maxmemory-policy noeviction (sluice then answers by its failure policy)",
					"node", addr, "maxmemory_policy", policy)
			}
		}
	}
}

// evictsKeys reads INFO memory: whether Redis may evict keys (a maxmemory
// is set and its policy is not noeviction; every sluice key has a TTL, so
// the volatile-* policies evict them too), and the policy's name.
func evictsKeys(info string) (policy string, evicts bool) {
	var limited bool
	for line := range strings.Lines(info) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch k {
		case "maxmemory":
			limited = v != "0"
		case "maxmemory_policy":
			policy = v
		}
	}
	return policy, limited && policy != "" && policy != "noeviction"
}

func cmp[T int64 | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// Client returns the underlying rueidis client, to share it; nil while
// the store has not connected yet.
func (s *Store) Client() rueidis.Client { return s.client() }

// Close releases the connection, unless it came from Options.Client.
func (s *Store) Close() error {
	s.stopClocks()
	s.conn.close() // first: a group on its way fails now
	s.commit.close()
	return nil
}

// Stats are a store's counters since New, for metrics.
type Stats struct {
	// Calls is the number of script calls sent to Redis.
	Calls uint64
	// Errors is the number of calls that failed or timed out.
	Errors uint64
	// CacheHits is the number of decisions the over-limit cache made.
	CacheHits uint64
	// Plain is the number of requests that Options.PlainWindows' plain
	// path sent to Redis (SET NX or INCRBY, no script), and PlainLate
	// those whose answer came too late to be known to lie in their
	// window, which a script then decided.
	Plain, PlainLate uint64
	// Groups is the number of groups the group commit sent (commit.go),
	// and Grouped the commands they held: Grouped ÷ Groups is the depth
	// of the pipeline under load. Commands sent alone are not counted.
	Groups, Grouped uint64
	// Gathered is the part of Grouped that were GCRA or token-bucket
	// one-key calls sent within calls of several keys (fastgroup.go).
	Gathered uint64
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	return Stats{Calls: s.calls.Load(), Errors: s.errs.Load(), CacheHits: s.cacheHits.Load(),
		Plain: s.plainCalls.Load(), PlainLate: s.plainLate.Load(),
		Groups: s.commit.groups.Load(), Grouped: s.commit.grouped.Load(), Gathered: s.commit.gathered.Load()}
}

// Apply implements sluice.Store.
func (s *Store) Apply(ctx context.Context, op sluice.Op, req sluice.Request) (sluice.Decision, error) {
	if err := req.Validate(op); err != nil {
		return sluice.Decision{}, fmt.Errorf("redisstore: %w", err)
	}
	cacheable := s.cache != nil && req.Algorithm != sluice.Concurrency
	switch op {
	case sluice.OpAllow, sluice.OpPeek:
		if cacheable {
			if d, ok := s.cache.get(&req, s.localClk.Now()); ok {
				s.cacheHits.Add(1)
				return d, nil
			}
		}
	case sluice.OpRefund, sluice.OpReset, sluice.OpCharge:
		if s.cache != nil {
			s.cache.del(req.Key)
		}
	}
	// The denial is cached from the time of asking: Redis decided later,
	// so the entry never outlives the real denial.
	asked := s.localClk.Now()
	d, err := s.applyOne(ctx, op, &req)
	if err != nil {
		return sluice.Decision{}, err
	}
	if cacheable && !d.Allowed && !d.Degraded && d.RetryAfter > 0 && req.Cost <= 1 && (op == sluice.OpAllow || op == sluice.OpPeek) {
		s.cache.put(&req, d, asked)
	}
	return d, nil
}

// ApplyAll implements sluice.Store. On Redis Cluster the keys must share a
// hash slot (ErrCrossSlot otherwise). The over-limit cache answers a batch
// with a member it knows is denied: the batch is denied without charging
// anything, and its other members, if any, are peeked in one call so that
// their decisions are what a denied batch reports. A batch's refund,
// charge or reset invalidates its keys.
func (s *Store) ApplyAll(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	if err := s.checkBatch(op, reqs); err != nil || len(reqs) == 0 {
		return nil, err
	}
	if s.cache == nil {
		return s.applyAll(ctx, op, reqs)
	}
	if op != sluice.OpAllow && op != sluice.OpPeek {
		for i := range reqs {
			s.cache.del(reqs[i].Key)
		}
		return s.applyAll(ctx, op, reqs)
	}
	// Denials are cached from the time of asking, as in Apply.
	asked := s.localClk.Now()
	if ds, unknown := s.cache.batch(reqs, asked); ds != nil {
		s.cacheHits.Add(1)
		return s.peekRest(ctx, reqs, ds, unknown, asked)
	}
	ds, err := s.applyAll(ctx, op, reqs)
	if err == nil {
		s.cache.putBatch(reqs, ds, asked)
	}
	return ds, err
}

// checkBatch validates a batch, and on Cluster that its keys share a slot.
func (s *Store) checkBatch(op sluice.Op, reqs []sluice.Request) error {
	for i := range reqs {
		if err := reqs[i].Validate(op); err != nil {
			return fmt.Errorf("redisstore: request %d: %w", i, err)
		}
	}
	if s.cluster && len(reqs) > 1 {
		slot := keySlot(reqs[0].Key)
		for i := range reqs[1:] {
			if keySlot(reqs[i+1].Key) != slot {
				return fmt.Errorf("redisstore: %w: %q and %q", ErrCrossSlot, reqs[0].Key, reqs[i+1].Key)
			}
		}
	}
	return nil
}

// applyAll runs a checked, non-empty batch on Redis.
func (s *Store) applyAll(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	if len(reqs) == 1 {
		d, err := s.applyOne(ctx, op, &reqs[0])
		if err != nil {
			return nil, err
		}
		return []sluice.Decision{d}, nil
	}
	one := s.scriptOf(&reqs[0])
	for i := range reqs[1:] {
		if s.scriptOf(&reqs[i+1]) != one {
			if s.plainOn {
				return s.run(ctx, op, reqs, s.scripts.plainBatch)
			}
			return s.run(ctx, op, reqs, s.scripts.batch)
		}
	}
	// One algorithm: its own script defines only the functions it needs.
	return s.run(ctx, op, reqs, one)
}

// applyOne applies op to one request: in the per-window layout by the
// plain path or its script, else by a lean one-key script where one
// serves it, else by its algorithm's script.
func (s *Store) applyOne(ctx context.Context, op sluice.Op, req *sluice.Request) (sluice.Decision, error) {
	if s.plainLayout(req) {
		return s.applyPlain(ctx, op, req)
	}
	if fast := s.scripts.fast[req.Algorithm]; fast != nil && op != sluice.OpReset && req.Limit.Calendar.IsZero() && req.ReservedAhead == 0 {
		return s.runFast(ctx, op, req, nil, req.Key, fast)
	}
	ds, err := s.run(ctx, op, []sluice.Request{*req}, s.scripts.of(req))
	if err != nil {
		return sluice.Decision{}, err
	}
	return ds[0], nil
}

// runFast runs a lean one-key script for req on key. It is the hot path,
// so it allocates little: the ARGV come from the per-limit cache (p, or
// the store's own when nil), and the request is put in a slice only when
// the failure policy answers.
func (s *Store) runFast(ctx context.Context, op sluice.Op, req *sluice.Request, p *fastParams, key string, script *rueidis.Lua) (sluice.Decision, error) {
	if p == nil {
		p = s.params[req.Algorithm].Load()
		if !p.matches(req) {
			var err error
			if p, err = newFastParams(req); err != nil {
				return sluice.Decision{}, err
			}
			s.params[req.Algorithm].Store(p)
		}
	}
	args := p.argv[op]
	if s.testClk != nil {
		args = fastArgs(op, p, s.testClk.Now())
	}
	client := s.client()
	if client == nil {
		return sluice.Decision{}, s.notConnected()
	}
	cctx, cancel, alone := s.boundFor(ctx, op)
	defer cancel()
	s.calls.Add(1)
	res := s.exec(cctx, client, script, []string{key}, args, alone)
	var r reply
	if req.Algorithm == sluice.FixedWindow {
		vals, err := res.AsIntSlice()
		if err == nil && len(vals) != 3 {
			err = fmt.Errorf("redisstore: script replied %d values, want 3", len(vals))
		}
		if err != nil {
			return sluice.Decision{}, s.failed(ctx, err)
		}
		r = reply{ok: vals[0] == 1, x: vals[1], y: vals[2]}
	} else {
		// gcra_fast.lua replies TAT − now, or { 0, TAT − now } when denied.
		var err error
		if r, err = fastGCRAReply(res); err != nil {
			return sluice.Decision{}, s.failed(ctx, err)
		}
		if req.Algorithm == sluice.TokenBucket { // the script's TAT − now is tau − level
			r.x = p.tau - r.x
		}
	}
	return decideOp(op, req, r), nil
}

// fastGCRAReply decodes gcra_fast.lua's reply: an integer, TAT − now,
// when allowed, or the pair 0, TAT − now when denied.
func fastGCRAReply(res rueidis.RedisResult) (reply, error) {
	msg, err := res.ToMessage()
	if err != nil {
		return reply{}, err
	}
	if msg.IsInt64() {
		v, _ := msg.AsInt64()
		return reply{ok: true, x: v}, nil
	}
	vals, err := msg.AsIntSlice()
	if err == nil && (len(vals) != 2 || vals[0] != 0) {
		err = fmt.Errorf("redisstore: script replied %v, want 0 and a number", vals)
	}
	if err != nil {
		return reply{}, err
	}
	return reply{x: vals[1]}, nil
}

// boundFor is bound, except for a refund or a charge, or a call marked by
// sluice.WaitForReply (a lease's chunk fetch), whose caller gives it a
// deadline later than the store's timeout: Redis applies it whether
// or not its reply comes in time, so it keeps that deadline, and goes
// alone (alone: a group has the store's timeout), for its caller to learn
// that it was applied rather than send it again (Options.Timeout). The
// others keep their group.
func (c *core) boundFor(ctx context.Context, op sluice.Op) (cctx context.Context, cancel context.CancelFunc, alone bool) {
	if d, ok := ctx.Deadline(); ok && (op == sluice.OpRefund || op == sluice.OpCharge || sluice.WaitsForReply(ctx)) && time.Until(d) > c.timeout {
		return ctx, func() {}, true
	}
	cctx, cancel = c.bound(ctx)
	return cctx, cancel, false
}

// bound returns ctx bounded by the store's timeout. A ctx whose deadline
// comes first already (the guard gives each call one, as long as the
// store's) is used as it is, sparing a timer and a context per call.
func (c *core) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if isBackground(ctx) {
		// No deadline, nothing to cancel: a context shared with the
		// other such calls (deadline.go), not a timer each.
		return c.shared.get(time.Now(), c.timeout), func() {}
	}
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= c.timeout {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.timeout)
}

// failed counts a failed call and wraps its error: the caller's own
// cancellation as it is, anything else in ErrUnavailable.
func (s *Store) failed(ctx context.Context, err error) error {
	if ctx.Err() != nil { // the caller gave up: not Redis's fault
		return fmt.Errorf("redisstore: %w", ctx.Err())
	}
	s.errs.Add(1)
	if isReadOnly(err) {
		return fmt.Errorf("redisstore: %w: redis refused a write as a replica (as after a failover): %w", ErrUnavailable, err)
	}
	return fmt.Errorf("redisstore: %w: %w", ErrUnavailable, err)
}

// run sends one script call (or, for OpReset, one DEL) and turns the reply
// into decisions, or lets the failure policy answer.
func (s *Store) run(ctx context.Context, op sluice.Op, reqs []sluice.Request, script *rueidis.Lua) ([]sluice.Decision, error) {
	keys := make([]string, len(reqs))
	for i := range reqs {
		keys[i] = s.scriptKey(&reqs[i])
	}
	var args []string
	now, hint := int64(-1), s.localClk.Now()
	if s.testClk != nil {
		now = s.testClk.Now()
		hint = now
	}
	build := func(hint int64) error {
		args = make([]string, 3, 3+argsPerKey*len(reqs))
		args[0] = opArg(op)
		args[1], args[2] = timeArgs(now)
		for i := range reqs {
			var err error
			if args, err = appendArgs(args, &reqs[i], hint); err != nil {
				return err
			}
			if s.plainLayout(&reqs[i]) {
				args[len(args)-argsPerKey] = plainID
				args[len(args)-1] = s.plainSlackArg // in the lease slot
			}
		}
		return nil
	}
	if op != sluice.OpReset {
		if err := build(hint); err != nil {
			return nil, err
		}
	}
	client := s.client()
	if client == nil {
		return nil, s.notConnected()
	}
	cctx, cancel, alone := s.boundFor(ctx, op)
	defer cancel()
	s.calls.Add(1)
	var vals []int64
	var err error
	if op == sluice.OpReset {
		err = s.reset(cctx, client, reqs, keys, now)
	} else {
		vals, err = s.exec(cctx, client, script, keys, args, alone).AsIntSlice()
		if t, skewed := calendarMiss(vals, err); skewed {
			// A calendar window was computed around a clock too far from
			// Redis's: compute it around Redis's and ask once more.
			if err = build(t); err == nil {
				s.calls.Add(1)
				vals, err = s.exec(cctx, client, script, keys, args, alone).AsIntSlice()
				if t, skewed := calendarMiss(vals, err); skewed {
					err = fmt.Errorf("redisstore: calendar window: redis time %s lies outside the windows computed for it", time.Unix(0, t).UTC())
				}
			}
		}
		if err == nil && len(vals) != 4*len(reqs) {
			err = fmt.Errorf("redisstore: script replied %d values for %d keys", len(vals), len(reqs))
		}
	}
	if err != nil {
		return nil, s.failed(ctx, err)
	}
	ds := make([]sluice.Decision, len(reqs))
	dop := deniedOp(op, vals) // reserve.go
	for i := range reqs {
		if op == sluice.OpReset {
			ds[i] = sluice.Decision{Allowed: true, Limit: reqs[i].Limit, Remaining: reqs[i].Capacity()}
			continue
		}
		v := vals[4*i:]
		ds[i] = decideOp(dop, &reqs[i], reply{ok: v[0] == 1, x: v[1], y: v[2], z: v[3]})
		if s.plainLayout(&reqs[i]) {
			ds[i] = plainClamp(dop, ds[i])
		}
	}
	return ds, nil
}

// del deletes keys in one round trip.
func del(ctx context.Context, client rueidis.Client, keys []string) error {
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = client.B().Del().Key(k).Build()
	}
	for _, r := range client.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return err
		}
	}
	return nil
}

// isReadOnly reports a write refused by a replica, as after a failover.
func isReadOnly(err error) bool {
	return err != nil && strings.Contains(err.Error(), "READONLY")
}
