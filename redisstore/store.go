package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
)

// Errors of the Redis store. They work with errors.Is.
var (
	// ErrUnavailable means Redis could not answer in time: a network error,
	// a timeout, a failover in progress, or the circuit is open. Under the
	// ReturnError policy, Apply returns it; the other policies answer
	// instead and mark the Decision Degraded.
	ErrUnavailable = errors.New("redisstore: redis unavailable")
	// ErrCircuitOpen means the store did not ask Redis at all because recent
	// calls failed. It wraps ErrUnavailable.
	ErrCircuitOpen = fmt.Errorf("%w: circuit open", ErrUnavailable)
	// ErrBadURL means Options.URL cannot be used.
	ErrBadURL = errors.New("redisstore: bad redis url")
	// ErrUnsupportedLimit means a limit is valid for sluice but cannot be
	// computed exactly in Redis's Lua, which has only doubles: a fixed or
	// sliding-counter window whose period is not whole seconds and is
	// longer than 10 days.
	ErrUnsupportedLimit = errors.New("redisstore: limit not supported in redis")
	// ErrCrossSlot means an ApplyAll batch on Redis Cluster has keys in
	// different hash slots. Give them a common hash tag, such as
	// "{tenant:42}:rpm" and "{tenant:42}:tpm". It wraps
	// sluice.ErrInvalidRequest.
	ErrCrossSlot = fmt.Errorf("%w: keys of one batch must share a cluster hash slot", sluice.ErrInvalidRequest)
)

// Defaults for Options.
const (
	DefaultTimeout          = 50 * time.Millisecond
	DefaultBreakerThreshold = 3
	DefaultBreakerCooldown  = time.Second
	DefaultDenyCacheSize    = 65536
	DefaultLocalMaxKeys     = 100_000
	DefaultFlushDelay       = 20 * time.Microsecond
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
	// when zero.
	Timeout time.Duration
	// Policy decides what a call answers when Redis fails or times out.
	// Zero means FailOpen. Store.WithPolicy gives a view with another one,
	// so that each limiter can have its own.
	Policy Policy
	// Instances is the number of sluice instances sharing the limits; the
	// Local policy enforces limit ÷ Instances in memory. Zero means 1.
	Instances int
	// LocalMaxKeys bounds the Local policy's memory store.
	// DefaultLocalMaxKeys when zero.
	LocalMaxKeys int

	// BreakerThreshold is how many calls in a row must fail before the
	// circuit opens and calls stop going to Redis. DefaultBreakerThreshold
	// when zero.
	BreakerThreshold int
	// BreakerCooldown is how long the circuit stays open before one call
	// probes Redis again. DefaultBreakerCooldown when zero.
	BreakerCooldown time.Duration

	// DisableDenyCache turns off the local over-limit cache: by default a
	// key denied with RetryAfter d is denied locally, without asking Redis,
	// until d has passed (or this store refunds or resets the key).
	DisableDenyCache bool
	// DenyCacheSize bounds the over-limit cache. DefaultDenyCacheSize when zero.
	DenyCacheSize int

	// Logger receives circuit changes. Nil means slog.Default(). Keys and
	// credentials are never logged.
	Logger *slog.Logger

	// LocalClock is this process's clock, which only the over-limit cache
	// and the Local policy read. Nil means Clock, or the system clock.
	LocalClock clock.Clock

	// Clock is for tests only. Production leaves it nil, and every script
	// reads the time from Redis TIME, so instances with skewed clocks agree.
	// When set, its time is sent with every call instead (storetest drives
	// the store this way), and the over-limit cache and Local policy read it.
	Clock clock.Clock
}

// Store is the Redis sluice.Store: every operation is one Lua script run in
// one round trip, atomically, with the time read from Redis. It is safe for
// concurrent use.
type Store struct {
	*core
	policy Policy
}

// core is what the views of one store share.
type core struct {
	client   rueidis.Client
	ownsConn bool
	cluster  bool
	scripts  *scripts
	timeout  time.Duration
	testClk  clock.Clock
	localClk clock.Clock
	log      *slog.Logger
	br       *breaker
	cache    *denyCache // nil when disabled

	instances    int
	localMaxKeys int
	localOnce    sync.Once
	local        *memstore.Store
	localErr     error

	calls, errs, degraded, cacheHits atomic.Uint64

	// params caches the last fast-script parameters of each algorithm.
	params [sluice.Concurrency + 1]atomic.Pointer[fastParams]
}

