package upstream

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-io/sluice"
)

// Observe learns from an upstream's answer to g: its time to headers, the
// limits and remaining capacity its rate-limit headers report, its count
// of the request when they show it (deltas.go), and, for a 429 that Judge
// did not attribute to the request's own size, a fleet-wide cooldown of
// g's target for the Retry-After it asked.
// Tightening the shared state on a reported remaining below the store's
// runs in the background; the cooldown before Observe returns, so that a
// failover does not pick the same target. It never loosens a limit past
// the declared one.
func (p *Pool) Observe(ctx context.Context, g *Grant, status int, h http.Header, latency time.Duration) {
	t := g.Target
	if latency > 0 {
		us := latency.Microseconds()
		if old := t.latency.Load(); old == 0 {
			t.latency.Store(us)
		} else {
			t.latency.Store(old + (us-old)/8)
		}
	}
	if p.metrics != nil {
		p.metrics.sent.WithLabelValues(t.Up.Name, t.Model, statusClass(status)).Inc()
	}
	now := p.now()
	rl := readHeaders(h, now)
	for i := range 4 {
		switch l := rl.limit[i]; {
		case l > 0 && l < t.limits.get(i):
			if old := t.learned[i].Swap(l); old == 0 || l < old {
				t.drop() // a chunk taken under the higher limit
			}
		case l >= t.limits.get(i):
			t.learned[i].Store(0) // back to the declared limit, never past it
		}
	}
	if rl.remaining[limRPM] >= 0 {
		t.lastRemaining[0].Store(rl.remaining[limRPM])
	}
	if rl.remaining[limTPM] >= 0 {
		t.lastRemaining[1].Store(rl.remaining[limTPM])
		if p.metrics != nil {
			p.metrics.remaining.WithLabelValues(t.Up.Name, t.Model, "tokens").Set(float64(rl.remaining[limTPM]))
		}
	}
	if rl.remaining[limRPM] >= 0 && p.metrics != nil {
		p.metrics.remaining.WithLabelValues(t.Up.Name, t.Model, "requests").Set(float64(rl.remaining[limRPM]))
	}
	if status == http.StatusTooManyRequests {
		if p.metrics != nil {
			p.metrics.provider429.WithLabelValues(t.Up.Name, t.Model).Inc()
		}
		if g.refusal == RefusalGeneral {
			// Not the request's own size (Judge): the upstream's
			// limit, reached for everyone.
			p.Cooldown(ctx, t, cooldownOf(h, rl, now))
			return
		}
		// The request's own: what the provider reports left still
		// tightens the shared state, below.
	} else if status/100 == 2 {
		p.observeDelta(ctx, g, rl, h, p.now())
	}
	// The provider counted at most latency ago; the store has refilled
	// since.
	reported := p.now().Add(-latency)
	if rl.any() && t.syncing.CompareAndSwap(false, true) {
		p.background.Add(1)
		go func() {
			defer p.background.Done()
			defer t.syncing.Store(false)
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer cancel()
			p.tighten(sctx, t, rl.remaining, reported)
		}()
	}
}

func (l Limits) get(i int) int64 {
	v := [4]int64{l.RPM, l.TPM, l.ITPM, l.OTPM}[i]
	if v == 0 {
		return math.MaxInt64
	}
	return v
}

// tighten charges each limit of t by how much less the provider reported
// left, at about at, than the store holds.
func (p *Pool) tighten(ctx context.Context, t *TargetState, remaining [4]int64, at time.Time) {
	var peeks []sluice.Request
	var reported []int64
	for i := range 4 {
		rate := t.limit(i)
		if rate == 0 || remaining[i] < 0 {
			continue
		}
		peeks = append(peeks, p.logReq(t, i, rate, 0))
		reported = append(reported, remaining[i])
	}
	if len(peeks) == 0 {
		return
	}
	ds, err := p.store.ApplyAll(ctx, sluice.OpPeek, peeks)
	if err != nil {
		return
	}
	var charges []sluice.Request
	stale := float64(p.now().Sub(at)) / float64(p.period)
	for i, d := range ds {
		// What refilled since the provider counted is not the provider
		// having less.
		slack := int64(math.Ceil(stale * float64(peeks[i].Limit.Rate)))
		if over := d.Remaining - reported[i] - slack; over > 0 {
			req := peeks[i]
			req.Cost = over
			charges = append(charges, req)
		}
	}
	if len(charges) == 0 {
		return
	}
	t.drop()
	if _, err := p.store.ApplyAll(ctx, sluice.OpCharge, charges); err == nil && p.metrics != nil {
		p.metrics.tightened.WithLabelValues(t.Up.Name, t.Model).Inc()
	}
}

