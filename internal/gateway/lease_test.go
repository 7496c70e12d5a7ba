package gateway

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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
// ahead, so that each request costs Redis one script call (its
// settlement) instead of two; every settlement still refunds exactly once
// under its reservation, and a reservation older than resvAge is never
// handed out (it is left to lapse; the request takes its own).
func TestReservationsTakenAhead(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewStandalone(t)
	rs, err := redisstore.New(ctx, redisstore.Options{URL: srv.URL(), DisableDenyCache: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rs.Close() })
	ls, err := lease.New(lease.Options{Store: rs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ls.Close() })
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, CompletionTokens: 5})
	const key = "sk-ahead-client-0001"
	cfg := &Config{
		Upstream: UpstreamConfig{BaseURL: up.URL() + "/v1", APIKeyEnv: "TEST_UPSTREAM_KEY"},
		Models:   []string{"gpt-test"},
		Store:    StoreConfig{Timeout: 5 * time.Second},
		Lease:    true,
		Tiers:    map[string]TierConfig{"t": Tier(Limits{RPM: 1 << 30, TPM: 1 << 36, RPD: 1 << 36})},
		Keys:     []KeyConfig{{Name: "a", Hash: sluice.HashKey(key), Tier: "t", Client: "ahead"}},
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
	var skew atomic.Int64 // the gateway's clock runs this far ahead
	gw.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	hs := httptest.NewServer(gw)
	t.Cleanup(hs.Close)
	t.Cleanup(func() { _ = gw.Close() })
	e := &env{t: t, srv: hs}
	send := func(n int) {
		t.Helper()
		for range n {
			res := e.post(ctx, "/v1/chat/completions", key, chatBody)
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != 200 {
				t.Fatalf("status %d", res.StatusCode)
			}
			select {
			case s := <-settled:
				if s.Err != nil || !s.UsageReported || s.Actual >= s.Reserved {
					t.Fatalf("settlement %+v", s)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no settlement within 10s")
			}
		}
	}
	resv := sluice.Request{Key: "{gw:ahead}:reservation", Algorithm: sluice.Concurrency, Limit: sluice.Limit{Rate: 1 << 40, Period: cfg.LeaseTTL}, Cost: 1}
	pooled := func() []pooledResv {
		cl := gw.keys[sluice.HashKey(key)]
		cl.resv.mu.Lock()
		defer cl.resv.mu.Unlock()
		return slices.Clone(cl.resv.ids)
	}
	// held is how many reservations Redis holds; it must be the pool's
	// alone once every request is settled: none left behind, none
	// released twice (a release of an id not held is refused).
	held := func() int64 {
		t.Helper()
		d, err := rs.Apply(ctx, sluice.OpPeek, resv)
		if err != nil {
			t.Fatal(err)
		}
		return resv.Limit.Rate - d.Remaining
	}
	waitFills := func() {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for gw.asyncResv.Load() != 0 {
			if time.Now().After(deadline) {
				t.Fatal("reservations still being taken after 10s")
			}
			time.Sleep(time.Millisecond)
		}
	}

	send(5) // the client turns hot; its pool starts
	waitFills()
	calls0, err := srv.CommandCalls(ctx, "evalsha")
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
	st := ls.Stats()
	// One settlement each, the batches, and the leases' chunk fetches;
	// a reservation each would make it 2n.
	if got := calls1 - calls0; got > n+n/4 {
		t.Fatalf("%d script calls for %d requests (lease stats %+v), want at most %d", got, n, st, n+n/4)
	}
	t.Logf("%d script calls for %d requests, %d fetches", calls1-calls0, n, st.Fetches)
	if p := pooled(); held() != int64(len(p)) || len(p) == 0 {
		t.Fatalf("Redis holds %d reservations, the pool %d", held(), len(p))
	}

	// Aged out: the next request takes its own, the pooled ones stay
	// unused (still held: each releases once here).
	stale := pooled()
	skew.Store(int64(gw.resvAge()))
	send(1)
	waitFills()
	for _, r := range stale {
		q := resv
		q.Lease = r.id
		ds, err := rs.ApplyAll(ctx, sluice.OpRefund, []sluice.Request{q})
		if err != nil || !ds[0].Allowed {
			t.Fatalf("a reservation older than %v was handed out: %+v %v", gw.resvAge(), ds, err)
		}
	}
	if p := pooled(); held() != int64(len(p)) {
		t.Fatalf("Redis holds %d reservations, the pool %d", held(), len(p))
	}
}