// New connects to Redis and returns a Store. URL schemes:
//
//	redis://[user:password@]host[:port][/db]            standalone
//	rediss://...                                        standalone over TLS
//	redis+cluster://[user:password@]h1:p1,h2:p2,...      Cluster, any seeds
//	redis+sentinel://[user:password@]s1:p1,s2:p2/master  Sentinel
//
// rediss+cluster:// and rediss+sentinel:// use TLS. See the package doc for
// the query parameters. New fails with ErrUnavailable when Redis cannot be
// reached now, and with ErrBadURL for a malformed URL.
func New(ctx context.Context, opts Options) (*Store, error) {
	if opts.Timeout < 0 || opts.Instances < 0 || opts.BreakerThreshold < 0 || opts.BreakerCooldown < 0 || opts.DenyCacheSize < 0 || opts.LocalMaxKeys < 0 {
		return nil, errors.New("redisstore: negative option")
	}
	if opts.Policy != 0 && !opts.Policy.valid() {
		return nil, fmt.Errorf("redisstore: unknown policy %d", opts.Policy)
	}
	if opts.Policy == 0 {
		opts.Policy = FailOpen
	}
	c := &core{
		timeout:      cmp(opts.Timeout, DefaultTimeout),
		testClk:      opts.Clock,
		localClk:     opts.LocalClock,
		log:          opts.Logger,
		instances:    max(opts.Instances, 1),
		localMaxKeys: int(cmp(int64(opts.LocalMaxKeys), DefaultLocalMaxKeys)),
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
	c.br = newBreaker(int(cmp(int64(opts.BreakerThreshold), DefaultBreakerThreshold)), cmp(opts.BreakerCooldown, DefaultBreakerCooldown), c.log)
	if !opts.DisableDenyCache {
		c.cache = newDenyCache(int(cmp(int64(opts.DenyCacheSize), DefaultDenyCacheSize)))
	}
	var err error
	if c.scripts, err = loadScripts(); err != nil {
		return nil, err
	}
	if opts.Client != nil {
		c.client = opts.Client
		c.cluster = len(opts.Client.Nodes()) > 1
	} else {
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
		if c.client, err = rueidis.NewClient(copt); err != nil {
			return nil, fmt.Errorf("%w: connect (%s %s): %w", ErrUnavailable, mode, strings.Join(copt.InitAddress, ","), err)
		}
		c.ownsConn = true
		c.cluster = mode == "cluster"
	}
	c.preload(ctx)
	return &Store{core: c, policy: opts.Policy}, nil
}

// preload loads every script on every node, so that no first call of a
// script pays a NOSCRIPT round trip. It is best effort: a call that finds
// its script missing (after a restart or SCRIPT FLUSH) loads it anyway.
func (c *core) preload(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, max(c.timeout*4, time.Second))
	defer cancel()
	var srcs []string
	for _, src := range append(append(c.scripts.singleSrc[:], c.scripts.fastSrc[:]...), c.scripts.batchSrc) {
		if src != "" && !slices.Contains(srcs, src) {
			srcs = append(srcs, src)
		}
	}
	for addr, node := range c.client.Nodes() {
		cmds := make(rueidis.Commands, len(srcs)) // a command is sent once
		for i, src := range srcs {
			cmds[i] = node.B().ScriptLoad().Script(src).Build()
		}
		for _, r := range node.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				c.log.Debug("redisstore: could not preload a script", "addr", addr, "err", err)
				break
			}
		}
	}
}

