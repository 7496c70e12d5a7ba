package rlqs

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
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

// scheduleWorld is a drained Server (no background renewer: the test
// schedules by hand) of one global policy, home eu, on memory stores
// and a fake clock.
func scheduleWorld(t testing.TB) (*Server, *compiled, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	local, err := memstore.New(memstore.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = local.Close() })
	home, err := memstore.New(memstore.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = home.Close() })
	cfg := &Config{ReportInterval: time.Second, Regions: []string{"us", "eu"},
		Domains: []Domain{{Domain: "d", Policies: []Policy{{Name: "p", Match: map[string]string{"user": "*"}, RequestsPerUnit: 100, Unit: "second", Scope: "global", Home: "eu"}}}}}
	s, err := New(Options{Store: local, Config: cfg, Clock: clk, Global: &Global{Region: "us", StoreOf: func(string) sluice.Store { return home }, HomeOf: func(string) string { return "eu" }}})
	if err != nil {
		t.Fatal(err)
	}
	s.Drain()
	<-s.glob.stopped
	return s, s.cfg.Load(), clk
}

// TestRenewalSchedule walks the renewer's choices at named instants of a
// fake clock: renewals due are dealt one client at a time (a client with
// one bucket beside one with 300 is in the first round), each client's in
// the order of its leases' ends (a new bucket before all), a bucket that
// wants more is renewed at most every interval/8, a bucket unreported for
// its lease's TTL is forgotten, and when the places in flight are taken,
// a client with none in flight still gets one of those kept for it.
func TestRenewalSchedule(t *testing.T) {
	s, c, clk := scheduleWorld(t)
	g := s.glob
	p := c.domains["d"].policies[0]
	mk := func(peer string, i int) *globalBucket {
		key := fmt.Sprintf("rlqs:{d}:p:1:%s%d", peer, i)
		gb, err := g.bucket(key, key+":@x", p, "d", peer, clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		return gb
	}
	var flood []*globalBucket
	for i := range 300 {
		flood = append(flood, mk("flood", i))
	}
	victim := mk("victim", 0)
	isVictim := func(b []*globalBucket) bool { return len(b) == 1 && b[0] == victim }

	// t0: every bucket is new (never renewed): the victim's batch is in
	// the first round, whichever client the round starts with.
	for range 2 {
		due := g.schedule(c, clk.Now(), cap(g.sem), cap(g.reserve))
		if len(due) != 1+(300+renewBatch-1)/renewBatch {
			t.Fatalf("t0: %d batches due, want %d", len(due), 1+(300+renewBatch-1)/renewBatch)
		}
		if !isVictim(due[0]) && !isVictim(due[1]) {
			t.Errorf("t0: the victim's batch is not in the first round of two clients")
		}
	}

	// t1: every bucket renewed at t0, their leases ending in an order of
	// their own; one new flood bucket. The flood's first batch is the new
	// one and the 15 whose leases end first.
	t0 := clk.Now()
	for i, gb := range flood {
		gb.sent.Store(t0)
		gb.hungry.Store(false)
		gb.expires.Store(t0 + int64(time.Hour) + int64((i*7919)%300)*int64(time.Millisecond))
	}
	victim.sent.Store(t0)
	victim.hungry.Store(false)
	victim.expires.Store(t0 + int64(time.Hour))
	clk.Advance(c.interval / 2)
	fresh := mk("flood", 300)
	for _, gb := range append(flood, victim) {
		gb.lastUse.Store(clk.Now())
	}
	due := g.schedule(c, clk.Now(), cap(g.sem), cap(g.reserve))
	var first []*globalBucket
	for _, b := range due {
		if b[0].domain == "d" && *b[0].peer.Load() == "flood" {
			first = b
			break
		}
	}
	if len(first) != renewBatch || first[0] != fresh {
		t.Fatalf("t1: the flood's first batch has %d buckets, the new one first: %v; want %d", len(first), len(first) > 0 && first[0] == fresh, renewBatch)
	}
	for k := 1; k < len(first); k++ {
		if first[k].expires.Load() < first[k-1].expires.Load() {
			t.Errorf("t1: the flood's first batch is not in the order of its leases' ends at %d", k)
		}
		if end := first[k].expires.Load() - t0 - int64(time.Hour); end >= int64(renewBatch-1)*int64(time.Millisecond) {
			t.Errorf("t1: a lease ending at +%v in the first batch; the 15 earliest end by +15ms", time.Duration(end))
		}
	}

	// t2: the victim renewed at t1, its report wanting more: due again
	// only interval/8 after it was sent.
	t1 := clk.Now()
	for _, gb := range append(flood, victim, fresh) {
		gb.sent.Store(t1)
		gb.hungry.Store(false)
	}
	victim.hungry.Store(true)
	has := func(due [][]*globalBucket) bool { return slices.ContainsFunc(due, isVictim) }
	clk.Advance(c.interval/8 - time.Millisecond)
	if has(g.schedule(c, clk.Now(), cap(g.sem), cap(g.reserve))) {
		t.Errorf("t1 + interval/8 - 1ms: the victim, wanting more, renewed again; want at most every interval/8")
	}
	clk.Advance(time.Millisecond)
	if !has(g.schedule(c, clk.Now(), cap(g.sem), cap(g.reserve))) {
		t.Errorf("t1 + interval/8: the victim, wanting more, not renewed")
	}

	// t3: the flood unreported for longer than the lease lives: forgotten
	// (and its leases released), the victim kept.
	clk.Advance(c.leaseTTL())
	victim.lastUse.Store(clk.Now())
	g.schedule(c, clk.Now(), cap(g.sem), cap(g.reserve))
	g.mu.Lock()
	left := len(g.byKy)
	g.mu.Unlock()
	if left != 1 || len(g.all) != 1 || g.all[0] != victim {
		t.Errorf("t3: %d buckets kept (%d walked), want the victim alone", left, len(g.all))
	}

	// Every place in flight taken, a client with a renewal in flight gets
	// no more, and one with none gets a place kept for it.
	for range cap(g.sem) {
		g.sem <- struct{}{}
	}
	other := mk("other", 0)
	g.flying["flood"] = 1
	if n := g.dispatch(c, [][]*globalBucket{{fresh}, {other}}); n != 1 || len(g.reserve) != 1 {
		t.Fatalf("sem full: %d sent, %d in the reserve; want the idle client's 1", n, len(g.reserve))
	}
	<-other.ready
	if !redistest.PollUntil(time.Now().Add(10*time.Second), func() bool { return len(g.reserve) == 0 }) {
		t.Fatalf("the reserved place was not given back")
	}
	if held := used(t, s.glob.opt.StoreOf("eu"), other.homeKey); held == 0 {
		t.Errorf("the idle client's bucket holds no lease at the home after its renewal")
	}
}

// TestEarliest: the selection of a client's earliest renewals gives the
// k smallest lease ends in order, as a full sort does, with ties and
// buckets never renewed (0) among them.
func TestEarliest(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 17, 100, 1000} {
		for _, spread := range []int64{1, 3, 50, 1 << 40} {
			q := make([]due, n)
			for i := range q {
				q[i] = due{end: rng.Int64N(spread), gb: &globalBucket{}}
			}
			want := slices.Clone(q)
			slices.SortFunc(want, func(a, b due) int { return cmp.Compare(a.end, b.end) })
			for _, k := range []int{1, 16, n / 2, n, n + 5} {
				got := earliest(slices.Clone(q), k)
				if len(got) != min(k, n) {
					t.Fatalf("n %d k %d: %d returned", n, k, len(got))
				}
				for i := range got {
					if got[i].end != want[i].end {
						t.Fatalf("n %d spread %d k %d: at %d end %d, want %d", n, spread, k, i, got[i].end, want[i].end)
					}
				}
			}
		}
	}
}