// Cooldown charges t's cooldown key d into debt, so that no replica
// sends t another request for d: the fleet-wide cooldown, which lapses by
// itself. Observe starts one on a 429.
func (p *Pool) Cooldown(ctx context.Context, t *TargetState, d time.Duration) {
	p.cooldown(ctx, t, d)
}

func (p *Pool) cooldown(ctx context.Context, t *TargetState, d time.Duration) {
	t.drop()
	now := p.now()
	t.retryAt.Store(now.Add(d).UnixNano())
	t.coolUntil.Store(now.Add(d).UnixNano())
	t.frac.Store(0)
	t.fracAt.Store(now.Add(d).UnixNano())
	if p.metrics != nil {
		p.metrics.cooldowns.WithLabelValues(t.Up.Name, t.Model).Inc()
	}
	// One unit per microsecond: an empty bucket admits its next request
	// one unit on, so d later takes d less that unit in debt.
	req := p.coolReq(t, 0)
	d0, err := p.store.Apply(ctx, sluice.OpPeek, req)
	if err != nil {
		return
	}
	if req.Cost = max(d0.Remaining, 0) + max(int64(d/time.Microsecond)-1, 0); req.Cost > 0 {
		_, _ = p.store.Apply(ctx, sluice.OpCharge, req)
	}
}

// Failover counts a request moved from t to another upstream.
func (p *Pool) Failover(t *TargetState, reason string) {
	if p.metrics != nil {
		p.metrics.failovers.WithLabelValues(t.Up.Name, t.Model, reason).Inc()
	}
}

// statusClass is a bounded metric label for a status.
func statusClass(s int) string {
	switch {
	case s == 0:
		return "error"
	case s == http.StatusTooManyRequests || s == 529:
		return strconv.Itoa(s)
	case s >= 100 && s < 600:
		return strconv.Itoa(s/100) + "xx"
	}
	return "other"
}

// Wait waits for the learning Observe started in the background.
func (p *Pool) Wait() { p.background.Wait() }

// MarkDown has this replica try t after the route's other targets for d:
// a local circuit for an upstream that failed.
func (p *Pool) MarkDown(t *TargetState, d time.Duration) {
	t.retryAt.Store(p.now().Add(d).UnixNano())
	t.downUntil.Store(p.now().Add(d).UnixNano())
}

// The fleet-wide circuit: the store counts an upstream model's failures
// (5xx, 529, timeouts) across the replicas in a bucket of FailThreshold-1
// that refills FailThreshold per FailWindow; the failure it cannot take
// (the FailThreshold-th in quick succession) cools the upstream model on
// every replica for FailCooldown (or the request limit's interval, when
// longer). Then a request probes it: the count is held empty until the
// cooldown ends, so that a probe failing right away cools it again.
const (
	FailThreshold = 3
	FailWindow    = 10 * time.Second
	FailCooldown  = 3 * time.Second
)

// Fail records a failure of t (a 5xx, a 529, a timeout, a connection
// lost after the request was sent): this replica
// tries it after the route's other targets for DefaultCooldown, and the
// failure counts in the store toward the fleet-wide circuit (FailThreshold).
// A store error leaves only the local circuit.
func (p *Pool) Fail(ctx context.Context, t *TargetState) {
	t.drop()
	p.MarkDown(t, DefaultCooldown)
	req := sluice.Request{Key: t.keyBase + "fail", Algorithm: sluice.GCRA,
		Limit: sluice.Limit{Rate: FailThreshold, Period: FailWindow, Burst: FailThreshold - 1}, Cost: 1}
	d, err := p.store.Apply(ctx, sluice.OpAllow, req)
	if err != nil || d.Allowed {
		return
	}
	p.cooldown(ctx, t, FailCooldown)
	// Hold the count empty until the cooldown ends, so that the probe's
	// failure, and not a new series of them, cools it again.
	req.Cost = int64(math.Ceil(float64(FailCooldown) * FailThreshold / float64(FailWindow)))
	_, _ = p.store.Apply(ctx, sluice.OpCharge, req)
}
