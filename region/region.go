package region

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v4"
	"github.com/redis/rueidis"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
)

// Defaults for Options.
const (
	DefaultHorizon      = 250 * time.Millisecond
	DefaultTTL          = 5 * time.Second
	DefaultIdleAfter    = time.Second
	DefaultMaxFraction  = 0.25
	DefaultFetchTimeout = 2 * time.Second
	DefaultFetchWait    = 500 * time.Millisecond
	DefaultDownRetry    = 500 * time.Millisecond
	DefaultMaxKeys      = 10_000
	DefaultPrefix       = "sluice:share:"
	DefaultCallTimeout  = 100 * time.Millisecond
)

// Errors of a Store. They work with errors.Is.
var (
	// ErrUnsupported means a global key was asked for what shares cannot
	// decide: an algorithm other than GCRA, TokenBucket and FixedWindow
	// (without a Calendar), a reservation (MaxWait), or a batch holding a
	// global key with others.
	ErrUnsupported = errors.New("region: not supported for a global key")
	// ErrUnknownRegion means a key's home names no region of Options.Regions.
	ErrUnknownRegion = errors.New("region: unknown region")
)

// Policy is what a region answers for a global key when it holds no share
// and cannot fetch one from the key's home region.
type Policy uint8

// The failure policies of a region cut off from a key's home.
const (
	// FailClosed denies, Degraded, with RetryAfter the next attempt to
	// reach the home: the global bound holds. It is the default.
	FailClosed Policy = iota + 1
	// FailOpen admits, Degraded: availability over the bound, which is
	// then lost for as long as the home is unreachable.
	FailOpen
)

// String returns the policy's name as Decision.Fallback carries it.
func (p Policy) String() string {
	switch p {
	case FailClosed:
		return "fail_closed"
	case FailOpen:
		return "fail_open"
	}
	return fmt.Sprintf("policy(%d)", p)
}

// ParsePolicy reads "fail_closed" or "fail_open" ("" is FailClosed).
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "", "fail_closed":
		return FailClosed, nil
	case "fail_open":
		return FailOpen, nil
	}
	return 0, fmt.Errorf("region: unknown failure policy %q (want fail_closed or fail_open)", s)
}

// Options configure a Store. Region, Regions and Ledger are required.
type Options struct {
	// Region is the region this instance runs in.
	Region string
	// Regions holds every region's store as this instance reaches it: its
	// own region's store (local, on the hot path) and the others' (across
	// regions, used only to fetch and refund shares of the keys whose home
	// they are). Close leaves them open.
	Regions map[string]sluice.Store
	// Ledger is a client of this region's Redis, where the region keeps
	// the shares it holds, so that all of its instances spend them
	// atomically. Close leaves it open.
	Ledger rueidis.Client
	// Global reports whether a request's key is global, held to one limit
	// across regions; the others are regional and go to this region's
	// store untouched. Nil makes every key regional.
	Global func(req *sluice.Request) bool
	// Home names a global key's home region, whose store is the key's
	// authority. Nil means HashHome over Regions.
	Home func(key string) string
	// Horizon is how much of this instance's recent demand on a key a
	// share fetch covers, at least three fetch round trips.
	// DefaultHorizon when zero.
	Horizon time.Duration
	// MaxFraction bounds one fetch to this fraction of the key's capacity
	// (the burst; Rate for windows). DefaultMaxFraction when zero; at most 1.
	MaxFraction float64
	// TTL is how long a bucket (GCRA, TokenBucket) share may be spent
	// after the fetch that charged it was sent; then its rest is refunded
	// at home. A window's share expires with its window. DefaultTTL when
	// zero.
	TTL time.Duration
	// IdleAfter is how long a bucket share may go unspent in the region
	// before it is refunded at home. DefaultIdleAfter when zero.
	IdleAfter time.Duration
	// SweepEvery is how often idle and expired shares are refunded:
	// IdleAfter/2 when zero; negative runs no sweep (tests call Sweep).
	SweepEvery time.Duration
	// FetchTimeout bounds a share fetch or refund across regions.
	// DefaultFetchTimeout when zero.
	FetchTimeout time.Duration
	// FetchWait is how long a request that finds no share waits for a
	// fetch in flight (a cold key waits one fetch): DefaultFetchWait when
	// zero, negative never waits.
	FetchWait time.Duration
	// DownRetry is how long after a failed fetch the next one is tried.
	// DefaultDownRetry when zero.
	DownRetry time.Duration
	// CallTimeout bounds a call to this region's Redis for a share.
	// DefaultCallTimeout when zero.
	CallTimeout time.Duration
	// ClockSkew, when positive, is how far apart the clocks of the
	// regions' hosts may be, at most (NTP keeps them within milliseconds):
	// a window share is then spent until its window's end by this
	// instance's clock less ClockSkew. Zero trusts no clock: a share
	// ends one fetch round trip early at worst, and each window loses
	// that much of the region's demand (see docs/regions.md).
	ClockSkew time.Duration
	// Policy answers a global key when its home cannot be reached and
	// the region's share is spent. FailClosed when zero.
	Policy Policy
	// Prefix is put before a key to name its share in the ledger.
	// DefaultPrefix when empty.
	Prefix string
	// MaxKeys bounds the global keys an instance tracks; requests for
	// more are answered from the ledger without fetching. DefaultMaxKeys
	// when zero.
	MaxKeys int
	// Clock is this process's clock, for demand rates and expiry
	// estimates. Nil means the system clock.
	Clock clock.Clock
	// LedgerClock is for tests: when set, the ledger's scripts take its
	// time instead of Redis TIME.
	LedgerClock clock.Clock
	// Logger receives failed refunds. Nil means slog.Default(). Keys are
	// never logged.
	Logger *slog.Logger
}

