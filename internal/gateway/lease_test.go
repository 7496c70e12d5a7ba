package gateway

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/lease"
	"github.com/sluice-io/sluice/redisstore"
)

// TestLeasedTierRedis: two clients send the same requests at the same
// (fake) times, one in a leased tier (the config's `lease: true`), one in
// a tier that turns it off. The leased one's limits are decided from
// leases, every settlement of both refunds exactly once (the background
// reservation lands before its refund), and once the lease store gives its
// capacity back, Redis holds the same state for both clients' limits.
func TestLeasedTierRedis(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	rs, err := redisstore.New(ctx, redisstore.Options{URL: redistest.Standalone(t).URL(), Clock: clk, DisableDenyCache: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rs.Close() })
	ls, err := lease.New(lease.Options{Store: rs, Clock: clk, SweepEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ls.Close() })

	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, CompletionTokens: 5})
	l := Limits{RPM: 30_000, TPM: 100_000, RPD: 10_000_000}
	off := false
	plain := Tier(l)
	plain.Lease = &off
	prefix := strings.NewReplacer(":", "", "/", "").Replace(redistest.Prefix(t))
	prefix = prefix[len(prefix)-6:]
	const leasedKey, plainKey = "sk-leased-client-0001", "sk-plain-client-0001"
	cfg := &Config{
		Upstream: UpstreamConfig{BaseURL: up.URL() + "/v1", APIKeyEnv: "TEST_UPSTREAM_KEY"},
		Models:   []string{"gpt-test"},
		Store:    StoreConfig{Timeout: 5 * time.Second},
		Lease:    true,
		Tiers:    map[string]TierConfig{"leased": Tier(l), "plain": plain},
		Keys: []KeyConfig{
			{Name: "leased", Hash: sluice.HashKey(leasedKey), Tier: "leased", Client: prefix + "l"},
			{Name: "plain", Hash: sluice.HashKey(plainKey), Tier: "plain", Client: prefix + "p"},
		},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	settled := make(chan Settlement, 1000)
	gw, err := New(Options{
		Config: cfg, Store: ls,
		Getenv:    func(k string) string { return map[string]string{"TEST_UPSTREAM_KEY": upstreamKey}[k] },
		OnSettled: func(s Settlement) { settled <- s },
		Logger:    slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	e := &env{t: t, srv: srv}

	limits := []struct {
		name string
		l    sluice.Limit
	}{
		{"tpm", sluice.Limit{Rate: l.TPM, Period: time.Minute}},
		{"rpm", sluice.Limit{Rate: l.RPM, Period: time.Minute}},
		{"rpd", sluice.Limit{Rate: l.RPD, Period: 24 * time.Hour}},
	}
	// Half of every bucket used already, so that neither client's bucket
	// is full at any time (a full bucket drops refill, at different times
	// for charges made in chunks): net charges then compare exactly.
	for _, lim := range limits {
		for _, c := range []string{prefix + "l", prefix + "p"} {
			if _, err := rs.Apply(ctx, sluice.OpCharge, sluice.Request{Key: "{gw:" + c + "}:" + lim.name, Algorithm: sluice.GCRA, Limit: lim.l, Cost: lim.l.Rate / 2}); err != nil {
				t.Fatal(err)
			}
		}
	}
	const n = 150
	for range n {
		for _, key := range []string{leasedKey, plainKey} {
			res := e.post(ctx, "/v1/chat/completions", key, chatBody)
			_, _ = io.Copy(io.Discard, res.Body)
			if res.StatusCode != 200 {
				t.Fatalf("status %d", res.StatusCode)
			}
			select {
			case s := <-settled:
				if s.Err != nil || !s.UsageReported {
					t.Fatalf("settlement %+v", s)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no settlement within 10s")
			}
		}
		clk.Advance(time.Millisecond)
	}
	st := ls.Stats()
	t.Logf("lease stats %+v", st)
	// Two leased limits (rpm, rpd) and tpm per request; the first 25ms
	// measure the rate.
	if st.Hits < 2*n {
		t.Fatalf("%d decisions from leases for %d leased requests", st.Hits, n)
	}
	// The refunds went into the leases (settleIntoLeases), and still the
	// totals compare exactly below: none lost, none applied twice.
	if st.SettledUnits == 0 {
		t.Fatalf("no refund settled into the leases: %+v", st)
	}
	if err := ls.Close(); err != nil {
		t.Fatal(err)
	}
	for _, lim := range limits {
		var got [2]int64
		for i, c := range []string{prefix + "l", prefix + "p"} {
			d, err := rs.Apply(ctx, sluice.OpPeek, sluice.Request{Key: "{gw:" + c + "}:" + lim.name, Algorithm: sluice.GCRA, Limit: lim.l})
			if err != nil {
				t.Fatal(err)
			}
			got[i] = d.Remaining
		}
		if got[0] != got[1] || got[1] == lim.l.Rate/2 {
			t.Errorf("%s remaining: leased %d, plain %d; want equal, not %d", lim.name, got[0], got[1], lim.l.Rate/2)
		}
	}
}

// `lease:` is read globally and per tier; a tier's value overrides.
func TestLeaseConfig(t *testing.T) {
	c, err := Parse("lease.yml", []byte(`upstream: {base_url: "http://127.0.0.1:9/v1"}
lease: true
tiers:
  free: {rpm: 10, tpm: 1000}
  pro: {rpm: 10, tpm: 1000, lease: false}
keys: [{name: a, hash: 2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881, tier: free}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Lease || c.Tiers["free"].Lease != nil || c.Tiers["pro"].Lease == nil || *c.Tiers["pro"].Lease {
		t.Fatalf("lease: global %v, free %v, pro %v", c.Lease, c.Tiers["free"].Lease, c.Tiers["pro"].Lease)
	}
	if _, err := Parse("lease.yml", []byte(`upstream: {base_url: "http://127.0.0.1:9/v1"}
lease: sometimes
`)); err == nil {
		t.Fatal("lease: sometimes accepted")
	}
}

// TestReservationsTakenAhead: a hot client of a leased tier without a
// concurrency limit gets its requests' reservations from batches taken
// ahead, and settles into its leases, so that requests cost Redis a
// fraction of a script call each instead of two; every settlement still
// refunds exactly once (into the lease, or under its reservation in
// Redis), a reservation older than resvAge is never handed out (it is
// left to lapse; the request takes its own), and none is left held.
func TestReservationsTakenAhead(t *testing.T) {
	ctx := context.Background()
	const key = "sk-ahead-client-0001"
	r := newLeasedRig(t, Config{
		Tiers: map[string]TierConfig{"t": Tier(Limits{RPM: 1 << 30, TPM: 1 << 36, RPD: 1 << 36})},
		Keys:  []KeyConfig{{Name: "a", Hash: sluice.HashKey(key), Tier: "t", Client: "ahead"}},
	}, nil)
	srv, rs, ls, gw, cfg := r.srv, r.rs, r.ls, r.gw, r.cfg
	var skew atomic.Int64 // the gateway's clock runs this far ahead
	gw.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	send := func(n int) { t.Helper(); r.send(key, n) }
	resv := sluice.Request{Key: "{gw:ahead}:reservation", Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: 1 << 40, Period: cfg.LeaseTTL}, Cost: 1}
	pooled := func() []pooledResv {
		cl := gw.keys[sluice.HashKey(key)]
		cl.resv.mu.Lock()
		defer cl.resv.mu.Unlock()
		return slices.Clone(cl.resv.ids)
	}
	// unreleased is how many reservations of requests settled into the
	// leases wait for their batched release (flushSettled).
	unreleased := func() int {
		cl := gw.keys[sluice.HashKey(key)]
		cl.resv.mu.Lock()
		defer cl.resv.mu.Unlock()
		return len(cl.resv.settled)
	}
	// held is how many reservations Redis holds; it must be the pool's
	// alone once every request is settled: none left behind, none
	// released twice (a release of an id not held is refused).
	held := func() int64 {
		t.Helper()
		keys, err := srv.Do(ctx, "KEYS", resv.Key+"*")
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, k := range keys.([]any) {
			q := resv
			q.Key = k.(string)
			d, err := rs.Apply(ctx, sluice.OpPeek, q)
			if err != nil {
				t.Fatal(err)
			}
			n += resv.Limit.Rate - d.Remaining
		}
		return n
	}
	waitFills := r.waitFills

	send(5) // the client turns hot; its pool starts
	waitFills()
	calls0, err := srv.CommandCalls(ctx, "evalsha")
	if err != nil {
		t.Fatal(err)
	}
	// A reservation is taken with an HSET (concurrency.lua) and released
	// with a DEL; HSET is counted in Redis's commandstats when a script
	// calls it.
	hset0, err := srv.CommandCalls(ctx, "hset")
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	send(n)
	waitFills()
	calls1, err := srv.CommandCalls(ctx, "evalsha")
	if err != nil {
		t.Fatal(err)
	}
	hset1, err := srv.CommandCalls(ctx, "hset")
	if err != nil {
		t.Fatal(err)
	}
	st := ls.Stats()
	// The batches, the leases' chunk fetches, and the releases of
	// reservations settled into the leases, 64 to a call; a settlement
	// each would make it about n (253-264 calls on a loaded 2-core
	// machine before settlements went into the leases), and a
	// reservation each too 2n. Measured: 79 while each reservation was
	// released after its request, 37 since it is given back to the pool.
	// The bound leaves room for chunks that lapse on a loaded machine
	// (their refunds go to Redis).
	if got := calls1 - calls0; got > n/2 {
		t.Fatalf("%d script calls for %d requests (lease stats %+v), want at most %d", got, n, st, n/2)
	}
	// A request settled wholly into the leases gives its reservation back
	// to the pool (recycleReservation): a few batches for n requests, not
	// a reservation taken in Redis per request (n HSETs before).
	if got := hset1 - hset0; got > n/4 {
		t.Fatalf("%d reservations taken in Redis for %d requests settled into the leases, want at most %d", got, n, n/4)
	}
	if st.SettledUnits == 0 {
		t.Fatalf("nothing settled into the leases: %+v", st)
	}
	t.Logf("%d script calls and %d reservations taken for %d requests, %d fetches", calls1-calls0, hset1-hset0, n, st.Fetches)
	if p := pooled(); held() != int64(len(p)+unreleased()) || len(p) == 0 {
		t.Fatalf("Redis holds %d reservations, the pool %d and %d settled to release", held(), len(p), unreleased())
	}

	// Aged out: the next request takes its own, and the pooled ones leave
	// the pool for release with the settled ones (flushSettled), each
	// once: Redis holds no more than the pool and the ones to release.
	stale := pooled()
	skew.Store(int64(gw.resvAge()))
	send(1)
	waitFills()
	for _, p := range pooled() {
		if slices.Contains(stale, p) {
			t.Fatalf("a reservation older than %v stayed in the pool: %+v", gw.resvAge(), p)
		}
	}
	// A batch of releases may be in flight (not counted in asyncResv).
	if !redistest.PollUntil(time.Now().Add(10*time.Second), func() bool { return held() == int64(len(pooled())+unreleased()) }) {
		t.Fatalf("Redis holds %d reservations, the pool %d and %d settled to release", held(), len(pooled()), unreleased())
	}
	send(3) // hot again: a new pool
	waitFills()
	if p := pooled(); held() != int64(len(p)+unreleased()) || len(p) == 0 {
		t.Fatalf("Redis holds %d reservations, the pool %d and %d settled to release", held(), len(p), unreleased())
	}
	// Close gives the pool back.
	if err := gw.Close(); err != nil {
		t.Fatal(err)
	}
	if n := held(); n != 0 {
		t.Fatalf("Redis holds %d reservations after Close", n)
	}
}

// leasedRig is a gateway on its own Redis, wrapped in a lease.Store, with
// a fake upstream, for the leased-tier tests.
type leasedRig struct {
	t       *testing.T
	srv     *redistest.Server
	rs      *redisstore.Store
	ls      *lease.Store
	gw      *Gateway
	cfg     *Config
	hs      *httptest.Server
	up      *fakeopenai.Server
	settled chan Settlement
}

// newLeasedRig completes cfg (upstream, models, store, lease: true) and
// starts the rig; the stores run on clk (no sweep), or the system clock
// when it is nil. Each of opts, if any, changes the lease store's options.
func newLeasedRig(t *testing.T, cfg Config, clk clock.Clock, opts ...func(*lease.Options)) *leasedRig {
	t.Helper()
	ctx := context.Background()
	r := &leasedRig{t: t, srv: redistest.NewStandalone(t), settled: make(chan Settlement, 1000)}
	var err error
	if r.rs, err = redisstore.New(ctx, redisstore.Options{URL: r.srv.URL(), Clock: clk, DisableDenyCache: true, Timeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.rs.Close() })
	lo := lease.Options{Store: r.rs}
	if clk != nil {
		lo.Clock, lo.SweepEvery = clk, -1
	}
	for _, o := range opts {
		o(&lo)
	}
	if r.ls, err = lease.New(lo); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.ls.Close() })
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, CompletionTokens: 5})
	r.up = up
	cfg.Upstream = UpstreamConfig{BaseURL: up.URL() + "/v1", APIKeyEnv: "TEST_UPSTREAM_KEY"}
	cfg.Models = []string{"gpt-test"}
	if cfg.Store.Timeout == 0 {
		cfg.Store.Timeout = 5 * time.Second
	}
	cfg.Lease = true
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r.cfg = &cfg
	if r.gw, err = New(Options{
		Config: r.cfg, Store: r.ls,
		Getenv:    func(k string) string { return map[string]string{"TEST_UPSTREAM_KEY": upstreamKey}[k] },
		OnSettled: func(s Settlement) { r.settled <- s },
		Logger:    slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}); err != nil {
		t.Fatal(err)
	}
	r.hs = httptest.NewServer(r.gw)
	t.Cleanup(r.hs.Close)
	t.Cleanup(func() { _ = r.gw.Close() })
	return r
}

// send sends n chat requests with key one after another, each answered
// 200 and settled without error from the upstream's usage, below its
// reservation.
func (r *leasedRig) send(key string, n int) {
	r.t.Helper()
	e := &env{t: r.t, srv: r.hs}
	for range n {
		res := e.post(context.Background(), "/v1/chat/completions", key, chatBody)
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			r.t.Fatalf("status %d", res.StatusCode)
		}
		select {
		case s := <-r.settled:
			if s.Err != nil || !s.UsageReported || s.Actual >= s.Reserved {
				r.t.Fatalf("settlement %+v", s)
			}
		case <-time.After(10 * time.Second):
			r.t.Fatal("no settlement within 10s")
		}
	}
}

// waitFills waits until no reservation is being taken in the background.
func (r *leasedRig) waitFills() {
	r.t.Helper()
	if !redistest.PollUntil(time.Now().Add(10*time.Second), func() bool { return r.gw.asyncResv.Load() == 0 }) {
		r.t.Fatal("reservations still being taken after 10s")
	}
}

// TestLeasedLevels: a leased tier's key takes its team's and org's rpm and
// tpm from leases as well as its own limits, so a hot key of a team in an
// org costs Redis no round trip for the levels on the client's path (its
// settlement goes back into the leases, the levels' too); and they are still
// charged exactly: two keys, one leased, one not, each of a team in an org
// of its own, send the same requests at the same (fake) times, and once
// the leases are given back their teams' and orgs' limits hold the same
// state in Redis.
func TestLeasedLevels(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	const leasedKey, plainKey = "sk-leased-level-0001", "sk-plain-level-0001"
	off := false
	big := Limits{RPM: 1 << 30, TPM: 1 << 36, RPD: 1 << 36}
	plain := Tier(big)
	plain.Lease = &off
	lvl := Limits{RPM: 30_000, TPM: 100_000}
	r := newLeasedRig(t, Config{
		Tiers: map[string]TierConfig{"leased": Tier(big), "plain": plain},
		Teams: map[string]LevelConfig{"tl": {Org: "ol", Limits: lvl}, "tp": {Org: "op", Limits: lvl}},
		Orgs:  map[string]LevelConfig{"ol": {Limits: lvl}, "op": {Limits: lvl}},
		Keys: []KeyConfig{
			{Name: "l", Hash: sluice.HashKey(leasedKey), Tier: "leased", Client: "cl", Team: "tl"},
			{Name: "p", Hash: sluice.HashKey(plainKey), Tier: "plain", Client: "cp", Team: "tp"},
		},
	}, clk)
	// The store keys of the levels' limits (levels.go), leased and plain.
	type level struct {
		keys [2]string
		lim  sluice.Limit
	}
	var levels []level
	for _, suffix := range []string{"rpm", "tpm"} {
		lim := sluice.Limit{Rate: lvl.RPM, Period: time.Minute}
		if suffix == "tpm" {
			lim.Rate = lvl.TPM
		}
		levels = append(levels,
			level{[2]string{"{gw:o:ol}:o:" + suffix, "{gw:o:op}:o:" + suffix}, lim},
			level{[2]string{"{gw:o:ol}:t:2:tl:" + suffix, "{gw:o:op}:t:2:tp:" + suffix}, lim})
	}
	// Half of every bucket used, so that none is ever full (a full bucket
	// drops refill, at other times for charges made in chunks).
	for _, l := range levels {
		for _, k := range l.keys {
			if _, err := r.rs.Apply(ctx, sluice.OpCharge, sluice.Request{Key: k, Algorithm: sluice.GCRA, Limit: l.lim, Cost: l.lim.Rate / 2}); err != nil {
				t.Fatal(err)
			}
		}
	}
	const n, skip = 200, 30
	var calls int64
	var from lease.Stats
	for i := range n {
		if i == skip { // the leases learn the rate over 25ms: past the first chunks
			from = r.ls.Stats()
		}
		c0, err := r.srv.CommandCalls(ctx, "evalsha")
		if err != nil {
			t.Fatal(err)
		}
		r.send(leasedKey, 1)
		r.waitFills()
		c1, err := r.srv.CommandCalls(ctx, "evalsha")
		if err != nil {
			t.Fatal(err)
		}
		if i >= skip {
			calls += c1 - c0
		}
		r.send(plainKey, 1)
		r.waitFills()
		clk.Advance(time.Millisecond)
	}
	st := r.ls.Stats()
	t.Logf("%d script calls for %d leased requests; lease stats %+v", calls, n-skip, st)
	// rpm, rpd, tpm, and the team's and the org's rpm and tpm.
	if hits := st.Hits - from.Hits; hits < 7*(n-skip) {
		t.Fatalf("%d decisions from leases for %d requests of 7 leased limits", hits, n-skip)
	}
	if max := int64(n-skip) * 5 / 4; calls > max {
		t.Fatalf("%d script calls for %d leased requests, want at most %d", calls, n-skip, max)
	}
	if err := r.ls.Close(); err != nil {
		t.Fatal(err)
	}
	for _, l := range levels {
		var got [2]int64
		for i, k := range l.keys {
			d, err := r.rs.Apply(ctx, sluice.OpPeek, sluice.Request{Key: k, Algorithm: sluice.GCRA, Limit: l.lim})
			if err != nil {
				t.Fatal(err)
			}
			got[i] = d.Remaining
		}
		if got[0] != got[1] || got[1] == l.lim.Rate/2 {
			t.Errorf("%s remaining: leased %d, plain %d; want equal, not %d", l.keys[0], got[0], got[1], l.lim.Rate/2)
		}
	}
}

// TestReservationsTakenAheadRedisPaused: Redis stopped (SIGSTOP) while a
// hot leased client sends requests: they are admitted from leases and
// reservations taken before the pause, with no Redis call on their path.
// Settled into the leases (the gateway's default), they settle while Redis
// is stopped, with no retry. Settled in Redis (what the chunks cannot
// take: here all of it, the gateway's lease layer unset), the pool's next
// batch and their settlements time out and retry; once Redis is back every
// settlement applies (its reservation was held), and Redis holds no
// reservation but the pool's.
func TestReservationsTakenAheadRedisPaused(t *testing.T) {
	t.Run("leases", func(t *testing.T) { testReservationsRedisPaused(t, true) })
	t.Run("redis", func(t *testing.T) { testReservationsRedisPaused(t, false) })
}

func testReservationsRedisPaused(t *testing.T, intoLeases bool) {
	ctx := context.Background()
	const key = "sk-paused-client-0001"
	r := newLeasedRig(t, Config{
		Tiers: map[string]TierConfig{"t": Tier(Limits{RPM: 1 << 30, TPM: 1 << 36, RPD: 1 << 36})},
		Keys:  []KeyConfig{{Name: "a", Hash: sluice.HashKey(key), Tier: "t", Client: "paused"}},
		Store: StoreConfig{Timeout: 200 * time.Millisecond},
	}, nil)
	if !intoLeases {
		r.gw.leases = nil // every settlement goes to Redis
	}
	r.send(key, 100) // hot: leases and a pool of reservations
	r.waitFills()
	cl := r.gw.keys[sluice.HashKey(key)]
	cl.resv.mu.Lock()
	pooled := slices.Clone(cl.resv.ids) // handed out in this order
	cl.resv.mu.Unlock()
	// A client sending one request at a time holds a few: its pool
	// covers four of its batches' round trips at its rate, and at least
	// two batches of two (capacity).
	const n = 3
	if len(pooled) < n {
		t.Fatalf("%d reservations pooled, want at least %d", len(pooled), n)
	}
	if err := r.srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.srv.Thaw() })
	e := &env{t: t, srv: r.hs}
	for range n {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		res := e.post(cctx, "/v1/chat/completions", key, chatBody)
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		cancel()
		if res.StatusCode != 200 {
			t.Fatalf("status %d while Redis is stopped", res.StatusCode)
		}
	}
	if intoLeases {
		// The leases took every refund back: settled with Redis stopped.
		for range n {
			select {
			case s := <-r.settled:
				if s.Err != nil || !s.UsageReported {
					t.Fatalf("settlement into the leases %+v", s)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no settlement within 10s while Redis is stopped")
			}
		}
		if got := testutil.ToFloat64(r.gw.metrics.settleRetries); got != 0 {
			t.Fatalf("%v settlement retries; the leases took them", got)
		}
		if err := r.srv.Thaw(); err != nil {
			t.Fatal(err)
		}
		r.send(key, 3)
		return
	}
	// Every settlement's first attempt times out and is retried.
	if !redistest.PollUntil(time.Now().Add(10*time.Second), func() bool { return testutil.ToFloat64(r.gw.metrics.settleRetries) >= n }) {
		t.Fatal("settlements not retried within 10s")
	}
	select {
	case s := <-r.settled:
		t.Fatalf("settled while Redis is stopped: %+v", s)
	default:
	}
	if err := r.srv.Thaw(); err != nil {
		t.Fatal(err)
	}
	for range n {
		select {
		case s := <-r.settled:
			if s.Err != nil || !s.UsageReported {
				t.Fatalf("settlement after the pause %+v", s)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no settlement within 30s of Redis' return")
		}
	}
	// Each request's reservation, taken before the pause, was released
	// by its settlement (so it was held, and the refund applied).
	resv := sluice.Limit{Rate: 1 << 40, Period: r.cfg.LeaseTTL}
	for _, p := range pooled[:n] {
		k := pooledKey("{gw:paused}:reservation", p.id)
		d, err := r.rs.Apply(ctx, sluice.OpPeek, sluice.Request{Key: k, Algorithm: sluice.Concurrency, Limit: resv})
		if err != nil {
			t.Fatal(err)
		}
		if d.Remaining != resv.Rate {
			t.Fatalf("reservation %s still held after its settlement", k)
		}
	}
	// And the request after the pause gets one from a fresh batch.
	r.send(key, 3)
}

// A client pausing between bursts keeps a pool sized to its bursts: the
// batch after the pause is at least half the one before (not sized by the
// pause's low rate, which left the pool dry within a few requests, and
// those requests took their own reservations and settled in Redis).
func TestReservationsAfterPause(t *testing.T) {
	const key = "sk-pause-client-0001"
	r := newLeasedRig(t, Config{
		Tiers: map[string]TierConfig{"t": Tier(Limits{RPM: 1 << 30, TPM: 1 << 36, RPD: 1 << 36})},
		Keys:  []KeyConfig{{Name: "a", Hash: sluice.HashKey(key), Tier: "t", Client: "pause"}},
	}, nil)
	var skew atomic.Int64
	r.gw.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	cl := r.gw.keys[sluice.HashKey(key)]
	batch := func() int {
		cl.resv.mu.Lock()
		defer cl.resv.mu.Unlock()
		return cl.resv.batch
	}
	// 16 at a time: a batch sized to cover them (one at a time, a
	// request's reservation is given back before the next, and a batch
	// of 2 covers it).
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.send(key, 20)
		}()
	}
	wg.Wait()
	r.waitFills()
	before := batch()
	if before < 8 {
		t.Fatalf("batch %d after 16 clients' 20 requests", before)
	}
	skew.Store(int64(r.gw.resvAge() + time.Second)) // a pause: the pool ages out
	r.send(key, 2)                                  // the second is hot again and refills
	r.waitFills()
	if after := batch(); after < before/2 {
		t.Fatalf("batch %d after a pause, %d before; want at least half", after, before)
	}
}
