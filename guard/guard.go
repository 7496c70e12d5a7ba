package guard

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
)

// Errors of the guard. They work with errors.Is.
var (
	// ErrUnavailable is sluice.ErrUnavailable: the store could not answer.
	// Under ReturnError every degraded call returns an error wrapping it;
	// refund, charge and reset return one under every policy.
	ErrUnavailable = sluice.ErrUnavailable
	// ErrCircuitOpen means the store was not asked because its node is
	// failing. It wraps ErrUnavailable.
	ErrCircuitOpen = fmt.Errorf("%w: circuit open", ErrUnavailable)
	// ErrBusy means the key already had Options.MaxInFlightPerKey calls in
	// flight until the deadline. It wraps ErrUnavailable.
	ErrBusy = fmt.Errorf("%w: too many calls in flight for the key", ErrUnavailable)
	// ErrDeadline means the store did not answer within Options.Timeout.
	// It wraps ErrUnavailable.
	ErrDeadline = fmt.Errorf("%w: deadline exceeded", ErrUnavailable)
	// ErrInstancesUnknown means fewer than two heartbeats have read the
	// instance count (the store was down since start, or just came up) and
	// Options.Instances is not set: the Local policy denies until two have.
	// Ready's error wraps it.
	ErrInstancesUnknown = errors.New("guard: instance count not read yet; the local policy denies until it is (set Instances to the fleet's size to answer meanwhile)")
)

// Pinger is implemented by stores that can tell whether they are
// reachable. The probe calls it; a store that does not implement it is
// probed with a zero-cost OpPeek.
type Pinger interface {
	// Ping returns nil when the store answers.
	Ping(ctx context.Context) error
}

// Sharded is implemented by stores whose keys live on several nodes, such
// as Redis Cluster: the guard then tracks failure per node, and keys on
// healthy nodes keep their exact answers while one node is slow, dead or
// failing over.
type Sharded interface {
	// NodeOf names the node that owns key now. The keys of one ApplyAll
	// must live on one node. It is called on every call: make it cheap.
	NodeOf(key string) string
	// Nodes names the nodes that own keys now, for the probe.
	Nodes(ctx context.Context) ([]string, error)
	// PingNode returns nil when node answers.
	PingNode(ctx context.Context, node string) error
}

// Membership is implemented by stores that can count the instances
// sharing them, for the Local policy's share (limit ÷ instances).
//
// The guard looks for Pinger, Sharded and Membership on the store it
// wraps and, through Unwrap() sluice.Store methods, on the stores below it.
type Membership interface {
	// Heartbeat records that instance id is alive for ttl and returns how
	// many instances are alive, itself included.
	Heartbeat(ctx context.Context, id string, ttl time.Duration) (int, error)
	// Leave removes instance id at once.
	Leave(ctx context.Context, id string) error
}

// Defaults for Options.
const (
	DefaultTimeout           = 50 * time.Millisecond
	DefaultWindow            = time.Second
	DefaultMinFailures       = 10
	DefaultMinFailingKeys    = 4
	DefaultFailureRatio      = 0.5
	DefaultMaxProbeFailures  = 2
	DefaultProbeInterval     = 200 * time.Millisecond
	DefaultHeartbeatInterval = time.Second
	DefaultMaxInFlightPerKey = 8
	DefaultLocalMaxKeys      = 100_000
	DefaultLogEvery          = 10 * time.Second
)

