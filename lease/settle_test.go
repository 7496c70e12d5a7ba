package lease_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/lease"
	"github.com/sluice-io/sluice/storetest"
)

// counted counts the calls that reach the wrapped (real) store.
type counted struct {
	sluice.Store
	calls atomic.Int64
}

func (c *counted) Apply(ctx context.Context, op sluice.Op, req sluice.Request) (sluice.Decision, error) {
	c.calls.Add(1)
	return c.Store.Apply(ctx, op, req)
}

func (c *counted) ApplyAll(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	c.calls.Add(1)
	return c.Store.ApplyAll(ctx, op, reqs)
}

// settleRig is a leased memory store on a fake clock whose key req has a
// live chunk, and lent units counted since its last drop.
type settleRig struct {
	s     *lease.Store
	inner *counted
	clk   *clock.Fake
	req   sluice.Request
}

func newSettleRig(t *testing.T, alg sluice.Algorithm, lim sluice.Limit) *settleRig {
	t.Helper()
	clk := clock.NewFake(storetest.T0)
	r := &settleRig{inner: &counted{Store: newMem(t, clk)}, clk: clk,
		req: sluice.Request{Key: "k", Algorithm: alg, Limit: lim, Cost: 1}}
	r.s = newLease(t, lease.Options{All: true, Store: r.inner, Clock: clk, SweepEvery: -1,
		TTL: time.Hour, IdleAfter: time.Hour, MinChunk: 1, MaxFraction: 0.5})
	// Warm: the key's rate is known and a chunk is held.
	drive(t, r.s, clk, r.req, 2, time.Millisecond, 200*time.Millisecond)
	r.s.WaitAsync()
	return r
}

// fresh starts a new generation of the lease (OpReset drops the chunk and
// what it lent) and admits n units from the lease, all lent by the new
// chunk.
func (r *settleRig) fresh(t *testing.T, n int) {
	t.Helper()
	if _, err := r.s.Apply(context.Background(), sluice.OpReset, r.req); err != nil {
		t.Fatal(err)
	}
	for local, tries := 0, 0; local < n; tries++ {
		if tries > 100 {
			t.Fatalf("%d of %d admissions from the lease after 100 tries", local, n)
		}
		d, err := r.s.Apply(context.Background(), sluice.OpAllow, r.req)
		if err != nil || !d.Allowed {
			t.Fatalf("admission: %+v %v", d, err)
		}
		r.s.WaitAsync() // a fetch it started has landed before the next
		if d.Source == sluice.FromLease {
			local++
		}
	}
}

func one(req sluice.Request, cost int64) []sluice.Request {
	req.Cost = cost
	return []sluice.Request{req}
}

// A GCRA refund goes back into the chunk that lent the units, with no
// store call, at most what the chunk lent, and never twice: the part over
// it, and every later refund, goes to the store.
func TestSettleLocalRefundOnce(t *testing.T) {
	for _, alg := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			r := newSettleRig(t, alg, sluice.Limit{Rate: 10_000, Period: time.Second, Burst: 2000})
			r.fresh(t, 3)
			calls, settled := r.inner.calls.Load(), r.s.Stats().SettledUnits
			rest := r.s.SettleLocal(sluice.OpRefund, one(r.req, 5))
			if len(rest) != 1 || rest[0].Cost != 2 {
				t.Fatalf("refund of 5 after 3 lent left %+v for the store; want cost 2", rest)
			}
			if got := r.s.SettleLocal(sluice.OpRefund, one(r.req, 1)); len(got) != 1 || got[0].Cost != 1 {
				t.Fatalf("a second refund once the lent units are back left %+v; want it whole for the store", got)
			}
			if n := r.inner.calls.Load() - calls; n != 0 {
				t.Fatalf("SettleLocal made %d store calls", n)
			}
			if n := r.s.Stats().SettledUnits - settled; n != 3 {
				t.Fatalf("settled %d units locally; want 3", n)
			}
		})
	}
}