func cmp[T int64 | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// WithPolicy returns a view of s that answers with policy p when Redis
// fails. The view shares s's connection, circuit, cache and statistics.
func (s *Store) WithPolicy(p Policy) *Store {
	if !p.valid() {
		p = s.policy
	}
	return &Store{core: s.core, policy: p}
}

// Policy returns the store's failure policy.
func (s *Store) Policy() Policy { return s.policy }

// Client returns the underlying rueidis client, to share it.
func (s *Store) Client() rueidis.Client { return s.client }

// Close releases the connection (unless it came from Options.Client) and
// the Local policy's memory store. Close the store once, not each view.
func (s *Store) Close() error {
	if s.ownsConn {
		s.client.Close()
	}
	if s.local != nil {
		return s.local.Close()
	}
	return nil
}

// Stats are a store's counters since New, for metrics.
type Stats struct {
	// Calls is the number of script calls sent to Redis.
	Calls uint64
	// Errors is the number of calls that failed or timed out.
	Errors uint64
	// Degraded is the number of decisions a failure policy made.
	Degraded uint64
	// CacheHits is the number of decisions the over-limit cache made.
	CacheHits uint64
	// BreakerOpens is how many times the circuit opened.
	BreakerOpens uint64
	// Circuit is "closed", "open" or "half_open".
	Circuit string
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	return Stats{
		Calls:        s.calls.Load(),
		Errors:       s.errs.Load(),
		Degraded:     s.degraded.Load(),
		CacheHits:    s.cacheHits.Load(),
		BreakerOpens: s.br.opens.Load(),
		Circuit:      s.br.stateName(),
	}
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
	var d sluice.Decision
	if fast := s.scripts.fast[req.Algorithm]; fast != nil && op != sluice.OpReset {
		var err error
		if d, err = s.runFast(ctx, op, &req, fast); err != nil {
			return sluice.Decision{}, err
		}
	} else {
		ds, err := s.run(ctx, op, []sluice.Request{req}, s.scripts.single[req.Algorithm])
		if err != nil {
			return sluice.Decision{}, err
		}
		d = ds[0]
	}
	if cacheable && !d.Allowed && !d.Degraded && d.RetryAfter > 0 && req.Cost <= 1 && (op == sluice.OpAllow || op == sluice.OpPeek) {
		s.cache.put(&req, d, asked)
	}
	return d, nil
}

// ApplyAll implements sluice.Store. On Redis Cluster the keys must share a
// hash slot (ErrCrossSlot otherwise). The over-limit cache does not answer
// batches, but a batch's refund or reset invalidates its keys.
func (s *Store) ApplyAll(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	for i := range reqs {
		if err := reqs[i].Validate(op); err != nil {
			return nil, fmt.Errorf("redisstore: request %d: %w", i, err)
		}
	}
	if len(reqs) == 0 {
		return nil, nil
	}
	if s.cluster {
		slot := keySlot(reqs[0].Key)
		for i := range reqs[1:] {
			if keySlot(reqs[i+1].Key) != slot {
				return nil, fmt.Errorf("redisstore: %w: %q and %q", ErrCrossSlot, reqs[0].Key, reqs[i+1].Key)
			}
		}
	}
	if s.cache != nil && op != sluice.OpAllow && op != sluice.OpPeek {
		for i := range reqs {
			s.cache.del(reqs[i].Key)
		}
	}
	a := reqs[0].Algorithm
	if fast := s.scripts.fast[a]; fast != nil && len(reqs) == 1 && op != sluice.OpReset {
		d, err := s.runFast(ctx, op, &reqs[0], fast)
		if err != nil {
			return nil, err
		}
		return []sluice.Decision{d}, nil
	}
	for i := range reqs[1:] {
		if reqs[i+1].Algorithm != a {
			return s.run(ctx, op, reqs, s.scripts.batch)
		}
	}
	// One algorithm: its own script defines only the functions it needs.
	return s.run(ctx, op, reqs, s.scripts.single[a])
}

// runFast runs a lean one-key script for req. It is the hot path, so it
// allocates little: the ARGV come from the per-limit cache, and the
// request is put in a slice only when the failure policy answers.
func (s *Store) runFast(ctx context.Context, op sluice.Op, req *sluice.Request, script *rueidis.Lua) (sluice.Decision, error) {
	p := s.params[req.Algorithm].Load()
	if !p.matches(req) {
		var err error
		if p, err = newFastParams(req); err != nil {
			return sluice.Decision{}, err
		}
		s.params[req.Algorithm].Store(p)
	}
	args := p.argv[op]
	if s.testClk != nil {
		args = fastArgs(op, p, s.testClk.Now())
	}
	one := func(ds []sluice.Decision, err error) (sluice.Decision, error) {
		if err != nil {
			return sluice.Decision{}, err
		}
		return ds[0], nil
	}
	if !s.br.allow() {
		return one(s.degrade(ctx, op, []sluice.Request{*req}, ErrCircuitOpen))
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	s.calls.Add(1)
	keys := []string{req.Key}
	var vals []int64
	var err error
	if s.br.healthy() {
		vals, err = script.Exec(cctx, s.client, keys, args).AsIntSlice()
	} else {
		vals, err = s.bounded(cctx, func(ctx context.Context) ([]int64, error) {
			return script.Exec(ctx, s.client, keys, args).AsIntSlice()
		})
	}
	want := 2
	if req.Algorithm == sluice.FixedWindow {
		want = 3
	}
	if err == nil && len(vals) != want {
		err = fmt.Errorf("redisstore: script replied %d values, want %d", len(vals), want)
	}
	if err != nil {
		return one(s.failed(ctx, op, []sluice.Request{*req}, err))
	}
	s.br.success()
	r := reply{ok: vals[0] == 1, x: vals[1]}
	switch req.Algorithm {
	case sluice.TokenBucket: // the script's TAT − now is tau − level
		r.x = p.tau - r.x
	case sluice.FixedWindow:
		r.y = vals[2]
	}
	return decide(req, r), nil
}

// failed handles a failed call: the caller's own cancellation is returned
// as it is; anything else counts against Redis and the policy answers.
func (s *Store) failed(ctx context.Context, op sluice.Op, reqs []sluice.Request, err error) ([]sluice.Decision, error) {
	if ctx.Err() != nil { // the caller gave up: not Redis's fault
		s.br.release()
		return nil, fmt.Errorf("redisstore: %w", ctx.Err())
	}
	s.errs.Add(1)
	s.br.failure(err)
	if isReadOnly(err) {
		s.log.Warn("redisstore: redis refused a write as a replica (READONLY, as after a failover); degraded until a master answers", "err", err)
	}
	return s.degrade(ctx, op, reqs, fmt.Errorf("%w: %w", ErrUnavailable, err))
}

// run sends one script call (or, for OpReset, one DEL) and turns the reply
// into decisions, or lets the failure policy answer.
func (s *Store) run(ctx context.Context, op sluice.Op, reqs []sluice.Request, script *rueidis.Lua) ([]sluice.Decision, error) {
	keys := make([]string, len(reqs))
	for i := range reqs {
		keys[i] = reqs[i].Key
	}
	var args []string
	if op != sluice.OpReset {
		args = make([]string, 3, 3+argsPerKey*len(reqs))
		args[0] = opArg(op)
		now := int64(-1)
		if s.testClk != nil {
			now = s.testClk.Now()
		}
		args[1], args[2] = timeArgs(now)
		for i := range reqs {
			var err error
			if args, err = appendArgs(args, &reqs[i]); err != nil {
				return nil, err
			}
		}
	}
	if !s.br.allow() {
		return s.degrade(ctx, op, reqs, ErrCircuitOpen)
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	s.calls.Add(1)
	var vals []int64
	var err error
	if op == sluice.OpReset {
		err = s.del(cctx, keys)
	} else {
		vals, err = s.bounded(cctx, func(ctx context.Context) ([]int64, error) {
			return script.Exec(ctx, s.client, keys, args).AsIntSlice()
		})
		if err == nil && len(vals) != 4*len(reqs) {
			err = fmt.Errorf("redisstore: script replied %d values for %d keys", len(vals), len(reqs))
		}
	}
	if err != nil {
		return s.failed(ctx, op, reqs, err)
	}
	s.br.success()
	ds := make([]sluice.Decision, len(reqs))
	for i := range reqs {
		if op == sluice.OpReset {
			ds[i] = sluice.Decision{Allowed: true, Limit: reqs[i].Limit, Remaining: reqs[i].Capacity()}
			continue
		}
		v := vals[4*i:]
		ds[i] = decide(&reqs[i], reply{ok: v[0] == 1, x: v[1], y: v[2], z: v[3]})
	}
	return ds, nil
}

// bounded runs call directly while Redis is healthy, when the client
// honours ctx's deadline. After a failure, while the client may be
// reconnecting (a dial or handshake that ignores ctx), it runs call in a
// goroutine and returns at the deadline whatever call is doing.
func (s *Store) bounded(ctx context.Context, call func(context.Context) ([]int64, error)) ([]int64, error) {
	if s.br.healthy() {
		return call(ctx)
	}
	type result struct {
		vals []int64
		err  error
	}
	done := make(chan result, 1)
	go func() {
		v, err := call(ctx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.vals, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// del deletes keys in one round trip.
func (s *Store) del(ctx context.Context, keys []string) error {
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = s.client.B().Del().Key(k).Build()
	}
	for _, r := range s.client.DoMulti(ctx, cmds...) {
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