// HashHome returns a Home function that spreads keys over the regions by
// a hash of the key, so that every instance computes the same home.
func HashHome(regions []string) func(key string) string {
	rs := slices.Clone(regions)
	slices.Sort(rs)
	return func(key string) string {
		h := fnv.New64a()
		_, _ = h.Write([]byte(key))
		return rs[h.Sum64()%uint64(len(rs))]
	}
}

// Store is a sluice.Store for one region: regional keys go to the
// region's store, global keys are decided in the region from shares of
// their capacity charged at their home. See the package doc.
type Store struct {
	region    string
	regions   map[string]sluice.Store
	local     sluice.Store
	led       *ledger
	global    func(*sluice.Request) bool
	home      func(string) string
	horizon   float64 // s
	frac      float64
	ttl       int64
	idle      time.Duration
	fetchTO   time.Duration
	fetchWait time.Duration
	downRetry int64
	skew      int64
	policy    Policy
	maxKeys   int64
	clk       clock.Clock
	log       *slog.Logger

	keys *xsync.Map[string, *entry]
	size atomic.Int64

	st counters

	stop     chan struct{}
	stopOnce sync.Once
	bg       sync.WaitGroup
	closeMu  sync.RWMutex
	closed   bool
	inflight sync.WaitGroup
}

