package fairqueue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/redisstore"
)

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
	ctx, cancel := context.WithTimeout(context.Background(), q.o.StoreTimeout)
	defer cancel()
	// The item's own limits and the capacity's buckets are refunded
	// apart: on Redis Cluster they are in different hash slots. An error
	// leaves tokens charged that refill at their rate, and a concurrency
	// lease that lapses: nothing leaks for good.
	for _, reqs := range [][]sluice.Request{it.Reqs, res.Pool} {
		if len(reqs) > 0 {
			_, _ = q.o.Store.ApplyAll(ctx, sluice.OpRefund, reqs)
		}
	}
}

// apply charges reqs (the item's own first n, then the capacity's) all or
// nothing: in one ApplyAll, or, once the store refused a batch across hash
// slots (Redis Cluster: the capacity's keys share no slot with a client's),
// in two, the own limits first and given back if the capacity denies. Two
// calls never admit past a limit; they can only deny, for the moment
// between them, what one call would have admitted.
func (q *Queue) apply(ctx context.Context, reqs []sluice.Request, n int) ([]sluice.Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, q.o.StoreTimeout)
	defer cancel()
	if !q.split.Load() || n == 0 || n == len(reqs) {
		ds, err := q.o.Store.ApplyAll(ctx, sluice.OpAllow, reqs)
		if err == nil || !errors.Is(err, redisstore.ErrCrossSlot) || n == 0 || n == len(reqs) {
			return ds, err
		}
		q.split.Store(true)
	}
	own, err := q.o.Store.ApplyAll(ctx, sluice.OpAllow, reqs[:n])
	if err != nil {
		return nil, err
	}
	ds := make([]sluice.Decision, len(reqs))
	copy(ds, own)
	if !sluice.Combine(own).Allowed {
		for i := n; i < len(reqs); i++ {
			ds[i] = sluice.Decision{Allowed: true, Limit: reqs[i].Limit} // not asked
		}
		return ds, nil
	}
	pool, err := q.o.Store.ApplyAll(ctx, sluice.OpAllow, reqs[n:])
	if err == nil && sluice.Combine(pool).Allowed {
		copy(ds[n:], pool)
		return ds, nil
	}
	// Give the own limits back: the request is not admitted.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), q.o.StoreTimeout)
	_, _ = q.o.Store.ApplyAll(rctx, sluice.OpRefund, reqs[:n])
	rcancel()
	if err != nil {
		return nil, err
	}
	copy(ds[n:], pool)
	for i := range n {
		// As in a batch denied as a whole: whether each would admit.
		ds[i].Allowed = true
	}
	return ds, nil
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
	full := ahead && q.fullLocked(it)
	q.mu.Unlock()
	var blockedFor time.Duration
	var hopeless bool
	switch {
	case full:
		// Refused before any store call: a flood at a full queue costs
		// no round trips.
		return q.finished(w, Full), nil
	case !ahead:
		// The fast path: one ApplyAll per option, no queue.
		blockedFor, hopeless = q.try(ctx, w)
	case len(it.Reqs) > 0 && q.o.MaxWait > 0:
		// It queues behind the items ahead of it untried, but its own
		// limits are peeked at, so that an item they deny for longer
		// than it may wait (a spent budget) is refused now.
		blockedFor, hopeless = q.peekOwn(ctx, w)
	}
	if w.res.Outcome == Admitted || w.res.Outcome == Failed {
		q.noteUsage(w)
		return q.finished(w, w.res.Outcome), nil
	}
	if hopeless || q.o.MaxWait == 0 || blockedFor > q.o.MaxWait || gateWait(w, q.clk.Now()) > q.o.MaxWait {
		return q.finished(w, Denied), nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		// No dispatcher would ever admit or expire it.
		return q.finished(w, Canceled), nil
	}
	if q.fullLocked(it) {
		return q.finished(w, Full), nil
	}
	w.done = make(chan struct{})
	now := q.clk.Now()
	w.enqueued, w.deadline = now, now+int64(q.o.MaxWait)
	w.res.Queued = true
	kq := w.class.keys[it.Key]
	if kq == nil {
		kq = &keyQueue{key: it.Key}
		w.class.keys[it.Key] = kq
	}
	if blockedFor > 0 {
		// The fast path's denial says when the key's own limits allow
		// again: no need to ask the store before.
		kq.blocked = max(kq.blocked, now+int64(blockedFor))
	}
	kq.waiting = append(kq.waiting, w)
	q.bytes += it.Bytes
	q.perKey[it.Key]++
	q.perGroup[it.Group]++
	if w.capacity != nil {
		q.perCap[w.capacity]++
	}
	if it.Gate != nil {
		q.perGate[it.Gate]++
	}
	q.total++
	w.class.depth.Add(1)
	q.Kick()
	return w, nil
}

