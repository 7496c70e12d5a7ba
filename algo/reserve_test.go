package algo_test

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/algo"
)

// GCRAReserve, the memory store's lock-free path, agrees with Apply's
// reservation on GCRA, and the token bucket's reservation gives the same
// answers as GCRA's, on random states, costs and waits.
func TestReserveAgrees(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const now = int64(1_800_000_000_000_000_000)
	for i := range 20000 {
		l := sluice.Limit{Rate: 1 + r.Int64N(100), Period: time.Duration(1+r.Int64N(60)) * time.Second, Burst: r.Int64N(50)}
		p, err := algo.NewGCRAParams(l)
		if err != nil {
			t.Fatal(err)
		}
		cost := 1 + r.Int64N(l.Capacity())
		wait := time.Duration(r.Int64N(int64(2 * l.Period)))
		tat := int64(0)
		if r.IntN(4) > 0 {
			tat = now - int64(l.Period) + r.Int64N(int64(3*l.Period))
		}
		req := sluice.Request{Key: "k", Algorithm: sluice.GCRA, Limit: l, Cost: cost, MaxWait: wait}
		want, st, err := algo.Apply(sluice.OpAllow, algo.State{A: tat}, req, now)
		if err != nil {
			t.Fatal(err)
		}
		got, next := algo.GCRAReserve(tat, &p, cost, wait, now)
		if got != want || (want.Allowed && next != st.A) {
			t.Fatalf("case %d: GCRAReserve %+v (tat %d), Apply %+v (tat %d)", i, got, next, want, st.A)
		}
		// the same bucket as a token bucket: level tau − (TAT − now)
		tb := req
		tb.Algorithm = sluice.TokenBucket
		tst := algo.State{}
		if tat > now {
			tst = algo.State{A: p.Tau - (tat - now), B: now}
		}
		tbd, _, err := algo.Apply(sluice.OpAllow, tst, tb, now)
		if err != nil {
			t.Fatal(err)
		}
		if tbd != want {
			t.Fatalf("case %d: token bucket %+v, gcra %+v", i, tbd, want)
		}
	}
}

// A caller cannot use reservations to take more than the limit: on random
// sequences of reservations on one key (costs up to what fits within the
// wait, above the burst too, each with its own max wait up to wmax),
// refunds of any of them not yet due (Request.ReservedAhead, as
// Reservation.Cancel sends), or both, (1) what is admitted by any time t
// is at most burst + rate·(t − t0 + wmax), and (2) the admitted requests,
// acting at their decision time plus Delay, are every one admitted by a
// plain limiter of the same limit (no max wait) replayed at those times
// (runs without both):
// reservations shift requests into the future, never past the limit.
func TestReserveBound(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const t0 = int64(1_800_000_000_000_000_000)
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket} {
		for run := range 300 {
			l := sluice.Limit{Rate: 1 + r.Int64N(50), Period: time.Duration(1+r.Int64N(10)) * time.Second, Burst: r.Int64N(20)}
			wmax := time.Duration(r.Int64N(int64(3 * l.Period)))
			// A third of the runs refund, a third ask costs above the
			// burst, a third do both. The replay below models a cost above
			// the burst as charged when its refill began, which assumes no
			// refund moved the queue: runs doing both check the bound only.
			refunds, overBurst := run%3 != 1, run%3 != 0
			type act struct {
				at, cost int64
				ahead    int64 // when the key's state reached right after it
				refunded bool
			}
			var acts []act
			var st algo.State
			now, admitted := t0, int64(0)
			for range 200 {
				now += r.Int64N(int64(l.Period) / 4)
				if refunds && len(acts) > 0 && r.IntN(8) == 0 {
					// refund a reservation not yet due, as Reservation.Cancel
					// does: only what no later one reserved behind it
					i := r.IntN(len(acts))
					if x := &acts[i]; !x.refunded && x.at > now {
						req := sluice.Request{Key: "k", Algorithm: a, Limit: l, Cost: x.cost, ReservedAhead: time.Duration(x.ahead - now)}
						var err error
						if _, st, err = algo.Apply(sluice.OpRefund, st, req, now); err != nil {
							t.Fatal(err)
						}
						x.refunded = true
						admitted -= x.cost
						continue
					}
				}
				w := time.Duration(r.Int64N(int64(wmax) + 1))
				top := l.Capacity()
				if w > 0 && overBurst {
					top += algo.CostsIn(l, int64(w))
				}
				req := sluice.Request{Key: "k", Algorithm: a, Limit: l, Cost: 1 + r.Int64N(top), MaxWait: w}
				if req.Validate(sluice.OpAllow) != nil {
					continue // a cost that could never fit within w
				}
				d, next, err := algo.Apply(sluice.OpAllow, st, req, now)
				if err != nil {
					t.Fatal(err)
				}
				st = next
				if !d.Allowed {
					continue
				}
				admitted += req.Cost
				acts = append(acts, act{at: now + int64(d.Delay), cost: req.Cost, ahead: now + int64(d.ResetAfter)})
				if bound := l.Capacity() + algo.CostsIn(l, now-t0+int64(wmax)); admitted > bound {
					t.Fatalf("%s run %d: %s, max wait %s: %d admitted by %s, over burst + rate·(elapsed + max wait) = %d",
						a, run, l, wmax, admitted, time.Duration(now-t0), bound)
				}
			}
			if refunds && overBurst {
				continue
			}
			// (2) replay at the acting times on a plain limiter, in time
			// order. A cost above the burst, held until the rest of it has
			// refilled, is replayed as a charge when that refill began: the
			// bucket must be full then.
			tau := l.CostInterval(l.Capacity())
			for i := range acts {
				if c := acts[i].cost; c > l.Capacity() {
					acts[i].at -= l.CostInterval(c) - tau
				}
			}
			slices.SortStableFunc(acts, func(x, y act) int { return cmp.Compare(x.at, y.at) })
			var plain algo.State
			for i, x := range acts {
				if x.refunded {
					continue
				}
				req := sluice.Request{Key: "k", Algorithm: a, Limit: l, Cost: x.cost}
				op := sluice.OpAllow
				if x.cost > l.Capacity() {
					op = sluice.OpPeek
					req.Cost = l.Capacity()
				}
				d, next, err := algo.Apply(op, plain, req, x.at)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed {
					t.Fatalf("%s run %d: %s, max wait %s: reservation %d (cost %d) acts at %s, which a plain limiter denies: %+v",
						a, run, l, wmax, i, x.cost, time.Duration(x.at-t0), d)
				}
				if op == sluice.OpPeek {
					req.Cost = x.cost
					_, next, err = algo.Apply(sluice.OpCharge, plain, req, x.at)
					if err != nil {
						t.Fatal(err)
					}
				}
				plain = next
			}
		}
	}
}