// New validates opts and returns a Store; it starts the background sweep
// unless SweepEvery is negative.
func New(opts Options) (*Store, error) {
	if opts.Region == "" {
		return nil, errors.New("region: Options.Region is required")
	}
	if opts.Regions[opts.Region] == nil {
		return nil, fmt.Errorf("%w: %q has no store in Options.Regions", ErrUnknownRegion, opts.Region)
	}
	for name, st := range opts.Regions {
		if st == nil || name == "" {
			return nil, fmt.Errorf("region: Options.Regions: region %q without a store", name)
		}
	}
	if opts.Ledger == nil {
		return nil, errors.New("region: Options.Ledger is required")
	}
	if opts.Horizon < 0 || opts.ClockSkew < 0 || opts.TTL < 0 || opts.IdleAfter < 0 || opts.FetchTimeout < 0 || opts.DownRetry < 0 || opts.CallTimeout < 0 || opts.MaxKeys < 0 {
		return nil, errors.New("region: negative option")
	}
	if opts.MaxFraction < 0 || opts.MaxFraction > 1 || math.IsNaN(opts.MaxFraction) {
		return nil, fmt.Errorf("region: MaxFraction %v must be in (0, 1]", opts.MaxFraction)
	}
	if opts.Policy != 0 && opts.Policy != FailClosed && opts.Policy != FailOpen {
		return nil, fmt.Errorf("region: unknown policy %d", opts.Policy)
	}
	scr, err := loadScripts()
	if err != nil {
		return nil, err
	}
	s := &Store{
		region:    opts.Region,
		regions:   opts.Regions,
		local:     opts.Regions[opts.Region],
		global:    opts.Global,
		home:      opts.Home,
		horizon:   def(opts.Horizon, DefaultHorizon).Seconds(),
		frac:      opts.MaxFraction,
		ttl:       int64(def(opts.TTL, DefaultTTL)),
		idle:      def(opts.IdleAfter, DefaultIdleAfter),
		fetchTO:   def(opts.FetchTimeout, DefaultFetchTimeout),
		fetchWait: def(opts.FetchWait, DefaultFetchWait),
		downRetry: int64(def(opts.DownRetry, DefaultDownRetry)),
		skew:      int64(opts.ClockSkew),
		policy:    opts.Policy,
		maxKeys:   int64(opts.MaxKeys),
		clk:       opts.Clock,
		log:       opts.Logger,
		keys:      xsync.NewMap[string, *entry](),
		stop:      make(chan struct{}),
	}
	s.led = &ledger{
		client:  opts.Ledger,
		prefix:  opts.Prefix,
		clk:     opts.LedgerClock,
		gc:      int64(time.Minute / time.Millisecond),
		timeout: def(opts.CallTimeout, DefaultCallTimeout),
		s:       scr,
	}
	if opts.LedgerClock != nil {
		s.led.gc = int64(time.Hour / time.Millisecond) // Redis expires by its own clock
	}
	if s.led.prefix == "" {
		s.led.prefix = DefaultPrefix
	}
	if s.home == nil {
		names := make([]string, 0, len(opts.Regions))
		for n := range opts.Regions {
			names = append(names, n)
		}
		s.home = HashHome(names)
	}
	if s.frac == 0 {
		s.frac = DefaultMaxFraction
	}
	if s.policy == 0 {
		s.policy = FailClosed
	}
	if s.maxKeys == 0 {
		s.maxKeys = DefaultMaxKeys
	}
	if s.clk == nil {
		s.clk = clock.NewSystem()
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if every := opts.SweepEvery; every >= 0 {
		if every == 0 {
			every = s.idle / 2
		}
		s.bg.Go(func() { s.sweepLoop(every) })
	}
	return s, nil
}

func def(v, d time.Duration) time.Duration {
	if v == 0 {
		return d
	}
	return v
}

// Region returns the region this Store decides for.
func (s *Store) Region() string { return s.region }

// Unwrap returns this region's store.
func (s *Store) Unwrap() sluice.Store { return s.local }

// HomeOf returns the home region of a global key.
func (s *Store) HomeOf(key string) string { return s.home(key) }

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
	home := s.home(req.Key)
	if home == s.region {
		d, err := s.local.Apply(ctx, op, req)
		if err == nil && op == sluice.OpAllow {
			s.st.home.Add(1)
		}
		return d, err
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
		if req.Algorithm == sluice.FixedWindow {
			// A window's units are not given back: the refund could land
			// in a share of the next window.
			return sluice.Decision{Allowed: true, Limit: req.Limit, Source: sluice.FromShare}, nil
		}
		sh, err := s.led.apply(ctx, "refund", req.Key, req.Cost, "")
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
				s.prefetch(hs, e)
			}
		}
		d := s.shareDecision(&req, sh)
		d.Allowed = true
		return d, nil
	case sluice.OpReset:
		if _, err := s.led.take(ctx, req.Key, 0, true); err != nil {
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
	var remote []int
	if s.global != nil {
		for i := range reqs {
			if s.global(&reqs[i]) && s.home(reqs[i].Key) != s.region {
				remote = append(remote, i)
			}
		}
	}
	if len(remote) == 0 {
		return s.local.ApplyAll(ctx, op, reqs)
	}
	if op != sluice.OpAllow || len(reqs) == 1 {
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

// supported checks that shares can decide req.
func supported(req *sluice.Request) error {
	switch {
	case req.MaxWait != 0:
		return fmt.Errorf("%w: a reservation (max wait %s)", ErrUnsupported, req.MaxWait)
	case req.Algorithm == sluice.GCRA, req.Algorithm == sluice.TokenBucket:
		return nil
	case req.Algorithm == sluice.FixedWindow && req.Limit.Calendar.IsZero():
		return nil
	}
	return fmt.Errorf("%w: algorithm %s (GCRA, token_bucket and fixed_window without a calendar are)", ErrUnsupported, req.Algorithm)
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
			s.prefetch(hs, e)
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
	if ch := s.prefetch(hs, e); ch != nil && !short && s.fetchWait >= 0 {
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

// Close stops the sweep and waits for the fetches and refunds in flight.
// The region's shares stay in its store for its other instances; the
// last instance's are lost when they expire (under-admission, never
// over). It leaves the stores and the ledger client open.
func (s *Store) Close() error {
	s.stopOnce.Do(func() { close(s.stop) })
	s.bg.Wait()
	s.closeMu.Lock()
	s.closed = true
	s.closeMu.Unlock()
	s.inflight.Wait()
	return nil
}
