// Package fairqueue holds requests that a limit denies instead of refusing
// them, and admits them when capacity frees: by priority class, with
// reserved shares of a shared capacity, and by weighted fair queueing on
// recent usage within a class. It is the gateway's scheduler
// (docs/QUEUEING.md); it knows sluice stores but nothing of HTTP.
//
// # Design
//
// Every admission, queued or not, is one store ApplyAll that charges the
// item's own limits (its key's and tier's, given by the caller) together
// with one "option" of its model's shared capacity, all or nothing. The
// shared capacity is never a counter of this process: it lives in the
// store, so gateway instances sharing a store can never admit past it
// together.
//
// A model's capacity (say 1800 rpm) is split into buckets: one per class
// with a share (interactive 70 % gets its own 1260 rpm bucket, batch 30 %
// one of 540 rpm) and a common pool with the unreserved rest. A class
// first tries its own bucket, then the pool, then borrows from the other
// classes' buckets. A borrower charges the owner's bucket under the same
// rate but a burst smaller by a headroom (half the burst): GCRA keeps only
// the bucket's theoretical arrival time, so the borrower is admitted only
// while the bucket holds more than the headroom, that is while its owner
// has left it to fill up (is idle). A busy owner keeps its bucket below the
// headroom, and gets its whole share; an idle one lends all of it. The
// buckets' rates sum to the capacity's rate and their bursts to its burst,
// so the total stays within the capacity by construction.
//
// Within one process a single dispatcher decides who tries next: classes in
// priority order, and within a class the key whose recent usage (requests
// or tokens, decayed with a half-life) divided by its weight is smallest,
// oldest request first. A denial tells the dispatcher until when the key or
// the bucket is exhausted (the decision's RetryAfter; concurrency has none,
// and is retried at a poll interval or when a local request settles), so it
// sleeps until then instead of spinning on the store.
package fairqueue

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
)

// Errors of Options and Submit. They work with errors.Is.
var (
	// ErrInvalidOptions means New was given options it cannot use.
	ErrInvalidOptions = errors.New("fairqueue: invalid options")
	// ErrInvalidItem means an item names an unknown class or capacity, or
	// carries a negative cost or weight.
	ErrInvalidItem = errors.New("fairqueue: invalid item")
)

// Kind is what a capacity limit counts.
type Kind uint8

// The kinds of capacity limits.
const (
	// Requests limits count one per request.
	Requests Kind = iota + 1
	// Tokens limits count the item's Tokens.
	Tokens
	// Concurrency limits hold a lease named by the item's Lease until the
	// caller refunds it.
	Concurrency
)

// Limit is one limit of a shared capacity.
type Limit struct {
	// Name labels the limit in store keys and messages, such as "rpm".
	Name string
	// Kind is what the limit counts.
	Kind Kind
	// Algorithm must be sluice.GCRA for Requests and Tokens, and
	// sluice.Concurrency for Concurrency.
	Algorithm sluice.Algorithm
	// Limit is the whole capacity, before it is split among classes.
	Limit sluice.Limit
}

// Class is a priority class.
type Class struct {
	// Name identifies the class in items, store keys and metrics.
	Name string
	// Priority orders classes: higher goes first for the common pool.
	Priority int
	// Share is the percentage (0 to 100) of every capacity reserved for
	// the class; others borrow it while the class leaves it idle.
	Share int
}

// Options configure a Queue.
type Options struct {
	// Store keeps the limits; required. Share it among instances.
	Store sluice.Store
	// Clock supplies the time of deadlines, usage decay and retries; nil
	// means the system clock. The store keeps its own time for limits.
	Clock clock.Clock
	// Classes are the priority classes; none means one class "default"
	// without a reserved share. Shares must sum to at most 100.
	Classes []Class
	// Capacities are the shared capacities by name (the gateway: by
	// model); an item names at most one.
	Capacities map[string][]Limit
	// KeyPrefix starts the store keys of the capacities' buckets, such as
	// "{gwq}:"; required when Capacities is not empty.
	KeyPrefix string
	// MaxWait bounds how long an item waits; zero disables queueing, so
	// that a denied item is denied at once.
	MaxWait time.Duration
	// MaxPerKey, MaxPerGroup and MaxTotal bound the waiting items of one
	// key, of one group (the gateway: tier) and of the queue. Zero means
	// 16, 256 and 4096.
	MaxPerKey, MaxPerGroup, MaxTotal int
	// MaxBytes bounds the Bytes of all waiting items together (the
	// gateway: their request bodies); zero means 256 MiB.
	MaxBytes int64
	// HalfLife is how fast recent usage is forgotten; zero means 10s.
	HalfLife time.Duration
	// Poll is how often a limit without a retry time (concurrency) is
	// tried again when nothing kicks the queue; zero means 50ms.
	Poll time.Duration
	// Jitter, when positive, delays each retry of the dispatcher by a
	// random fraction of it, so that the instances sharing a store take
	// turns at a freed slot rather than the fastest always winning it.
	Jitter time.Duration
	// StoreTimeout bounds one store call; zero means 1s.
	StoreTimeout time.Duration
	// Seed seeds the jitter's random source.
	Seed uint64
}

