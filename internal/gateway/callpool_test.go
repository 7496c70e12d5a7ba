package gateway

import (
	"context"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/memstore"
)

// poisonCall overwrites a call that was given back, so that anything that
// still reads it after its request reads nonsense, and anything that reads
// it concurrently is a data race the race detector reports. Half of the
// calls are poisoned and kept from the pool, the others reused: the test
// covers both a late reader and a request that reuses a call.
func poisonCall(n *atomic.Int64) func(*call) bool {
	return func(c *call) bool {
		if n.Add(1)%2 == 0 {
			return true
		}
		c.id, c.model, c.status, c.reserved = "recycled", "recycled", -1, -1
		c.client = &client{id: "recycled", tier: &tier{name: "recycled"}}
		c.reqs = []sluice.Request{{Key: "recycled"}}
		c.specs = []*spec{{kind: kindRequests}}
		return false
	}
}

// TestCallRecycling runs, under the race detector, requests of every kind
// whose call goes back to the pool (callpool.go) on the leased store of
// BenchmarkServeHTTPLeased, with each recycled call overwritten as it goes
// back: hot clients whose reservations are taken ahead and settled into
// the leases; cold ones whose reservation is taken in the background;
// streams, some cut by their client; requests in flight while their leases
// are renewed (a short lease_ttl); every settlement must be right. Then an
// upstream that answers before it has read a large body, as Go's
// net/http server answers a handler that stops reading (MaxBytesReader,
// fakeopenai's 413): the transport calls the request's trace after the
// response, possibly after the call went back.
func TestCallRecycling(t *testing.T) {
	for _, ttl := range []time.Duration{0, time.Second} {
		name := map[bool]string{true: "renewals", false: "hot"}[ttl > 0]
		t.Run(name, func(t *testing.T) {
			keys := []string{"sk-recycle-client-0000", "sk-recycle-client-0001", "sk-recycle-client-0002"}
			cfg := Config{LeaseTTL: ttl, Tiers: map[string]TierConfig{"t": Tier(Limits{RPM: 1 << 30, TPM: 1 << 36, RPD: 1 << 36})}}
			for i, k := range keys {
				cfg.Keys = append(cfg.Keys, KeyConfig{Name: "k", Hash: sluice.HashKey(k), Tier: "t", Client: "rc" + string(rune('a'+i))})
			}
			r := newLeasedRig(t, cfg, nil)
			var recycled atomic.Int64
			r.gw.onRecycle = poisonCall(&recycled)
			var renewed atomic.Int64
			r.gw.onRenew = func() { renewed.Add(1) }
			if ttl > 0 {
				// Slow answers, so that renewals (every 333 ms) fire while
				// requests are in flight.
				for range 4 {
					r.up.Enqueue(fakeopenai.Fault{Delay: 800 * time.Millisecond})
				}
			}
			e := &env{t: t, srv: r.hs}
			const perWorker = 40
			var wg sync.WaitGroup
			var bad atomic.Int64
			for w := range 6 {
				wg.Go(func() {
					key := keys[w%len(keys)]
					for i := range perWorker {
						body := chatBody
						stream := i%4 == 1
						if stream {
							body = `{"model":"gpt-test","stream":true,"messages":[{"role":"user","content":"stream"}],"max_tokens":50}`
						}
						ctx, cancel := context.WithCancel(context.Background())
						res := e.post(ctx, "/v1/chat/completions", key, body)
						if stream && i%8 == 1 {
							// The client goes away mid-stream.
							buf := make([]byte, 16)
							_, _ = res.Body.Read(buf)
							cancel()
						}
						_, _ = io.Copy(io.Discard, res.Body)
						res.Body.Close()
						cancel()
						if res.StatusCode != 200 {
							bad.Add(1)
						}
					}
				})
			}
			settlements := 0
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			for settlements < 6*perWorker {
				select {
				case s := <-r.settled:
					settlements++
					if s.RequestID == "recycled" || s.Client == "recycled" || s.Reserved < 0 {
						t.Errorf("a settlement read a recycled call: %+v", s)
					}
					if s.Err != nil {
						t.Errorf("settlement failed: %+v", s)
					}
				case <-time.After(30 * time.Second):
					t.Fatalf("%d settlements of %d within 30s of the last", settlements, 6*perWorker)
				}
			}
			<-done
			if n := bad.Load(); n > 0 {
				t.Fatalf("%d requests not answered 200", n)
			}
			if recycled.Load() == 0 {
				t.Fatal("no call was recycled")
			}
			if ttl > 0 && renewed.Load() == 0 {
				t.Fatal("no lease was renewed")
			}
			t.Logf("%d of %d calls recycled, %d renewals", recycled.Load(), settlements, renewed.Load())
		})
	}

	// A failure policy's answer (a Degraded decision: the guard answered
	// after its own deadline, its store call still running in its worker
	// with the admission's context) keeps the call out of the pool.
	t.Run("degraded", func(t *testing.T) {
		st, err := memstore.New(memstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		e := newEnvStore(t, Limits{RPM: 1 << 20, TPM: 1 << 30}, fakeopenai.Options{}, degradedStore{st}, nil)
		var recycled atomic.Int64
		e.gw.onRecycle = poisonCall(&recycled)
		for range 10 {
			res := e.post(context.Background(), "/v1/chat/completions", clientKey, chatBody)
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != 200 {
				t.Fatalf("status %d", res.StatusCode)
			}
			<-e.settled
		}
		if n := recycled.Load(); n != 0 {
			t.Fatalf("%d calls recycled whose admission a failure policy answered", n)
		}
	})

	t.Run("early answer", func(t *testing.T) {
		st, err := memstore.New(memstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey, MaxBodyBytes: 1 << 10})
		e := newEnvUpstream(t, Limits{RPM: 1 << 20, TPM: 1 << 30}, up, st, nil, "")
		var recycled atomic.Int64
		e.gw.onRecycle = poisonCall(&recycled)
		big := `{"model":"gpt-test","max_tokens":5,"messages":[{"role":"user","content":"` + strings.Repeat("x ", 128<<10) + `"}]}`
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range 10 {
					res := e.post(context.Background(), "/v1/chat/completions", clientKey, big)
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
				}
			})
		}
		for range 40 {
			select {
			case s := <-e.settled:
				if s.RequestID == "recycled" {
					t.Errorf("a settlement read a recycled call: %+v", s)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("no settlement within 30s")
			}
		}
		wg.Wait()
		if recycled.Load() == 0 {
			t.Fatal("no call was recycled")
		}
	})
}

// degradedStore marks the decisions of admissions (OpAllow) Degraded, as
// a guard's failure policy does.
type degradedStore struct{ sluice.Store }

func (d degradedStore) ApplyAll(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	ds, err := d.Store.ApplyAll(ctx, op, reqs)
	if op == sluice.OpAllow {
		for i := range ds {
			ds[i].Degraded = true
		}
	}
	return ds, err
}
