package algo_test

import (
	"math/rand/v2"
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