// Item is one request to admit.
type Item struct {
	// Key is whose fair share the item is counted in (the gateway: the
	// client id). Never a raw API key.
	Key string
	// Group bounds waiting items together (the gateway: the tier).
	Group string
	// Class names the item's class; "" is the first class of Options
	// (or "default").
	Class string
	// Weight scales the key's fair share; zero means 1.
	Weight float64
	// Capacity names the shared capacity charged with the item; "" for
	// none (only Reqs are charged).
	Capacity string
	// Tokens is the cost on Tokens limits of the capacity.
	Tokens int64
	// Usage is what the admission adds to the key's recent usage: 1 to be
	// fair in requests, the tokens to be fair in tokens; zero means 1.
	Usage float64
	// Bytes is the memory the item holds while it waits (the gateway: its
	// request body), bounded together by Options.MaxBytes.
	Bytes int64
	// Lease names the item's hold on Concurrency limits.
	Lease string
	// Reqs are the item's own limits, charged with the capacity in one
	// ApplyAll.
	Reqs []sluice.Request
	// Try, when not nil, admits the item instead of Reqs and Capacity
	// (leave those empty): it reports whether it admitted the item, else
	// when it may (zero: never), or an error (the Failed outcome). It is
	// called by one goroutine at a time per item; what it admitted the
	// caller gives back itself when the outcome is not Admitted. Items
	// with the same Gate wait together: a denial closes the gate until
	// then, and they are tried, in class and fair order, once it opens.
	Try  func(ctx context.Context) (admitted bool, retry time.Duration, err error)
	Gate *Gate
}

// Gate is what items with a Try wait on together (the gateway: the
// upstreams of one route): closed until a time a denial reported.
type Gate struct{ until atomic.Int64 }

// Outcome is how an item left the queue.
type Outcome uint8

// The outcomes of an item.
const (
	// Pending: the item still waits.
	Pending Outcome = iota
	// Admitted: charged, at once or after a wait.
	Admitted
	// Denied: a limit denied it and waiting could not help (queueing is
	// off, or its limits free up only after MaxWait).
	Denied
	// Full: a bound on waiting items (key, group or total) was reached.
	Full
	// Timeout: MaxWait passed before capacity freed.
	Timeout
	// Canceled: the caller gave up (its client went away).
	Canceled
	// Failed: the store failed; Result.Err says how.
	Failed
)

var outcomeNames = [...]string{"pending", "admitted", "denied", "full", "timeout", "canceled", "failed"}

// String returns the outcome's name, such as "timeout", as metrics label it.
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", o)
}

// Result is what became of an item.
type Result struct {
	Outcome Outcome
	// Queued reports that the item waited in the queue; Waited is how
	// long, by the queue's clock.
	Queued bool
	Waited time.Duration
	// At is the queue's clock time of the admission, when the item's
	// Usage was added to its key's recent usage (see AddUsage).
	At int64
	// Decisions are the decisions for the item's Reqs at its last try
	// (nil if it was never tried).
	Decisions []sluice.Decision
	// Pool are the capacity requests charged with an admitted item (to be
	// settled by the caller like Reqs: refunds, charges, lease release),
	// and PoolKinds their kinds. For a denied item, the requests of the
	// last option tried, and PoolDecisions their decisions.
	Pool          []sluice.Request
	PoolKinds     []Kind
	PoolDecisions []sluice.Decision
	// Err is the store's error for Failed.
	Err error
}

// PoolDenied reports whether the shared capacity, rather than the item's
// own limits, denied the item's last try.
func (r *Result) PoolDenied() bool {
	for _, d := range r.PoolDecisions {
		if !d.Allowed {
			return true
		}
	}
	return false
}

// Waiter is an item in the queue.
type Waiter struct {
	item     Item
	class    *class
	capacity *capacity
	opts     []*option // the options of its class on its capacity, in order
	enqueued int64
	deadline int64
	done     chan struct{}
	state    atomic.Uint32 // waiting, inflight, finished
	canceled atomic.Bool
	res      Result
}

// closed is the Done channel of items that never waited.
var closed = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