// Options configure a Guard. The zero value is usable.
type Options struct {
	// Policy answers when the store cannot. Zero means Local.
	Policy Policy
	// Timeout is the deadline of every call to the store, waiting for a
	// slot of its key included. DefaultTimeout (50ms) when zero; negative
	// means none (a memory store). Calls starting within a 64th of it
	// share one deadline, rounded down: a call gets at least 63/64 of it.
	Timeout time.Duration
	// Instances, when positive, is the number of instances sharing the
	// limits, for Local's share. Zero means: learn it from the store's
	// heartbeats (Membership), remembering the last count while the store
	// is away; 1 for a store that cannot count. Until the first count is
	// read (a fleet started while its store is down) Local then denies:
	// set Instances to the fleet's size to keep answering then.
	Instances int
	// LocalMaxKeys bounds each of Local's maps: the memory store, the last
	// decisions remembered per key (a table of LocalMaxKeys rounded up to a
	// power of two slots, where a key may take another's place), and the
	// charges owed to the store. DefaultLocalMaxKeys when zero.
	LocalMaxKeys int
	// LocalMaxBytes bounds the heap Local's memory store takes, as
	// memstore.Options.MaxBytes does: past it, the store evicts the keys
	// whose loss admits least, never a used-up key before fresh ones.
	// Give it the budget of the memory store (serve passes store.max_bytes),
	// so that a key flood while the store is away is held as one would be
	// with the memory store. Zero means memstore.DefaultMaxBytes.
	LocalMaxBytes int64
	// LateGrace is how long past Timeout a call to a node that works (its
	// circuit closed, its last probe answered) waits for its reply before
	// the policy answers it. On a loaded machine the store's replies are
	// read late although the store answered in time; answered by the
	// policy, such calls denied (or spent locally) what the store owed the
	// keys of live nodes: 65-93 % of it during a failover. A call to a node
	// that is not known to work still gets the policy's answer at Timeout,
	// and a node whose circuit is open is not called at all: a dead node
	// slows only the calls sent to it before its circuit opens. The store
	// call itself gets Timeout + LateGrace as its deadline (StoreTimeout:
	// give the wrapped store at least that as its own timeout). Zero means
	// 4 × Timeout (a store call's deadline 5 × Timeout: 250ms by default,
	// within which redisstore's connection timeout stays 1s); negative
	// means none.
	LateGrace time.Duration
	// MaxInFlightPerKey bounds the calls one key may have in flight to the
	// store; more wait for a slot until the deadline, then the policy
	// answers them. DefaultMaxInFlightPerKey (8) when zero.
	MaxInFlightPerKey int

	// Window is the failure detector's window. A node's circuit opens when
	// within it at least MinFailures calls failed or missed the deadline,
	// on at least MinFailingKeys distinct keys, and they were at least
	// FailureRatio of its calls. Defaults: 1s, 10, 4, 0.5.
	Window         time.Duration
	MinFailures    int
	MinFailingKeys int
	FailureRatio   float64
	// ProbeInterval is how often a background probe pings every node,
	// whatever the traffic: MaxProbeFailures failed probes in a row open a
	// node's circuit, and one successful probe closes it (after Local's
	// charges are settled). Defaults: 200ms, 2.
	ProbeInterval    time.Duration
	MaxProbeFailures int
	// HeartbeatInterval is how often the instance renews its heartbeat in
	// a Membership store (with a TTL of three intervals) and reads the
	// count. DefaultHeartbeatInterval when zero.
	HeartbeatInterval time.Duration

	// Logger receives store errors, at most one line per node per LogEvery
	// (with the number not logged), and circuit changes. Nil means
	// slog.Default(). Keys are never logged.
	Logger   *slog.Logger
	LogEvery time.Duration
	// Clock is the local clock of the failure window and of Local. Nil
	// means the system clock.
	Clock clock.Clock
	// CloseStore makes Close close the wrapped store too, when it is an
	// io.Closer.
	CloseStore bool

	// starved replaces the reading of the process's CPU starvation
	// (cpu.go) in this package's tests.
	starved func() bool
}

// Guard wraps a sluice.Store with a per-call deadline, a failure detector
// per node with a circuit, a bound on the calls in flight per key, and a
// failure Policy. It is a sluice.Store, safe for concurrent use. WithPolicy
// gives views with another policy over the same state.
type Guard struct {
	*core
	policy Policy
}