// The refunded units are admitted again from the lease: they went back
// into the chunk, not nowhere.
func TestSettleLocalRefundIsUsable(t *testing.T) {
	r := newSettleRig(t, sluice.GCRA, sluice.Limit{Rate: 10_000, Period: time.Second, Burst: 2000})
	r.fresh(t, 1)
	// Drain the chunk: take its units one by one until the lease has none.
	var drained int64
	for {
		d, err := r.s.Apply(context.Background(), sluice.OpPeek, r.req)
		if err != nil {
			t.Fatal(err)
		}
		if d.Source != sluice.FromLease {
			break
		}
		if rest := r.s.SettleLocal(sluice.OpCharge, one(r.req, 1)); rest != nil {
			t.Fatalf("a charge the chunk holds left %+v", rest)
		}
		drained++
	}
	if drained == 0 {
		t.Fatal("no chunk to drain")
	}
	if rest := r.s.SettleLocal(sluice.OpRefund, one(r.req, 1)); rest != nil {
		t.Fatalf("refund of a lent unit left %+v", rest)
	}
	if d, _ := r.s.Apply(context.Background(), sluice.OpPeek, r.req); d.Source != sluice.FromLease {
		t.Fatalf("after the refund the lease holds nothing: %+v", d)
	}
}

// A chunk that lapsed takes no refund, whether it held units (dropped at
// expiry) or was empty: the units it lent were charged too long ago to be
// admitted again; the refund goes to the store.
func TestSettleLocalLapsedChunk(t *testing.T) {
	r := newSettleRig(t, sluice.GCRA, sluice.Limit{Rate: 10_000, Period: time.Second, Burst: 2000})
	r.fresh(t, 3)
	// An empty chunk (drained by a charge) lapses too: no drop marks it.
	if rest := r.s.SettleLocal(sluice.OpCharge, one(r.req, 1_000_000)); len(rest) != 1 {
		t.Fatalf("draining charge left %+v", rest)
	}
	r.clk.Advance(2 * time.Hour) // past TTL
	if rest := r.s.SettleLocal(sluice.OpRefund, one(r.req, 2)); len(rest) != 1 || rest[0].Cost != 2 {
		t.Fatalf("refund into a lapsed chunk left %+v; want it whole for the store", rest)
	}
}

// A window algorithm's refund goes to the store: the request does not say
// which window it was admitted in. A charge is drawn from the live chunk
// of the current window, and the rest left for the store.
func TestSettleLocalWindow(t *testing.T) {
	r := newSettleRig(t, sluice.FixedWindow, sluice.Limit{Rate: 100_000, Period: time.Hour})
	r.fresh(t, 3)
	if rest := r.s.SettleLocal(sluice.OpRefund, one(r.req, 1)); len(rest) != 1 || rest[0].Cost != 1 {
		t.Fatalf("window refund left %+v; want it whole for the store", rest)
	}
	rest := r.s.SettleLocal(sluice.OpCharge, one(r.req, 1_000_000))
	if len(rest) != 1 || rest[0].Cost >= 1_000_000 || rest[0].Cost < 1 {
		t.Fatalf("a charge over the chunk left %+v; want the part the chunk did not hold", rest)
	}
}

// Members SettleLocal must not touch pass through whole and in order:
// a concurrency release, another op, a request without UseLease on a
// store that leases only those.
func TestSettleLocalPassThrough(t *testing.T) {
	clk := clock.NewFake(storetest.T0)
	s := newLease(t, lease.Options{Store: newMem(t, clk), Clock: clk, SweepEvery: -1})
	lim := sluice.Limit{Rate: 10_000, Period: time.Second, Burst: 2000}
	reqs := []sluice.Request{
		{Key: "c", Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: 5, Period: time.Minute}, Cost: 1, Lease: "id"},
		{Key: "g", Algorithm: sluice.GCRA, Limit: lim, Cost: 3},
	}
	if got := s.SettleLocal(sluice.OpRefund, reqs); len(got) != 2 || &got[0] != &reqs[0] {
		t.Fatalf("untouched batch came back as %+v", got)
	}
	if got := s.SettleLocal(sluice.OpAllow, reqs); len(got) != 2 {
		t.Fatalf("OpAllow came back as %+v", got)
	}
}

// After Close, nothing is settled locally: the leases were given back.
func TestSettleLocalAfterClose(t *testing.T) {
	r := newSettleRig(t, sluice.GCRA, sluice.Limit{Rate: 10_000, Period: time.Second, Burst: 2000})
	r.fresh(t, 3)
	if err := r.s.Close(); err != nil {
		t.Fatal(err)
	}
	if rest := r.s.SettleLocal(sluice.OpRefund, one(r.req, 2)); len(rest) != 1 || rest[0].Cost != 2 {
		t.Fatalf("refund after Close left %+v; want it whole for the store", rest)
	}
}
