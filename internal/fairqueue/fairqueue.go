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
	"math"
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
	// Lease names the item's hold on Concurrency limits.
	Lease string
	// Reqs are the item's own limits, charged with the capacity in one
	// ApplyAll.
	Reqs []sluice.Request
}

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
	name   string // own, pool, borrow:<class>
	reqs   []sluice.Request
	kinds  []Kind
	caps   []int64      // capacity of each request, for tokens
	emptyT atomic.Int64 // clock time until which the option was found exhausted
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
	total    int
	rng      *rand.Rand
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
		kick: make(chan struct{}, 1), usage: map[string]*usage{}, perKey: map[string]int{}, perGroup: map[string]int{},
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

// Depth is the number of items of class waiting now.
func (q *Queue) Depth(class string) int64 {
	if c := q.byName[class]; c != nil {
		return c.depth.Load()
	}
	return 0
}

// Classes returns the class names, highest priority first.
func (q *Queue) Classes() []string {
	out := make([]string, len(q.classes))
	for i, c := range q.classes {
		out[i] = c.name
	}
	return out
}

// Kick makes the dispatcher try again now: capacity may have freed (a
// local request settled and released its concurrency lease).
func (q *Queue) Kick() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// Admit admits it at once, or waits in the queue until it is admitted,
// MaxWait passes or ctx is done. An admitted item whose caller gives up at
// the same moment is refunded, so that it holds no capacity.
func (q *Queue) Admit(ctx context.Context, it *Item) (Result, error) {
	w, err := q.Submit(ctx, it)
	if err != nil {
		return Result{}, err
	}
	select {
	case <-w.Done():
		return w.Result(), nil
	case <-ctx.Done():
	}
	canceled := q.Cancel(w)
	<-w.Done() // an item being tried is finished by the dispatcher
	res := w.Result()
	if !canceled && res.Outcome == Admitted {
		// Admitted meanwhile: give it back, since nobody will use it.
		q.refund(&res, it)
		res.Outcome = Canceled
	}
	return res, nil
}

// Cancel takes w out of the queue. It reports false when w had already
// left it (admitted or otherwise); an item being tried at that moment is
// refunded by the dispatcher if the try admitted it.
func (q *Queue) Cancel(w *Waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch w.state.Load() {
	case stFinished:
		return false
	case stInflight:
		w.canceled.Store(true)
		return true
	}
	q.finishLocked(w, Canceled, q.clk.Now())
	return true
}

func (q *Queue) refund(res *Result, it *Item) {
	reqs := make([]sluice.Request, 0, len(it.Reqs)+len(res.Pool))
	reqs = append(append(reqs, it.Reqs...), res.Pool...)
	ctx, cancel := context.WithTimeout(context.Background(), q.o.StoreTimeout)
	defer cancel()
	// An error leaves tokens charged that refill at their rate, and a
	// concurrency lease that lapses: nothing leaks for good.
	_, _ = q.o.Store.ApplyAll(ctx, sluice.OpRefund, reqs)
}