const (
	stWaiting uint32 = iota
	stInflight
	stFinished
)

// Done is closed when the item left the queue.
func (w *Waiter) Done() <-chan struct{} { return w.done }

// Result is the item's result; valid after Done is closed.
func (w *Waiter) Result() Result { return w.res }

// option is one way to charge a class on a capacity: its own bucket, the
// pool, or a borrowed bucket.
type option struct {
	name  string // own, pool, borrow:<class>
	reqs  []sluice.Request
	kinds []Kind
	caps  []int64 // capacity of each request, for tokens
	// emptyT is the clock time until which the option was found
	// exhausted. Options that charge the same buckets with the same
	// limits (the pool, for every class) share it, so that when the
	// buckets refill, every class sees it at once and priority decides.
	emptyT *atomic.Int64
}

// exhaustedUntil records that the option denies until t.
func (o *option) exhaustedUntil(t int64) {
	for {
		old := o.emptyT.Load()
		if t <= old || o.emptyT.CompareAndSwap(old, t) {
			return
		}
	}
}

type capacity struct {
	name    string
	options map[string][]*option // by class name
}

type class struct {
	name     string
	priority int
	share    int
	keys     map[string]*keyQueue // keys with waiting items
	depth    atomic.Int64
}

type keyQueue struct {
	key     string
	waiting []*Waiter
	blocked int64 // clock time until which the key's own limits deny
}

type usage struct {
	v  float64
	at int64
}

// Queue is the scheduler. It is safe for concurrent use; Run (or calls of
// Dispatch) drives it.
type Queue struct {
	o       Options
	clk     clock.Clock
	classes []*class // by priority, highest first
	byName  map[string]*class
	caps    map[string]*capacity
	kick    chan struct{}

	mu       sync.Mutex
	usage    map[string]*usage
	perKey   map[string]int
	perGroup map[string]int
	perCap   map[*capacity]int
	perGate  map[*Gate]int
	bytes    int64 // Bytes of the waiting items
	// split is set once the store refused a batch across hash slots:
	// own limits and capacity are then charged in two calls (apply).
	split  atomic.Bool
	total  int
	closed bool // Run has returned: nothing may wait
	rng    *rand.Rand
}

// New validates opts and returns a Queue.
func New(opts Options) (*Queue, error) {
	if opts.Store == nil {
		return nil, fmt.Errorf("%w: Store is required", ErrInvalidOptions)
	}
	if opts.Clock == nil {
		opts.Clock = clock.NewSystem()
	}
	if opts.MaxWait < 0 {
		return nil, fmt.Errorf("%w: MaxWait %s is negative", ErrInvalidOptions, opts.MaxWait)
	}
	setDefault := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	setDefault(&opts.MaxPerKey, 16)
	setDefault(&opts.MaxPerGroup, 256)
	setDefault(&opts.MaxTotal, 4096)
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = 256 << 20
	}
	if opts.HalfLife <= 0 {
		opts.HalfLife = 10 * time.Second
	}
	if opts.Poll <= 0 {
		opts.Poll = 50 * time.Millisecond
	}
	if opts.StoreTimeout <= 0 {
		opts.StoreTimeout = time.Second
	}
	if len(opts.Classes) == 0 {
		opts.Classes = []Class{{Name: "default"}}
	}
	q := &Queue{
		o: opts, clk: opts.Clock, byName: map[string]*class{}, caps: map[string]*capacity{},
		kick: make(chan struct{}, 1), usage: map[string]*usage{}, perKey: map[string]int{}, perGroup: map[string]int{}, perCap: map[*capacity]int{}, perGate: map[*Gate]int{},
		rng: rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15)),
	}
	sum := 0
	for _, c := range opts.Classes {
		if c.Name == "" || q.byName[c.Name] != nil {
			return nil, fmt.Errorf("%w: class name %q empty or repeated", ErrInvalidOptions, c.Name)
		}
		if c.Share < 0 || c.Share > 100 {
			return nil, fmt.Errorf("%w: class %s: share %d must be 0 to 100", ErrInvalidOptions, c.Name, c.Share)
		}
		sum += c.Share
		cl := &class{name: c.Name, priority: c.Priority, share: c.Share, keys: map[string]*keyQueue{}}
		q.byName[c.Name] = cl
		q.classes = append(q.classes, cl)
	}
	if sum > 100 {
		return nil, fmt.Errorf("%w: class shares sum to %d%%, over 100%%", ErrInvalidOptions, sum)
	}
	slices.SortStableFunc(q.classes, func(a, b *class) int { return b.priority - a.priority })
	if len(opts.Capacities) > 0 && opts.KeyPrefix == "" {
		return nil, fmt.Errorf("%w: KeyPrefix is required with Capacities", ErrInvalidOptions)
	}
	for name, limits := range opts.Capacities {
		c, err := q.newCapacity(name, limits)
		if err != nil {
			return nil, err
		}
		q.caps[name] = c
	}
	return q, nil
}

