package region_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/internal/regiontest"
	"github.com/sluice-io/sluice/redisstore"
	"github.com/sluice-io/sluice/region"
)

// The gateway's settlement sends its refund batch (the request's
// reservation lease, and the unused tokens of a limit, here global and
// homed in eu, refunded in us to us's share) again while the store is
// unavailable (internal/gateway/settle.go, refundHeld: on
// sluice.ErrUnavailable or a deadline), trusting sluice.Store's contract:
// a refund batch is applied only while its leases are held, so an attempt
// that went through makes the next one a no-op. The share's refund's
// reply is lost: the proxy between us's ledger and us's Redis holds every
// reply past the call's deadline, then the connection is cut, as a
// network failure right after Redis ran the script would (Redis runs a
// command it received whether or not its reply gets back). Whatever the
// order of the batch, the share gets its units back once: before, the
// region store refunded the share on every attempt (oneByOne), 110 units
// instead of 105.
func TestRetriedRefundGivesShareBackOnce(t *testing.T) {
	w := regiontest.NewWorld(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	for _, order := range []string{"lease-first", "share-first"} {
		t.Run(order, func(t *testing.T) {
			proxy := redistest.NewProxy(t, w.Redis["us"].Addr)
			// A client of its own for the ledger, on one connection
			// (rueidis opens its others lazily, and a handshake held by
			// the proxy would keep the refund from being sent at all).
			ledger, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{proxy.Addr()}, DisableCache: true, PipelineMultiplex: -1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(ledger.Close)
			s := w.Store(t, "us", func(o *region.Options) { o.Ledger = ledger })
			tag := "{" + prefix + order + "}"
			tokens := sluice.Request{Key: region.GlobalKey("eu", tag+":tpm"), Algorithm: sluice.TokenBucket,
				Limit: sluice.Limit{Rate: 1000, Period: time.Minute}, Cost: 5}
			lease := sluice.Request{Key: tag + ":reservation", Algorithm: sluice.Concurrency,
				Limit: sluice.Limit{Rate: 10, Period: time.Minute}, Cost: 1, Lease: "req-1"}
			// us holds a share of 100 units, written as credit.lua
			// writes one (no fetch: nothing moves it but the refunds).
			shareKey := region.DefaultPrefix + tokens.Key
			now := redisTimeMS(t, w.Redis["us"])
			if _, err := w.Redis["us"].Do(ctx, "HSET", shareKey, "n", "100", "exp", strconv.FormatInt(now+60_000, 10), "win", "", "last", strconv.FormatInt(now, 10)); err != nil {
				t.Fatal(err)
			}
			if _, err := w.Redis["us"].Do(ctx, "PEXPIRE", shareKey, "120000"); err != nil {
				t.Fatal(err)
			}
			if d, err := s.Apply(ctx, sluice.OpAllow, lease); err != nil || !d.Allowed {
				t.Fatalf("lease: %+v %v", d, err)
			}
			// A peek of the share first: the script is loaded in Redis
			// (EVALSHA runs it), as on any region that decided the key.
			peek := tokens
			peek.Cost = 0
			if d, err := s.Apply(ctx, sluice.OpPeek, peek); err != nil || d.Remaining != 100 {
				t.Fatalf("share: %+v %v", d, err)
			}
			batch := []sluice.Request{lease, tokens}
			if order == "share-first" {
				batch = []sluice.Request{tokens, lease}
			}
			proxy.Delay.Store(int64(2 * time.Second)) // the ledger's replies: lost
			for attempt := 1; ; attempt++ {
				actx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
				_, err := s.ApplyAll(actx, sluice.OpRefund, batch)
				cancel()
				if attempt == 1 {
					proxy.Delay.Store(0)
					proxy.Cut() // the held replies never arrive
				}
				if err == nil {
					break
				}
				// refundHeld's rule for sending the batch again.
				if !errors.Is(err, sluice.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("attempt %d: %v", attempt, err)
				}
				if attempt == 3 {
					t.Fatalf("attempt %d: %v", attempt, err)
				}
			}
			n, err := w.Redis["us"].Do(ctx, "HGET", shareKey, "n")
			if err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprint(n); got != "105" {
				t.Fatalf("share after the refund of 5 and its retries: %s units, want 105", got)
			}
			// Its outcome unknown to the region, the refund is counted
			// stranded: at worst lost, never given twice.
			if st := s.Stats().Stranded; st != 5 {
				t.Fatalf("stranded %d units, want the 5 whose reply was lost", st)
			}
			// The lease was released by the refund.
			if d, err := s.Apply(ctx, sluice.OpPeek, sluice.Request{Key: lease.Key, Algorithm: lease.Algorithm, Limit: lease.Limit}); err != nil || d.Remaining != lease.Limit.Rate {
				t.Fatalf("lease after the refund: %+v %v", d, err)
			}
		})
	}
}

// A refund batch whose lease is not held (released by another
// settlement, or lapsed) gives the share nothing, as the store refuses
// the rest of a batch whose lease it does not hold.
func TestRefundWithoutLeaseGivesShareNothing(t *testing.T) {
	w := regiontest.NewWorld(t)
	ctx := context.Background()
	s := w.Store(t, "us", nil)
	tag := "{" + redistest.Prefix(t) + "}"
	tokens := sluice.Request{Key: region.GlobalKey("eu", tag+":tpm"), Algorithm: sluice.TokenBucket,
		Limit: sluice.Limit{Rate: 1000, Period: time.Minute}, Cost: 5}
	lease := sluice.Request{Key: tag + ":reservation", Algorithm: sluice.Concurrency,
		Limit: sluice.Limit{Rate: 10, Period: time.Minute}, Cost: 1, Lease: "req-1"}
	shareKey := region.DefaultPrefix + tokens.Key
	now := redisTimeMS(t, w.Redis["us"])
	if _, err := w.Redis["us"].Do(ctx, "HSET", shareKey, "n", "100", "exp", strconv.FormatInt(now+60_000, 10), "win", "", "last", strconv.FormatInt(now, 10)); err != nil {
		t.Fatal(err)
	}
	ds, err := s.ApplyAll(ctx, sluice.OpRefund, []sluice.Request{tokens, lease})
	if err != nil {
		t.Fatal(err)
	}
	if ds[0].Allowed || ds[1].Allowed {
		t.Fatalf("a batch whose lease is not held: %+v", ds)
	}
	if n, err := w.Redis["us"].Do(ctx, "HGET", shareKey, "n"); err != nil || fmt.Sprint(n) != "100" {
		t.Fatalf("share: %v %v, want 100", n, err)
	}
}

// redisTimeMS is r's clock in ms, the ledger's.
func redisTimeMS(t *testing.T, r *redistest.Server) int64 {
	t.Helper()
	v, err := r.Do(context.Background(), "TIME")
	if err != nil {
		t.Fatal(err)
	}
	parts, ok := v.([]any)
	if !ok || len(parts) != 2 {
		t.Fatalf("TIME: %v", v)
	}
	sec, err1 := strconv.ParseInt(fmt.Sprint(parts[0]), 10, 64)
	us, err2 := strconv.ParseInt(fmt.Sprint(parts[1]), 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("TIME: %v", v)
	}
	return sec*1000 + us/1000
}

// A sweep's refund at the home whose reply is lost: the home may have
// run it (a proxy holds the replies past the call's deadline), so the
// units must not go back into the share, where they were spendable while
// it lived, and refunded again at home by the next sweep. Before, a failed
// refund put them back (credit.lua keeps a live share's expiry): the
// share held again the 3 units the home had back.
func TestSweepRefundReplyLostNotPutBack(t *testing.T) {
	srv := redistest.Standalone(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	clk := clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	ctx := context.Background()
	open := func(url string) *redisstore.Store {
		s, err := redisstore.New(ctx, redisstore.Options{URL: url, Clock: clk, Timeout: time.Second, DisableDenyCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	home, local := open(proxy.URL()), open(srv.URL())
	s, err := region.New(region.Options{
		Region: "us", Regions: map[string]sluice.Store{"us": local, "eu": home}, Ledger: local.Client(),
		Global: func(*sluice.Request) bool { return true }, Home: func(string) string { return "eu" },
		Clock: clk, LedgerClock: clk, SweepEvery: -1,
		FetchWait:    time.Minute, // the fake clock does not move while a fetch runs
		FetchTimeout: 500 * time.Millisecond, CallTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	req := sluice.Request{Key: redistest.Prefix(t) + "sweep", Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 10, Period: time.Minute, Burst: 100}, Cost: 1}
	d, err := s.Apply(ctx, sluice.OpAllow, req)
	if err != nil || !d.Allowed || d.Source != sluice.FromShare {
		t.Fatalf("first call: %+v %v", d, err)
	}
	held := d.Remaining
	peek := func(st sluice.Store) int64 {
		t.Helper()
		p := req
		p.Cost = 0
		d, err := st.Apply(ctx, sluice.OpPeek, p)
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}
	// The home's state read beside the proxy (one Redis stands for both
	// regions here: the home's key is the key, the share is the ledger's).
	before := peek(local)
	clk.Advance(region.DefaultIdleAfter + time.Millisecond) // idle; the share lives TTL (5s)
	proxy.Delay.Store(int64(2 * time.Second))
	s.Sweep(ctx)
	proxy.Delay.Store(0)
	proxy.Cut()
	share := peek(s)
	gained := peek(local) - before
	t.Logf("held %d; after the sweep the share holds %d, the home got %d back", held, share, gained)
	// Whether the refund reached the home (usually: only its reply is
	// held; at times rueidis had still to open the connection or load
	// the script, whose replies are held too), the region cannot tell:
	// the units stay out of the share either way.
	if gained != held && gained != 0 {
		t.Fatalf("the home got %d back of the %d held", gained, held)
	}
	if share > 0 {
		t.Fatalf("the share holds %d again (the home got %d back)", share, gained)
	}
	if st := s.Stats(); st.Stranded != uint64(held) {
		t.Fatalf("stranded %d, want %d", st.Stranded, held)
	}
}
