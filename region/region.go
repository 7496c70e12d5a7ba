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
	// (periodic or calendar windows), a reservation (MaxWait), or a batch
	// holding a global key with others.
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
	// Async reports whether a global key is asynchronous: decided on this
	// region's store alone, its admissions delivered to the other regions'
	// stores every SyncInterval (package doc, async.go). Nil makes every
	// global key exact.
	Async func(req *sluice.Request) bool
	// SyncInterval is how often an instance delivers the units it
	// admitted of asynchronous keys to the other regions.
	// DefaultSyncInterval when zero; negative runs no loop (tests call
	// Sync).
	SyncInterval time.Duration
	// StaleAfter is how old a count an instance could not deliver to
	// another region may grow before the instance answers the key by
	// Policy instead of its store: the longest delay δ of the
	// asynchronous bound under faults. DefaultStaleAfter when zero.
	StaleAfter time.Duration
	// EpochEvery is how often, at most, an instance checks that the home
	// of an exact global key (the region's store, for an asynchronous
	// key) still holds the key's state (epoch.go): a store that lost it,
	// restarted or failed over, is charged the key's capacity. It is
	// checked at once after a call to that store failed.
	// DefaultEpochEvery when zero; negative never checks.
	EpochEvery time.Duration
	// TrustHistory keeps the epoch check to lost markers: a store whose
	// replication id changed since a key's marker was set (a failover to
	// a replica, a restart from its files) is trusted to hold the key's
	// charges, and not quarantined. Set it only for stores that persist
	// every write and fail over to replicas in sync: a failover to a
	// replica that lags then exceeds the limit by the charges it missed
	// (its lag × the key's rate; docs/regions.md, failure table). The
	// default quarantines once per change of history: under-admission
	// (a key's capacity C, once) on every restart or failover.
	TrustHistory bool
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
	// after the fetch that charged it was sent (by the region's Redis
	// clock); then its rest is refunded at home. A window's share expires
	// with its window. DefaultTTL when zero.
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
	// MaxKeys bounds the global keys an instance tracks. When they are
	// all tracked, a new exact key makes room by forgetting the keys
	// unused for two fetch round trips (at least EvictAfter) with no
	// fetch in flight (keys.go); failing that it is answered from the
	// ledger without fetching. DefaultMaxKeys
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
	id        string // this instance, in the demand tables (fair.go)
	regions   map[string]sluice.Store
	local     sluice.Store
	led       *ledger
	global    func(*sluice.Request) bool
	async     func(*sluice.Request) bool
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

	keys    *xsync.Map[string, *entry]
	size    atomic.Int64
	evictAt atomic.Int64 // ns of the last eviction pass (keys.go)

	// the keys this region is the home of that are at their limit: their
	// refill is allotted every fairEvery (fair.go)
	hot *xsync.Map[string, *entry]

	orphanMu sync.Mutex
	orphans  []orphan // evicted keys whose shares the sweep refunds (keys.go)

	// the asynchronous mode (async.go)
	akeys      *xsync.Map[string, *counts]
	remotes    []string        // the other regions, sorted
	sems       []chan struct{} // per remote region, bounds the deliveries in flight
	syncEvery  time.Duration
	staleAfter int64
	epochEvery int64
	trustHist  bool                          // TrustHistory
	aseen      *xsync.Map[string, asyncSeen] // epoch.go
	aseenN     atomic.Int64
	infoWarned atomic.Bool // a store refused INFO to the epoch check, logged once

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
	if opts.Horizon < 0 || opts.StaleAfter < 0 || opts.ClockSkew < 0 || opts.TTL < 0 || opts.IdleAfter < 0 || opts.FetchTimeout < 0 || opts.DownRetry < 0 || opts.CallTimeout < 0 || opts.MaxKeys < 0 {
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
		region:     opts.Region,
		id:         newInstanceID(),
		regions:    opts.Regions,
		local:      opts.Regions[opts.Region],
		global:     opts.Global,
		async:      opts.Async,
		home:       opts.Home,
		horizon:    def(opts.Horizon, DefaultHorizon).Seconds(),
		frac:       opts.MaxFraction,
		ttl:        int64(def(opts.TTL, DefaultTTL)),
		idle:       def(opts.IdleAfter, DefaultIdleAfter),
		fetchTO:    def(opts.FetchTimeout, DefaultFetchTimeout),
		fetchWait:  def(opts.FetchWait, DefaultFetchWait),
		downRetry:  int64(def(opts.DownRetry, DefaultDownRetry)),
		skew:       int64(opts.ClockSkew),
		policy:     opts.Policy,
		maxKeys:    int64(opts.MaxKeys),
		clk:        opts.Clock,
		log:        opts.Logger,
		keys:       xsync.NewMap[string, *entry](),
		akeys:      xsync.NewMap[string, *counts](),
		hot:        xsync.NewMap[string, *entry](),
		aseen:      xsync.NewMap[string, asyncSeen](),
		syncEvery:  def(opts.SyncInterval, DefaultSyncInterval),
		staleAfter: int64(def(opts.StaleAfter, DefaultStaleAfter)),
		epochEvery: int64(def(opts.EpochEvery, DefaultEpochEvery)),
		trustHist:  opts.TrustHistory,
		stop:       make(chan struct{}),
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
	for n := range opts.Regions {
		if n != opts.Region {
			s.remotes = append(s.remotes, n)
		}
	}
	slices.Sort(s.remotes)
	for range s.remotes {
		s.sems = append(s.sems, make(chan struct{}, syncFanout))
	}
	if s.async != nil && s.syncEvery > 0 {
		s.bg.Go(func() { s.syncLoop(s.syncEvery) })
	}
	if every := opts.SweepEvery; every >= 0 {
		if every == 0 {
			every = s.idle / 2
		}
		s.bg.Go(func() { s.sweepLoop(every) })
	}
	if s.global != nil {
		s.bg.Go(s.allotLoop)
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

// Close stops the sweep and the deliveries of asynchronous counts (a last
// round delivers what this instance admitted) and waits for the fetches
// and refunds in flight.
// The region's shares stay in its store for its other instances; the
// last instance's are lost when they expire (under-admission, never
// over). It leaves the stores and the ledger client open.
func (s *Store) Close() error {
	s.stopOnce.Do(func() { close(s.stop) })
	s.bg.Wait()
	if s.async != nil {
		ctx, cancel := context.WithTimeout(context.Background(), s.fetchTO)
		s.Sync(ctx)
		cancel()
	}
	s.closeMu.Lock()
	s.closed = true
	s.closeMu.Unlock()
	s.inflight.Wait()
	return nil
}