// split is one limit cut into class buckets and the pool.
type split struct {
	own  map[string]sluice.Limit // by class with a share
	pool sluice.Limit            // Rate 0 when nothing is left
}

func splitLimit(l Limit, classes []*class) split {
	s := split{own: map[string]sluice.Limit{}}
	full := l.Limit
	burst := full.Capacity()
	var usedRate, usedBurst int64
	for _, c := range classes {
		if c.share == 0 {
			continue
		}
		r := full.Rate * int64(c.share) / 100
		b := burst * int64(c.share) / 100
		if r < 1 || b < 1 {
			continue // too small to split: the class uses the pool
		}
		s.own[c.name] = sluice.Limit{Rate: r, Period: full.Period, Burst: b}
		usedRate += r
		usedBurst += b
	}
	if r, b := full.Rate-usedRate, burst-usedBurst; r >= 1 && b >= 1 {
		s.pool = sluice.Limit{Rate: r, Period: full.Period, Burst: b}
	}
	return s
}

func (q *Queue) newCapacity(name string, limits []Limit) (*capacity, error) {
	if len(limits) == 0 {
		return nil, fmt.Errorf("%w: capacity %s has no limits", ErrInvalidOptions, name)
	}
	for _, l := range limits {
		if err := l.Limit.Validate(); err != nil {
			return nil, fmt.Errorf("%w: capacity %s: %s: %w", ErrInvalidOptions, name, l.Name, err)
		}
		want := sluice.GCRA
		if l.Kind == Concurrency {
			want = sluice.Concurrency
		}
		if l.Algorithm != want || l.Kind < Requests || l.Kind > Concurrency {
			return nil, fmt.Errorf("%w: capacity %s: %s: kind and algorithm do not match", ErrInvalidOptions, name, l.Name)
		}
	}
	splits := make([]split, len(limits))
	for i, l := range limits {
		splits[i] = splitLimit(l, q.classes)
	}
	c := &capacity{name: name, options: map[string][]*option{}}
	shared := map[string]*atomic.Int64{} // by the option's keys and limits
	base := q.o.KeyPrefix + name + ":"
	build := func(label, keyPart string, limitOf func(i int) (sluice.Limit, bool)) *option {
		o := &option{name: label}
		for i, l := range limits {
			lim, ok := limitOf(i)
			if !ok {
				return nil
			}
			o.reqs = append(o.reqs, sluice.Request{Key: base + keyPart + l.Name, Algorithm: l.Algorithm, Limit: lim, Cost: 1})
			o.kinds = append(o.kinds, l.Kind)
			capa := lim.Capacity()
			if l.Kind == Concurrency {
				capa = lim.Rate
			}
			o.caps = append(o.caps, capa)
		}
		sig := fmt.Sprint(o.reqs)
		if shared[sig] == nil {
			shared[sig] = new(atomic.Int64)
		}
		o.emptyT = shared[sig]
		return o
	}
	for _, cl := range q.classes {
		var opts []*option
		own := build("own", "c:"+cl.name+":", func(i int) (sluice.Limit, bool) {
			l, ok := splits[i].own[cl.name]
			return l, ok
		})
		if own != nil {
			opts = append(opts, own)
		}
		if pool := build("pool", "pool:", func(i int) (sluice.Limit, bool) {
			return splits[i].pool, splits[i].pool.Rate > 0
		}); pool != nil {
			opts = append(opts, pool)
		}
		// Borrow from the lowest classes first: a higher class's
		// reservation is the last to be lent.
		for j := len(q.classes) - 1; j >= 0; j-- {
			other := q.classes[j]
			if other == cl {
				continue
			}
			b := build("borrow:"+other.name, "c:"+other.name+":", func(i int) (sluice.Limit, bool) {
				l, ok := splits[i].own[other.name]
				if !ok {
					return l, false
				}
				if limits[i].Kind == Concurrency {
					h := max(1, l.Rate/2)
					l.Rate -= h
					return l, l.Rate >= 1
				}
				capa := l.Capacity()
				h := max(1, capa/2)
				l.Burst = capa - h
				return l, l.Burst >= 1
			})
			if b != nil {
				opts = append(opts, b)
			}
		}
		c.options[cl.name] = opts
	}
	return c, nil
}
