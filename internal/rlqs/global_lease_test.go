package rlqs

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/memstore"
)

// downStore is a home across a partition: every call fails as the Redis
// store's do when the link is cut (sluice.ErrUnavailable).
type downStore struct{}

func (downStore) Apply(context.Context, sluice.Op, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, sluice.ErrUnavailable
}

func (downStore) ApplyAll(context.Context, sluice.Op, []sluice.Request) ([]sluice.Decision, error) {
	return nil, sluice.ErrUnavailable
}

// farStore is a home 150 ms away each way on the fake clock: the call
// arrives 150 ms after it was sent and its answer 150 ms after that, as
// regiontest's WAN link between ap and eu delays them.
type farStore struct {
	sluice.Store
	clk *clock.Fake
}

func (f farStore) ApplyAll(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	f.clk.Advance(150 * time.Millisecond)
	defer f.clk.Advance(150 * time.Millisecond)
	return f.Store.ApplyAll(ctx, op, reqs)
}

// used is what a concurrency key's leases hold now.
func used(t *testing.T, st sluice.Store, key string) int64 {
	t.Helper()
	d, err := st.Apply(context.Background(), sluice.OpPeek, sluice.Request{Key: key, Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: demandRate, Period: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	return demandRate - d.Remaining
}

// TestRegionLeaseSteps walks one instance's region lease through its
// renewals at named instants of a fake clock (the stores' too): it is
// sized by demand, it shrinks at the home only to what the streams still
// hold (never below), a second instance gets only what is free, and cut
// off from the home its assignments' TTL shrinks to the lease's end
// (measured from before the last renewal was sent), then none is given.
func TestRegionLeaseSteps(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	local, err := memstore.New(memstore.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = local.Close() }()
	home, err := memstore.New(memstore.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = home.Close() }()
	cfg := &Config{ReportInterval: time.Second, AssignmentTTL: 2 * time.Second, Regions: []string{"us", "eu"},
		Domains: []Domain{{Domain: "d", Policies: []Policy{{Name: "api", Match: map[string]string{"route": "*"}, RequestsPerUnit: 100, Unit: "second", Scope: "global", Home: "eu"}}}}}
	s, err := New(Options{Store: local, Config: cfg, Clock: clk, Global: &Global{Region: "us", StoreOf: func(string) sluice.Store { return farStore{home, clk} }, HomeOf: func(string) string { return "eu" }}})
	if err != nil {
		t.Fatal(err)
	}
	s.Drain() // no background renewals: this test renews by hand
	<-s.glob.stopped
	c := s.cfg.Load()
	p := c.domains["d"].policies[0]
	g := s.glob
	const homeKey = "rlqs:{d}:api:1:h"
	gb, err := g.bucket(homeKey, homeKey+":@a", p, "d", "a", clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	t0 := clk.Now()

	// t0: demand 40 per second: the lease is 40 and half again, 61.
	gb.demand.Store(40)
	g.renew(c, gb)
	if got, cap := used(t, home, homeKey), gb.cap.Load(); got != 61 || cap != 61 {
		t.Fatalf("t0: home lease %d, cap %d; want 61, 61", got, cap)
	}
	// The instance's stream takes all of it.
	if d, err := local.Apply(context.Background(), sluice.OpTake, sluice.Request{Key: gb.local, Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: gb.cap.Load(), Period: c.ttl + c.interval}, Cost: 61, Lease: "s1"}); err != nil || d.Taken != 61 {
		t.Fatalf("stream take: %+v %v", d, err)
	}
	if ttl := g.ttlAt(c, gb, t0); ttl != 2*time.Second {
		t.Errorf("t0: assignment TTL %v, want the configured 2s", ttl)
	}

	// t1 = t0 + 500ms: demand falls to 10. The cap shrinks to 16 at once,
	// but the home keeps the 61 the stream still holds.
	clk.Advance(500 * time.Millisecond)
	gb.demand.Store(10)
	g.renew(c, gb)
	if got, cap := used(t, home, homeKey), gb.cap.Load(); got != 61 || cap != 16 {
		t.Fatalf("t1: home lease %d, cap %d; want 61 (what the stream holds), 16", got, cap)
	}
	// t2: the stream's next report takes under the new cap; the next
	// renewal gives the rest back.
	clk.Advance(500 * time.Millisecond)
	if d, err := local.Apply(context.Background(), sluice.OpTake, sluice.Request{Key: gb.local, Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: gb.cap.Load(), Period: c.ttl + c.interval}, Cost: 61, Lease: "s1"}); err != nil || d.Taken != 16 {
		t.Fatalf("stream take under the shrunk cap: %+v %v", d, err)
	}
	g.renew(c, gb)
	if got := used(t, home, homeKey); got != 16 {
		t.Fatalf("t2: home lease %d, want 16", got)
	}

	// Another instance (another region's) wanting 200 gets what is free.
	gb2, err := g.bucket(homeKey, homeKey+":@b", p, "d", "b", clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	gb2.demand.Store(200)
	g.renew(c, gb2)
	if got, cap := used(t, home, homeKey), gb2.cap.Load(); got != 100 || cap != 84 {
		t.Fatalf("second instance: home leases %d, its cap %d; want 100 (the limit), 84", got, cap)
	}

	// t3 = t2 + 200ms: the last renewal sent; then the home is cut off.
	clk.Advance(200 * time.Millisecond)
	sent := clk.Now()
	g.renew(c, gb)
	gb.home = downStore{}
	// The lease ends at sent + 150 ms + leaseTTL (4.5 s) by the home's
	// clock; the instance counts from sent, and an assignment ends a
	// margin (250 ms) before, in whole seconds. (Counted from the reply,
	// 300 ms later, the last steps would still give a second.)
	for _, step := range []struct {
		at   time.Duration // from sent
		want time.Duration
	}{
		{0, 2 * time.Second},
		{2 * time.Second, 2 * time.Second}, // 2.25 s left
		{2300 * time.Millisecond, time.Second},
		{3200 * time.Millisecond, time.Second}, // 1.05 s left
		{3300 * time.Millisecond, 0},           // 0.95 s left: none
		{5 * time.Second, 0},
	} {
		clk.Set(time.Unix(0, sent+int64(step.at)))
		g.renew(c, gb) // fails: the expiry stays
		ttl := g.ttlAt(c, gb, clk.Now())
		if max(ttl, 0) != step.want || g.usable(c, gb, clk.Now()) != (step.want > 0) {
			t.Errorf("cut off, %v after the last renewal was sent: TTL %v (usable %v), want %v", step.at, ttl, g.usable(c, gb, clk.Now()), step.want)
		}
	}
	// Fail open keeps assigning the last lease's capacity.
	g.opt.FailOpen = true
	if ttl := g.ttlAt(c, gb, clk.Now()); ttl != 2*time.Second {
		t.Errorf("fail open, cut off: TTL %v, want 2s", ttl)
	}
}

// TestRegionLeaseBatches: renewals due together go to their home in
// batches of one domain (the keys' hash tag) and at most renewBatch
// buckets, one call each (and one peek on the region's store), and each
// bucket's lease is its own.
func TestRegionLeaseBatches(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	local, err := memstore.New(memstore.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = local.Close() }()
	mem, err := memstore.New(memstore.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = mem.Close() }()
	home := &countingStore{Store: mem} // coalesce_test.go's
	pol := func(name string) Policy {
		return Policy{Name: name, Match: map[string]string{"route": "*"}, RequestsPerUnit: 100, Unit: "second", Scope: "global", Home: "eu"}
	}
	cfg := &Config{ReportInterval: time.Second, Regions: []string{"us", "eu"},
		Domains: []Domain{{Domain: "a", Policies: []Policy{pol("p")}}, {Domain: "b", Policies: []Policy{pol("p")}}}}
	s, err := New(Options{Store: local, Config: cfg, Clock: clk, Global: &Global{Region: "us", StoreOf: func(string) sluice.Store { return home }, HomeOf: func(string) string { return "eu" }}})
	if err != nil {
		t.Fatal(err)
	}
	s.Drain()
	<-s.glob.stopped
	c := s.cfg.Load()
	var due []*globalBucket
	for i := range renewBatch + 5 {
		dom := "a"
		if i == renewBatch+4 {
			dom = "b"
		}
		key := fmt.Sprintf("rlqs:{%s}:p:1:%d", dom, i)
		gb, err := s.glob.bucket(key, key+":@x", c.domains[dom].policies[0], dom, "x", clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		gb.demand.Store(int64(10 + i))
		due = append(due, gb)
	}
	bs := batches(due)
	if len(bs) != 3 || len(bs[0]) != renewBatch || len(bs[1]) != 4 || len(bs[2]) != 1 || bs[2][0].domain != "b" {
		t.Fatalf("batches of %d, %d, %d, ...: want %d and 4 of domain a, 1 of b", len(bs[0]), len(bs[1]), len(bs[2]), renewBatch)
	}
	for _, b := range bs {
		s.glob.renewAll(c, b)
	}
	if n := home.calls.Load(); n != 3 {
		t.Errorf("%d calls to the home for 3 batches, want 3", n)
	}
	for i, gb := range due {
		want := int64(10+i) + int64(10+i)/2 + 1 // demand and half again: the world wants less than C
		if got := used(t, mem, gb.homeKey); got != want || gb.cap.Load() != want || gb.expires.Load() == 0 {
			t.Errorf("bucket %d: home lease %d, cap %d, expires %d; want %d", i, got, gb.cap.Load(), gb.expires.Load(), want)
		}
	}
}