// finished returns w, done without waiting, with outcome o.
func (q *Queue) finished(w *Waiter, o Outcome) *Waiter {
	w.res.Outcome = o
	w.done = closed
	w.state.Store(stFinished)
	return w
}

// fullLocked reports whether a bound on waiting items refuses it.
func (q *Queue) fullLocked(it *Item) bool {
	return q.perKey[it.Key] >= q.o.MaxPerKey || q.perGroup[it.Group] >= q.o.MaxPerGroup || q.total >= q.o.MaxTotal ||
		it.Bytes < 0 || it.Bytes > q.o.MaxBytes-q.bytes
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
	w := &Waiter{item: *it, class: cl}
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
	return (w.capacity != nil && q.perCap[w.capacity] > 0) || (w.item.Gate != nil && q.perGate[w.item.Gate] > 0)
}

// try runs w's options in order, one ApplyAll each, until one admits it.
// It sets w.res, and returns how long the item's own limits deny it (0
// when they allow, or deny without a retry time) and whether no wait can
// help (a cost beyond every option's burst).
func (q *Queue) try(ctx context.Context, w *Waiter) (blockedFor time.Duration, hopeless bool) {
	it := &w.item
	if it.Try != nil {
		return q.tryFunc(ctx, w)
	}
	opts := w.opts
	if w.capacity == nil {
		opts = []*option{nil}
	}
	now := q.clk.Now()
	fitsAny, tried := false, false
	for _, o := range opts {
		n := len(it.Reqs)
		var reqs []sluice.Request
		var kinds []Kind
		if o != nil {
			reqs = make([]sluice.Request, n, n+len(o.reqs))
			copy(reqs, it.Reqs)
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
				reqs = append(reqs, r)
			}
			if !fits {
				continue
			}
			fitsAny = true
			if o.emptyT.Load() > now {
				continue
			}
			kinds = o.kinds
		} else {
			reqs = it.Reqs
		}
		fitsAny, tried = true, true
		ds, err := q.apply(ctx, reqs, n)
		if err != nil {
			w.res.Outcome, w.res.Err = Failed, fmt.Errorf("fairqueue: admit: %w", err)
			return 0, false
		}
		w.res.Decisions, w.res.Pool, w.res.PoolKinds, w.res.PoolDecisions = ds[:n:n], reqs[n:len(reqs):len(reqs)], kinds, ds[n:]
		if sluice.Combine(ds).Allowed {
			w.res.Outcome, w.res.At = Admitted, now
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
	if fitsAny && !tried && len(it.Reqs) > 0 {
		// Every option is known exhausted, so no try asked the store
		// about the item's own limits: peek at them, so that an item
		// they deny for longer than it may wait (a spent budget or
		// daily limit) is refused now, not after waiting for capacity.
		return q.peekOwn(ctx, w)
	}
	return 0, !fitsAny
}

// tryFunc is try for an item with a Try: a denial closes its Gate until
// the time it reported.
func (q *Queue) tryFunc(ctx context.Context, w *Waiter) (blockedFor time.Duration, hopeless bool) {
	it := &w.item
	now := q.clk.Now()
	ok, retry, err := it.Try(ctx)
	switch {
	case err != nil:
		w.res.Outcome, w.res.Err = Failed, fmt.Errorf("fairqueue: try: %w", err)
		return 0, false
	case ok:
		w.res.Outcome, w.res.At = Admitted, now
		return 0, false
	case retry <= 0:
		return 0, true
	}
	if it.Gate != nil {
		until := now + int64(retry)
		for old := it.Gate.until.Load(); old < until && !it.Gate.until.CompareAndSwap(old, until); old = it.Gate.until.Load() {
		}
		return 0, false
	}
	return retry, false
}

// gateWait is how long w's gate stays closed after now; 0 when open.
func gateWait(w *Waiter, now int64) time.Duration {
	if g := w.item.Gate; g != nil {
		return time.Duration(max(g.until.Load()-now, 0))
	}
	return 0
}

// peekOwn asks the store, changing nothing, whether w's own limits would
// admit it now. When they deny, it records their decisions in w.res and
// returns how long they deny; a store error is the Failed outcome.
func (q *Queue) peekOwn(ctx context.Context, w *Waiter) (blockedFor time.Duration, hopeless bool) {
	ctx, cancel := context.WithTimeout(ctx, q.o.StoreTimeout)
	defer cancel()
	reqs := w.item.Reqs
	ds, err := q.o.Store.ApplyAll(ctx, sluice.OpPeek, reqs)
	if err != nil {
		w.res.Outcome, w.res.Err = Failed, fmt.Errorf("fairqueue: peek: %w", err)
		return 0, false
	}
	if wait, denied := q.retryAfter(reqs, ds); denied {
		w.res.Decisions = ds
		return wait, false
	}
	return 0, false
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
	q.AddUsage(w.item.Key, add, w.res.At)
}

// AddUsage adds delta to key's recent usage as if it had been added at
// clock time at (it has decayed since). A negative delta corrects an
// admission's Usage once the actual is known: fair in tokens, a request
// is admitted with its reservation and settles for the tokens it used
// (Result.At is then the admission's time). Usage never goes below zero.
func (q *Queue) AddUsage(key string, delta float64, at int64) {
	if delta == 0 || math.IsNaN(delta) || math.IsInf(delta, 0) {
		return
	}
	now := q.clk.Now()
	if at < now {
		delta *= math.Exp2(-float64(now-at) / float64(q.o.HalfLife))
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	u := q.usage[key]
	if u == nil {
		if delta < 0 {
			return
		}
		if len(q.usage) >= 4*q.o.MaxTotal {
			q.sweepUsageLocked(now)
		}
		u = &usage{}
		q.usage[key] = u
	}
	u.v, u.at = max(q.decayed(u, now)+delta, 0), now
}

// RecentUsage is key's recent usage now, decayed, as fair queueing
// weighs it.
func (q *Queue) RecentUsage(key string) float64 {
	now := q.clk.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.decayed(q.usage[key], now)
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
			if w.capacity != nil {
				if q.perCap[w.capacity]--; q.perCap[w.capacity] == 0 {
					delete(q.perCap, w.capacity)
				}
			}
			if g := w.item.Gate; g != nil {
				if q.perGate[g]--; q.perGate[g] == 0 {
					delete(q.perGate, g)
				}
			}
			q.total--
			q.bytes -= w.item.Bytes
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
			if now+int64(gateWait(w, now)) > w.deadline {
				// Its gate opens only after its deadline.
				q.finishLocked(w, Timeout, now)
				break
			}
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
	if w.state.Load() != stWaiting || gateWait(w, now) > 0 {
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
			if len(kq.waiting) == 0 {
				continue
			}
			// A key's items queue in order with one MaxWait: its head
			// has the earliest deadline.
			at(kq.waiting[0].deadline)
			if kq.blocked > now {
				at(kq.blocked)
				continue
			}
			if g := kq.waiting[0].item.Gate; g != nil {
				at(g.until.Load())
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
// a Kick. Then it answers every waiting item Canceled, and so are the items
// submitted later that would have to wait.
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
// Items submitted afterwards are admitted at once or canceled: nothing
// waits once no dispatcher runs.
func (q *Queue) drain() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
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