// Submit admits it at once when nothing waits ahead of it (for its key or
// its capacity) and its limits allow it; otherwise it queues it, if
// waiting can help and the bounds allow it. The returned Waiter is done
// already unless the item waits. The error is for a bad item only: store
// failures are the Failed outcome.
func (q *Queue) Submit(ctx context.Context, it *Item) (*Waiter, error) {
	w, err := q.newWaiter(it)
	if err != nil {
		return nil, err
	}
	q.mu.Lock()
	ahead := q.aheadLocked(w)
	q.mu.Unlock()
	if !ahead {
		// The fast path: one ApplyAll per option, no queue.
		blockedFor, hopeless := q.try(ctx, w)
		if w.res.Outcome == Admitted || w.res.Outcome == Failed {
			q.noteUsage(w)
			close(w.done)
			w.state.Store(stFinished)
			return w, nil
		}
		if hopeless || q.o.MaxWait == 0 || blockedFor > q.o.MaxWait {
			w.res.Outcome = Denied
			w.state.Store(stFinished)
			close(w.done)
			return w, nil
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.o.MaxWait == 0 {
		// Something waits ahead, yet queueing is off: impossible, as
		// nothing ever waits; kept for safety.
		w.res.Outcome = Denied
		w.state.Store(stFinished)
		close(w.done)
		return w, nil
	}
	if q.perKey[it.Key] >= q.o.MaxPerKey || q.perGroup[it.Group] >= q.o.MaxPerGroup || q.total >= q.o.MaxTotal {
		w.res.Outcome = Full
		w.state.Store(stFinished)
		close(w.done)
		return w, nil
	}
	now := q.clk.Now()
	w.enqueued, w.deadline = now, now+int64(q.o.MaxWait)
	w.res.Queued = true
	kq := w.class.keys[it.Key]
	if kq == nil {
		kq = &keyQueue{key: it.Key}
		w.class.keys[it.Key] = kq
	}
	kq.waiting = append(kq.waiting, w)
	q.perKey[it.Key]++
	q.perGroup[it.Group]++
	q.total++
	w.class.depth.Add(1)
	q.Kick()
	return w, nil
}

func (q *Queue) newWaiter(it *Item) (*Waiter, error) {
	cl := q.classes[0]
	if it.Class != "" {
		cl = q.byName[it.Class]
		if cl == nil {
			return nil, fmt.Errorf("%w: unknown class %q", ErrInvalidItem, it.Class)
		}
	} else if len(q.o.Classes) > 0 {
		cl = q.byName[q.o.Classes[0].Name]
	}
	if it.Weight < 0 || math.IsNaN(it.Weight) || math.IsInf(it.Weight, 0) || it.Tokens < 0 || it.Usage < 0 || math.IsNaN(it.Usage) || math.IsInf(it.Usage, 0) {
		return nil, fmt.Errorf("%w: negative or non-finite weight, tokens or usage", ErrInvalidItem)
	}
	w := &Waiter{item: *it, class: cl, done: make(chan struct{})}
	if it.Capacity != "" {
		w.capacity = q.caps[it.Capacity]
		if w.capacity == nil {
			return nil, fmt.Errorf("%w: unknown capacity %q", ErrInvalidItem, it.Capacity)
		}
		w.opts = w.capacity.options[cl.name]
	}
	return w, nil
}

// aheadLocked reports whether anything waits ahead of w: an item of its
// key, or of its capacity.
func (q *Queue) aheadLocked(w *Waiter) bool {
	if q.total == 0 {
		return false
	}
	if q.perKey[w.item.Key] > 0 {
		return true
	}
	if w.capacity == nil {
		return false
	}
	for _, c := range q.classes {
		for _, kq := range c.keys {
			if len(kq.waiting) > 0 && kq.waiting[0].capacity == w.capacity {
				return true
			}
		}
	}
	return false
}

// try runs w's options in order, one ApplyAll each, until one admits it.
// It sets w.res, and returns how long the item's own limits deny it (0
// when they allow, or deny without a retry time) and whether no wait can
// help (a cost beyond every option's burst).
func (q *Queue) try(ctx context.Context, w *Waiter) (blockedFor time.Duration, hopeless bool) {
	it := &w.item
	opts := w.opts
	if w.capacity == nil {
		opts = []*option{nil}
	}
	now := q.clk.Now()
	fitsAny := false
	for _, o := range opts {
		reqs := make([]sluice.Request, 0, len(it.Reqs)+4)
		reqs = append(reqs, it.Reqs...)
		var pool []sluice.Request
		var kinds []Kind
		if o != nil {
			fits := true
			for i, r := range o.reqs {
				switch o.kinds[i] {
				case Tokens:
					r.Cost = max(it.Tokens, 1)
				case Concurrency:
					r.Lease = it.Lease
				}
				if r.Cost > o.caps[i] {
					fits = false
				}
				pool = append(pool, r)
			}
			if !fits {
				continue
			}
			fitsAny = true
			if o.emptyT.Load() > now {
				continue
			}
			kinds = o.kinds
			reqs = append(reqs, pool...)
		}
		fitsAny = true
		cctx, cancel := context.WithTimeout(ctx, q.o.StoreTimeout)
		ds, err := q.o.Store.ApplyAll(cctx, sluice.OpAllow, reqs)
		cancel()
		if err != nil {
			w.res.Outcome, w.res.Err = Failed, fmt.Errorf("fairqueue: admit: %w", err)
			return 0, false
		}
		n := len(it.Reqs)
		w.res.Decisions, w.res.Pool, w.res.PoolKinds, w.res.PoolDecisions = ds[:n:n], pool, kinds, ds[n:]
		if sluice.Combine(ds).Allowed {
			w.res.Outcome = Admitted
			return 0, false
		}
		own, ownDenied := q.retryAfter(reqs[:n], ds[:n])
		if o != nil {
			if wait, denied := q.retryAfter(reqs[n:], ds[n:]); denied {
				o.exhaustedUntil(now + int64(wait))
			}
		}
		if ownDenied {
			// No option can help while the key's own limits deny.
			return own, false
		}
	}
	return 0, !fitsAny
}

// retryAfter is how long the denied requests among reqs deny: the longest
// RetryAfter, except that a concurrency slot may free at any moment (a
// holder settles), so it is polled.
func (q *Queue) retryAfter(reqs []sluice.Request, ds []sluice.Decision) (wait time.Duration, denied bool) {
	for i, d := range ds {
		if d.Allowed {
			continue
		}
		denied = true
		ra := d.RetryAfter
		if reqs[i].Algorithm == sluice.Concurrency || ra <= 0 {
			ra = q.o.Poll
		}
		wait = max(wait, ra)
	}
	return wait, denied
}

func (q *Queue) decayed(u *usage, now int64) float64 {
	if u == nil {
		return 0
	}
	return u.v * math.Exp2(-float64(now-u.at)/float64(q.o.HalfLife))
}

func (q *Queue) noteUsage(w *Waiter) {
	if w.res.Outcome != Admitted {
		return
	}
	add := w.item.Usage
	if add == 0 {
		add = 1
	}
	now := q.clk.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	u := q.usage[w.item.Key]
	if u == nil {
		if len(q.usage) >= 4*q.o.MaxTotal {
			q.sweepUsageLocked(now)
		}
		u = &usage{}
		q.usage[w.item.Key] = u
	}
	u.v, u.at = q.decayed(u, now)+add, now
}

// sweepUsageLocked forgets the usage of keys that have none left worth
// counting, so that the map stays bounded by the keys recently active.
func (q *Queue) sweepUsageLocked(now int64) {
	for k, u := range q.usage {
		if q.decayed(u, now) < 0.01 && q.perKey[k] == 0 {
			delete(q.usage, k)
		}
	}
}

// finishLocked takes w out of its key queue with outcome o.
func (q *Queue) finishLocked(w *Waiter, o Outcome, now int64) {
	kq := w.class.keys[w.item.Key]
	if kq != nil {
		if i := slices.Index(kq.waiting, w); i >= 0 {
			kq.waiting = slices.Delete(kq.waiting, i, i+1)
			q.perKey[w.item.Key]--
			if q.perKey[w.item.Key] == 0 {
				delete(q.perKey, w.item.Key)
			}
			q.perGroup[w.item.Group]--
			if q.perGroup[w.item.Group] == 0 {
				delete(q.perGroup, w.item.Group)
			}
			q.total--
			w.class.depth.Add(-1)
		}
		if len(kq.waiting) == 0 {
			delete(w.class.keys, w.item.Key)
		}
	}
	if o != Pending {
		w.res.Outcome = o
	}
	w.res.Waited = time.Duration(now - w.enqueued)
	w.state.Store(stFinished)
	close(w.done)
}

// maxTriesPerDispatch bounds the store calls of one Dispatch, so that a
// long queue cannot hold the dispatcher (and Run's wake-ups) for long.
const maxTriesPerDispatch = 64

// Dispatch admits the waiting items that capacity allows now, in order,
// and expires those past their deadline. It returns the clock time at
// which it should run again (0 when nothing waits). Run calls it; tests
// with a fake clock call it directly after moving the clock.
func (q *Queue) Dispatch(ctx context.Context) int64 {
	for tries := 0; tries < maxTriesPerDispatch; tries++ {
		q.mu.Lock()
		now := q.clk.Now()
		q.expireLocked(now)
		w := q.pickLocked(now)
		if w == nil {
			next := q.nextLocked(now)
			q.mu.Unlock()
			return next
		}
		w.state.Store(stInflight)
		q.mu.Unlock()

		blockedFor, hopeless := q.try(ctx, w)

		q.mu.Lock()
		now = q.clk.Now()
		switch {
		case w.canceled.Load():
			if w.res.Outcome == Admitted {
				res := w.res
				q.mu.Unlock()
				q.refund(&res, &w.item)
				q.mu.Lock()
			}
			q.finishLocked(w, Canceled, now)
		case w.res.Outcome == Admitted || w.res.Outcome == Failed:
			q.finishLocked(w, Pending, now)
			if w.res.Outcome == Admitted {
				q.mu.Unlock()
				q.noteUsage(w)
				q.mu.Lock()
			}
		case hopeless:
			q.finishLocked(w, Denied, now)
		default:
			w.state.Store(stWaiting)
			kq := w.class.keys[w.item.Key]
			if blockedFor > 0 || (len(w.res.Decisions) > 0 && !sluice.Combine(w.res.Decisions).Allowed) {
				if blockedFor == 0 {
					blockedFor = q.o.Poll
				}
				kq.blocked = now + int64(blockedFor)
				if kq.blocked > w.deadline {
					// Its own limits free up only after its deadline.
					q.finishLocked(w, Timeout, now)
				}
			}
		}
		q.mu.Unlock()
	}
	return q.clk.Now()
}

func (q *Queue) expireLocked(now int64) {
	for _, c := range q.classes {
		for _, kq := range c.keys {
			for len(kq.waiting) > 0 && kq.waiting[0].deadline <= now && kq.waiting[0].state.Load() == stWaiting {
				q.finishLocked(kq.waiting[0], Timeout, now)
				if c.keys[kq.key] == nil {
					break
				}
			}
		}
	}
}

// ready reports whether w's head item could be tried now: its key is not
// blocked and some option is not known to be exhausted.
func (q *Queue) ready(kq *keyQueue, now int64) bool {
	if kq.blocked > now || len(kq.waiting) == 0 {
		return false
	}
	w := kq.waiting[0]
	if w.state.Load() != stWaiting {
		return false
	}
	if w.capacity == nil {
		return true
	}
	for _, o := range w.opts {
		if o.emptyT.Load() <= now {
			return true
		}
	}
	return false
}

// pickLocked returns the next item to try: the highest class with a ready
// key, and in it the key with the least recent usage per weight (ties: the
// oldest head item).
func (q *Queue) pickLocked(now int64) *Waiter {
	for _, c := range q.classes {
		var best *keyQueue
		var bestScore float64
		for _, kq := range c.keys {
			if !q.ready(kq, now) {
				continue
			}
			wt := kq.waiting[0].item.Weight
			if wt == 0 {
				wt = 1
			}
			score := q.decayed(q.usage[kq.key], now) / wt
			if best == nil || score < bestScore || (score == bestScore && kq.waiting[0].enqueued < best.waiting[0].enqueued) ||
				(score == bestScore && kq.waiting[0].enqueued == best.waiting[0].enqueued && kq.key < best.key) {
				best, bestScore = kq, score
			}
		}
		if best != nil {
			return best.waiting[0]
		}
	}
	return nil
}

// nextLocked is when the dispatcher should look again: the earliest
// deadline, key unblocking or option refill among waiting heads, plus
// jitter.
func (q *Queue) nextLocked(now int64) int64 {
	next := int64(0)
	at := func(t int64) {
		if t > now && (next == 0 || t < next) {
			next = t
		}
	}
	for _, c := range q.classes {
		for _, kq := range c.keys {
			for _, w := range kq.waiting {
				at(w.deadline)
			}
			if len(kq.waiting) == 0 {
				continue
			}
			if kq.blocked > now {
				at(kq.blocked)
				continue
			}
			soonest := int64(0)
			for _, o := range kq.waiting[0].opts {
				if t := o.emptyT.Load(); soonest == 0 || t < soonest {
					soonest = t
				}
			}
			at(soonest)
		}
	}
	if next != 0 && q.o.Jitter > 0 {
		next += q.rng.Int64N(int64(q.o.Jitter))
	}
	return next
}

// Run dispatches until ctx is done, sleeping until the next retry time or
// a Kick.
func (q *Queue) Run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for ctx.Err() == nil {
		next := q.Dispatch(ctx)
		wait := time.Hour
		if next != 0 {
			wait = time.Duration(next - q.clk.Now())
		}
		if wait <= 0 {
			continue
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			q.drain()
			return
		case <-q.kick:
		case <-timer.C:
		}
	}
	q.drain()
}

// drain finishes every waiting item as canceled: the queue is closing.
func (q *Queue) drain() {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.clk.Now()
	for _, c := range q.classes {
		for _, kq := range c.keys {
			for _, w := range slices.Clone(kq.waiting) {
				if w.state.Load() == stWaiting {
					q.finishLocked(w, Canceled, now)
				}
			}
		}
	}
}