type core struct {
	inner      sluice.Store
	sharded    Sharded
	pinger     Pinger
	membership Membership
	closer     interface{ Close() error }

	timeout     time.Duration
	window      time.Duration
	minFailures int
	minKeys     int
	ratio       float64
	probeEvery  time.Duration
	maxProbe    int32
	beatEvery   time.Duration
	fixedN      int
	logEvery    time.Duration
	clk         clock.Clock
	log         *slog.Logger
	id          string

	nodes   *xsync.Map[string, *node]
	gates   *gates
	local   *local
	workers *workers
	dls     *deadlines // nil without a timeout
	lateDls *deadlines // the store calls' deadlines, Timeout + LateGrace; nil without a grace
	// starved reports whether this process was starved of CPU lately
	// (cpu.go); tests replace it.
	starved func() bool
	views   [numPolicies]*Guard

	instances   atomic.Int64
	beats       atomic.Int64 // heartbeats that read a count
	beatMu      sync.Mutex   // the heartbeat's reading of the count
	lowReads    int          // heartbeats in a row that read fewer instances than counted
	lowMax      int64        // the most they read
	calls       atomic.Uint64
	errs        atomic.Uint64
	busy        atomic.Uint64
	opens       atomic.Uint64
	starvedLate atomic.Uint64 // late calls and probes not held against the store: this process was starved
	lateAnswers atomic.Uint64 // calls answered by the store after Timeout, within LateGrace
	degraded    [numPolicies]atomic.Uint64
	lastProbe   atomic.Int64

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// New wraps store. It probes the store once (and, for a Membership store,
// sends the first heartbeat) before it returns, within a short deadline,
// and never fails because the store is down: the background probe then
// finds it when it comes. Close the Guard to stop the probe.
func New(store sluice.Store, opts Options) (*Guard, error) {
	if store == nil {
		return nil, errors.New("guard: nil store")
	}
	if opts.Policy == 0 {
		opts.Policy = Local
	}
	if !opts.Policy.Valid() {
		return nil, fmt.Errorf("guard: unknown policy %d", opts.Policy)
	}
	if opts.Instances < 0 || opts.LocalMaxKeys < 0 || opts.LocalMaxBytes < 0 || opts.MaxInFlightPerKey < 0 || opts.Window < 0 || opts.MinFailures < 0 ||
		opts.MinFailingKeys < 0 || opts.FailureRatio < 0 || opts.FailureRatio > 1 || opts.ProbeInterval < 0 ||
		opts.MaxProbeFailures < 0 || opts.HeartbeatInterval < 0 || opts.LogEvery < 0 {
		return nil, errors.New("guard: negative option, or FailureRatio above 1")
	}
	if opts.MinFailingKeys > 64 {
		return nil, errors.New("guard: MinFailingKeys above 64")
	}
	c := &core{
		inner:       store,
		timeout:     def(opts.Timeout, DefaultTimeout),
		window:      def(opts.Window, DefaultWindow),
		minFailures: def(opts.MinFailures, DefaultMinFailures),
		minKeys:     def(opts.MinFailingKeys, DefaultMinFailingKeys),
		ratio:       def(opts.FailureRatio, DefaultFailureRatio),
		probeEvery:  def(opts.ProbeInterval, DefaultProbeInterval),
		maxProbe:    int32(def(opts.MaxProbeFailures, DefaultMaxProbeFailures)),
		beatEvery:   def(opts.HeartbeatInterval, DefaultHeartbeatInterval),
		fixedN:      opts.Instances,
		logEvery:    def(opts.LogEvery, DefaultLogEvery),
		clk:         opts.Clock,
		log:         opts.Logger,
		nodes:       xsync.NewMap[string, *node](),
		gates:       newGates(def(opts.MaxInFlightPerKey, DefaultMaxInFlightPerKey)),
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
	}
	c.workers = newWorkers(c.stop)
	if c.timeout > 0 {
		c.dls = newDeadlines(c.timeout)
		if grace := lateGrace(c.timeout, opts.LateGrace); grace > 0 {
			c.lateDls = newDeadlines(c.timeout + grace)
		}
	}
	c.starved = opts.starved
	if c.starved == nil {
		c.starved = newStarvation(max(c.timeout, 0) / 4).check
	}
	if c.clk == nil {
		c.clk = clock.NewSystem()
	}
	opts.Clock = c.clk
	if c.log == nil {
		c.log = slog.Default()
	}
	opts.LocalMaxKeys = def(opts.LocalMaxKeys, DefaultLocalMaxKeys)
	var err error
	if c.local, err = newLocal(&opts); err != nil {
		return nil, fmt.Errorf("guard: local store: %w", err)
	}
	c.sharded = find[Sharded](store)
	c.pinger = find[Pinger](store)
	c.membership = find[Membership](store)
	if cl, ok := store.(interface{ Close() error }); ok && opts.CloseStore {
		c.closer = cl
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	c.id = hex.EncodeToString(id[:])
	c.instances.Store(int64(max(1, opts.Instances)))
	for p := Local; p <= ReturnError; p++ {
		c.views[p] = &Guard{core: c, policy: p}
	}
	beat := make(chan struct{})
	go func() { // bounded: a dial may ignore ctx
		c.heartbeat(context.Background())
		close(beat)
	}()
	c.probeAll(context.Background())
	select {
	case <-beat:
	case <-time.After(c.probeTimeout()):
	}
	go c.run()
	return c.views[opts.Policy], nil
}

// lateGrace is Options.LateGrace for a timeout: 4 × timeout when zero,
// none when negative.
func lateGrace(timeout, grace time.Duration) time.Duration {
	switch {
	case timeout <= 0 || grace < 0:
		return 0
	case grace == 0:
		return 4 * timeout
	}
	return grace
}

// StoreTimeout returns the deadline a guard with these Options.Timeout and
// Options.LateGrace gives each store call: Timeout + LateGrace (with their
// defaults, 5 × 50ms). A store with a timeout of its own (redisstore's
// Options.Timeout) must not end its calls earlier, or a late reply is lost
// however long the guard waits for it. Zero when the guard has no
// deadline (a negative timeout).
func StoreTimeout(timeout, grace time.Duration) time.Duration {
	timeout = def(timeout, DefaultTimeout)
	if timeout < 0 {
		return 0
	}
	return timeout + lateGrace(timeout, grace)
}

func def[T int | time.Duration | float64](v, d T) T {
	if v == 0 {
		return d
	}
	return v
}

// WithPolicy returns a view of g that answers with policy p. Views share
// everything else (the store, circuits, local state, counters); they cost
// nothing to get, so a reloaded configuration can switch per call. An
// invalid p gives g itself.
func (g *Guard) WithPolicy(p Policy) *Guard {
	if !p.Valid() {
		return g
	}
	return g.views[p]
}

// Policy returns the view's failure policy.
func (g *Guard) Policy() Policy { return g.policy }

// Unwrap returns the wrapped store.
func (g *Guard) Unwrap() sluice.Store { return g.inner }

// find returns the first of store and the stores it wraps (each found
// through an Unwrap() sluice.Store method, such as lease.Store's) that
// implements T, so that a wrapper need not forward the optional
// interfaces Sharded, Pinger and Membership.
func find[T any](store sluice.Store) T {
	for range 8 { // a bound, in case a wrapper unwraps to itself
		if v, ok := store.(T); ok {
			return v
		}
		u, ok := store.(interface{ Unwrap() sluice.Store })
		if !ok {
			break
		}
		store = u.Unwrap()
	}
	var zero T
	return zero
}

// countKnown reports whether Local knows how many instances share the
// limits: Options.Instances, a store that cannot count (1), or a count
// read by two heartbeats (kept while the store is away). One is not
// enough: instances started together while the store was down renew
// within one interval of each other once it is up, and the first to
// read counts only itself.
func (c *core) countKnown() bool {
	return c.fixedN > 0 || c.membership == nil || c.beats.Load() >= 2
}

// Instances returns the number of instances Local divides limits by.
func (g *Guard) Instances() int {
	if g.fixedN > 0 {
		return g.fixedN
	}
	return int(g.instances.Load())
}

// Close stops the background probe, leaves the membership, closes the
// local state and, with Options.CloseStore, the store. Close one view
// only; the others share its state.
func (g *Guard) Close() error {
	var err error
	g.closeOnce.Do(func() {
		close(g.stop)
		<-g.done
		if g.membership != nil {
			ctx, cancel := context.WithTimeout(context.Background(), g.probeTimeout())
			_ = g.membership.Leave(ctx, g.id)
			cancel()
		}
		err = g.local.store.Close()
		if g.closer != nil {
			err = errors.Join(err, g.closer.Close())
		}
	})
	return err
}

// Apply implements sluice.Store.
func (g *Guard) Apply(ctx context.Context, op sluice.Op, req sluice.Request) (sluice.Decision, error) {
	reqs := [1]sluice.Request{req}
	ds, err := g.apply(ctx, op, reqs[:], true)
	if err != nil {
		return sluice.Decision{}, err
	}
	return ds[0], nil
}

// ApplyAll implements sluice.Store. On a Sharded store the keys of one
// call must live on one node (on Redis Cluster: share a hash tag).
func (g *Guard) ApplyAll(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	if len(reqs) == 0 {
		return g.inner.ApplyAll(ctx, op, reqs)
	}
	return g.apply(ctx, op, reqs, false)
}

func (g *Guard) apply(ctx context.Context, op sluice.Op, reqs []sluice.Request, one bool) ([]sluice.Decision, error) {
	for i := range reqs {
		if err := reqs[i].Validate(op); err != nil {
			return nil, fmt.Errorf("guard: %w", err)
		}
	}
	key := reqs[0].Key
	n := g.node(key)
	if n.state.Load() != closed {
		return g.degrade(ctx, op, reqs, n, ErrCircuitOpen)
	}
	cctx, sctx := ctx, ctx // the call's deadline, and its store call's
	if g.timeout > 0 {
		cctx = g.dls.bound(ctx) // deadline.go
		sctx = cctx
		if g.lateDls != nil && n.works() {
			// A late reply is waited for (bounded); decided now, so that
			// a worker that picks the call up late does not send one whose
			// caller was answered already.
			sctx = g.lateDls.bound(ctx)
		}
	}
	gt, ok := g.gates.acquire(ctx, cctx, key)
	if !ok {
		if err := callerGone(ctx); err != nil {
			return nil, fmt.Errorf("guard: %w", err)
		}
		g.busy.Add(1)
		return g.degrade(ctx, op, reqs, n, ErrBusy)
	}
	g.calls.Add(1)
	n.calls.Add(1)
	var ds []sluice.Decision
	var err error
	if g.timeout > 0 {
		ds, err = g.bounded(ctx, cctx, sctx, op, reqs, one)
	} else {
		ds, err = g.call(cctx, op, reqs, one)
	}
	g.gates.release(key, gt)
	if err == nil {
		n.record(g.core, g.clk.Now(), key, false)
		switch {
		case op == sluice.OpReset:
			for i := range reqs {
				g.local.forget(reqs[i].Key)
			}
		case g.policy == Local:
			now := g.clk.Now()
			for i := range ds {
				if !ds[i].Degraded {
					g.local.remember(&reqs[i], &ds[i], now)
				}
			}
		}
		return ds, nil
	}
	// The caller gave up: not the store's fault. So is a deadline the
	// call met when it ran on the caller's own (its deadline comes before
	// the guard's Timeout), which a store may report a moment before ctx
	// does (a socket's deadline, a context of its own).
	if gone := callerGone(ctx); gone != nil || (callerBound(ctx, cctx) && lateOnly(err)) {
		return nil, fmt.Errorf("guard: %w", cmp.Or(gone, context.DeadlineExceeded))
	}
	if callerError(err) {
		return nil, err
	}
	if cctx.Err() != nil {
		err = fmt.Errorf("%w after %s: %w", ErrDeadline, g.timeout, err)
	}
	g.errs.Add(1)
	n.errs.Add(1)
	g.failed(n, key, err)
	return g.degrade(ctx, op, reqs, n, err)
}

// callerGone returns why the caller's ctx ended, or nil while it has not:
// ctx.Err(), or context.DeadlineExceeded once its deadline has passed by
// the clock although its timer has not yet cancelled it. A store call
// bounded by the caller's deadline (a caller whose deadline comes before
// the guard's Timeout: the gateway's store.timeout in serve) fails with
// that deadline at about the moment ctx.Err() says so, and was taken, when
// a little before, for a late call on a flooded key and denied: a 429 for
// a Redis that had stopped (TestAdmissionStoreTimeout/guard, 1 run in 6).
func callerGone(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if at, ok := ctx.Deadline(); ok && !time.Now().Before(at) {
		return context.DeadlineExceeded
	}
	return nil
}

// callerBound reports whether a call's deadline, cctx's, is its caller's
// own: ctx has a deadline, no later than cctx's.
func callerBound(ctx, cctx context.Context) bool {
	at, ok := ctx.Deadline()
	if !ok {
		return false
	}
	cd, ok := cctx.Deadline()
	return !ok || !at.After(cd)
}

func (g *Guard) call(ctx context.Context, op sluice.Op, reqs []sluice.Request, one bool) ([]sluice.Decision, error) {
	if one {
		d, err := g.inner.Apply(ctx, op, reqs[0])
		if err != nil {
			return nil, err
		}
		reqsDs := [1]sluice.Decision{d}
		return reqsDs[:], nil
	}
	return g.inner.ApplyAll(ctx, op, reqs)
}

// bounded runs the call on a worker goroutine with context sctx and
// returns when cctx or the caller's ctx ends, whatever the call is doing:
// a client may be reconnecting, with a dial or handshake that ignores its
// context (rueidis redials when a call times out on a stalled server, and
// the calls behind it wait for that dial). When cctx ends first and sctx
// is later (its node worked, circuit closed and last probe answered, as
// the call started), it waits on for the reply until sctx ends
// (Options.LateGrace): the reply is late because this process is starved
// or the node slow, not away, and the store's answer is the key's exact
// one.
func (g *Guard) bounded(ctx, cctx, sctx context.Context, op sluice.Op, reqs []sluice.Request, one bool) ([]sluice.Decision, error) {
	j := g.workers.job() // workers.go
	j.g, j.ctx, j.op, j.one = g, sctx, op, one
	j.reqs = append(j.reqs[:0], reqs...) // the caller may reuse reqs after we return
	g.workers.run(j)
	select {
	case r := <-j.done:
		g.workers.done(j) // the worker is done with j: it may serve another call
		return r.ds, r.err
	case <-cctx.Done(): // j stays with its worker, which may still use it
		if sctx == cctx {
			return nil, cctx.Err()
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case r := <-j.done:
		g.workers.done(j)
		if r.err == nil {
			g.lateAnswers.Add(1)
		}
		return r.ds, r.err
	case <-sctx.Done():
		return nil, sctx.Err()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// callerError reports an error that the request caused, not the store.
func callerError(err error) bool {
	for _, e := range []error{sluice.ErrInvalidRequest, sluice.ErrInvalidLimit, sluice.ErrInvalidCost, sluice.ErrCostExceedsBurst, sluice.ErrUnknownAlgorithm} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// failed counts a failure against n, logs it (rate-limited) and opens the
// circuit when the store is failing across many keys.
func (c *core) failed(n *node, key string, err error) {
	now := c.clk.Now()
	if ok, suppressed := n.shouldLog(now, c.logEvery); ok {
		c.log.Warn("guard: store call failed", "node", n.name, "err", err, "not_logged_since_last", suppressed)
	}
	if lateOnly(err) && c.starved() {
		c.starvedLate.Add(1)
		return // this process was slow, maybe not the store: not counted
	}
	if n.record(c, now, key, true) && n.trip() {
		c.opens.Add(1)
		c.log.Warn("guard: store node failing across keys; circuit open, the failure policy answers", "node", n.name, "err", err)
	}
}

// lateOnly reports an error that says only that a call missed its
// deadline, not that the store refused it.
func lateOnly(err error) bool {
	return errors.Is(err, ErrDeadline) || errors.Is(err, context.DeadlineExceeded)
}

// degrade answers reqs by the policy after cause.
func (g *Guard) degrade(ctx context.Context, op sluice.Op, reqs []sluice.Request, n *node, cause error) ([]sluice.Decision, error) {
	if !errors.Is(cause, ErrUnavailable) {
		cause = fmt.Errorf("%w: %w", ErrUnavailable, cause)
	}
	if op == sluice.OpRefund || op == sluice.OpCharge || op == sluice.OpReset {
		if errors.Is(cause, ErrCircuitOpen) || errors.Is(cause, ErrBusy) {
			return nil, fmt.Errorf("guard: %s on node %q not sent: %w", op, n.name, cause)
		}
		// Sent, perhaps: Redis runs a command it received whether or not
		// its reply comes in time. Sending a refund or a charge again may
		// apply it twice (a reset is idempotent).
		return nil, fmt.Errorf("guard: %s on node %q failed and may have been applied: %w", op, n.name, cause)
	}
	g.degraded[g.policy].Add(uint64(len(reqs)))
	n.degraded.Add(uint64(len(reqs)))
	// A call whose key is hot (it waited past the deadline for its key's
	// slot, or for the store) while the node's circuit is closed is denied
	// under every policy: the key is flooded, the store is not away.
	// Admitting it (fail_open), or an error that a proxy may admit (error,
	// with Envoy's failure_mode_deny: false), let a client past its limit
	// by sending many requests at once. Only an open circuit says the node
	// is away here: a probe that failed during a flood may have been late
	// in a starved process.
	// (Local has its own rule, below.)
	hot := errors.Is(cause, ErrBusy) || lateOnly(cause)
	if hot && op == sluice.OpAllow && n.state.Load() == closed && g.policy != Local {
		return g.denied(reqs), nil
	}
	if g.policy == ReturnError {
		return nil, fmt.Errorf("guard: node %q: %w", n.name, cause)
	}
	// Under Local, any call that failed alone while its node works
	// (circuit closed, last probe answered) is denied: spending locally
	// would spend what the store is handing out to the other calls at the
	// same moment.
	works := n.works()
	// An instance that has not read the instance count yet (a fleet
	// started while its store was down) does not know its share: counting
	// itself alone, every instance handed out the whole limit (3 instances,
	// 3× the limit). It denies until the count is known, unless
	// Options.Instances gives it (TestColdStartWithinBound).
	if g.policy == Local && !(works && op == sluice.OpAllow) && g.countKnown() {
		ds, err := g.local.apply(context.WithoutCancel(ctx), op, reqs, g.Instances(), g.clk.Now(), n.name)
		if err == nil {
			for i := range ds {
				ds[i].Degraded, ds[i].Fallback = true, "local"
			}
			return ds, nil
		}
		// a cost beyond the local share of the burst: deny, as fail_closed
	}
	if g.policy == Local {
		return g.denied(reqs), nil
	}
	admit := g.policy == FailOpen
	ds := make([]sluice.Decision, len(reqs))
	for i := range reqs {
		d := sluice.Decision{Allowed: admit, Limit: reqs[i].Limit, Degraded: true, Fallback: g.policy.String()}
		if admit {
			d.Remaining = reqs[i].Capacity() - reqs[i].Cost
		} else {
			d.RetryAfter, d.ResetAfter = g.probeEvery, g.probeEvery
		}
		ds[i] = d
	}
	return ds, nil
}

// denied answers reqs with the policy's denial: retry after the probe
// interval.
func (g *Guard) denied(reqs []sluice.Request) []sluice.Decision {
	ds := make([]sluice.Decision, len(reqs))
	for i := range reqs {
		ds[i] = sluice.Decision{Limit: reqs[i].Limit, RetryAfter: g.probeEvery, ResetAfter: g.probeEvery, Degraded: true, Fallback: g.policy.String()}
	}
	return ds
}

// node returns the detector of the node that owns key.
func (c *core) node(key string) *node {
	name := ""
	if c.sharded != nil {
		name = c.sharded.NodeOf(key)
	}
	if n, ok := c.nodes.Load(name); ok {
		return n
	}
	n, _ := c.nodes.LoadOrCompute(name, c.newNode(name))
	return n
}

// newNode returns the constructor of node name's detector. A node that
// appears while Local is owed charges (a replica promoted after its
// master failed, whose keys Local answered meanwhile) starts with its
// circuit open: the probe charges it what Local admitted for its keys
// before it answers them (settle takes the debts of nodes that are gone
// for the node that owns their keys now). Closed, it answered them at
// once from the replica's state, and the debts, owed to a node no longer
// listed, were never charged.
func (c *core) newNode(name string) func() (*node, bool) {
	return func() (*node, bool) {
		n := &node{name: name}
		if c.local.pending() {
			n.state.Store(open)
		}
		return n, false
	}
}
