package gateway

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/guard"
	"github.com/sluice-io/sluice/lease"
)

// TestAdmissionStoreTimeout: store.timeout still bounds an admission
// whose store call goes out to a Redis that hangs (SIGSTOP), although its
// deadline's timer is made only then (storeCtx): the stores here wait 5 s
// themselves (redisstore's and lease's timeouts), and the client is answered 503 in
// about the gateway's 300 ms. Leased: a cold key's first decision goes to
// Redis (lease's fetch and direct decision); unleased: every decision
// does; guard: the leased one through a guard whose own timeout is 5 s.
func TestAdmissionStoreTimeout(t *testing.T) {
	for _, mode := range []string{"leased", "unleased", "guard"} {
		leased := mode != "unleased"
		t.Run(mode, func(t *testing.T) {
			const key, warm = "sk-hung-redis-client-01", "sk-hung-redis-client-02"
			tier := Tier(Limits{RPM: 1 << 30, TPM: 1 << 36})
			tier.Lease = &leased
			r := newLeasedRig(t, Config{
				Tiers: map[string]TierConfig{"t": tier},
				Keys: []KeyConfig{{Name: "a", Hash: sluice.HashKey(key), Tier: "t", Client: "hung"},
					{Name: "b", Hash: sluice.HashKey(warm), Tier: "t", Client: "warm"}},
				Store: StoreConfig{Timeout: 300 * time.Millisecond},
			}, nil, func(o *lease.Options) { o.CallTimeout = 5 * time.Second })
			e := &env{t: t, srv: r.hs}
			if mode == "guard" {
				// sluice serve's stack: the guard (its own timeout 5 s,
				// errors returned) over the leases over Redis.
				gd, err := guard.New(r.ls, guard.Options{Policy: guard.ReturnError, Timeout: 5 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = gd.Close() })
				gw, err := New(Options{Config: r.cfg, Store: gd,
					Getenv: func(k string) string { return map[string]string{"TEST_UPSTREAM_KEY": upstreamKey}[k] }})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = gw.Close() })
				hs := httptest.NewServer(gw)
				t.Cleanup(hs.Close)
				e = &env{t: t, srv: hs}
			}
			// Another client's request first, so that the store's
			// connections are up: a dial to a stopped Redis gives up after
			// redisstore's 1 s dial timeout, whatever the caller's bound.
			wres := e.post(context.Background(), "/v1/chat/completions", warm, chatBody)
			_, _ = io.Copy(io.Discard, wres.Body)
			wres.Body.Close()
			if wres.StatusCode != 200 {
				t.Fatalf("status %d before Redis stopped", wres.StatusCode)
			}
			if err := r.srv.Freeze(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = r.srv.Thaw() })
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			res := e.post(ctx, "/v1/chat/completions", key, chatBody)
			took := time.Since(start)
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 503 {
				// A 429 here (guard: a call that met its caller's deadline
				// taken for a late call on a flooded key) was 1 run in 6.
				t.Fatalf("status %d with Redis stopped, want 503: %s", res.StatusCode, body)
			}
			// 300 ms is the bound; 3 s leaves a loaded machine room and is
			// still well under the stores' own 5 s.
			if took > 3*time.Second {
				t.Fatalf("answered after %s: store.timeout (300ms) did not bound the admission", took)
			}
			if err := r.srv.Thaw(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestStoreCtx holds storeCtx to context.WithDeadline's behaviour: it
// ends at its deadline, with its parent, or at stop; a context derived
// from it ends with it; it carries its parent's values.
func TestStoreCtx(t *testing.T) {
	type key struct{}
	parent := context.WithValue(context.Background(), key{}, "v")

	t.Run("deadline", func(t *testing.T) {
		var s storeCtx
		at := time.Now().Add(20 * time.Millisecond)
		ctx := s.start(parent, at)
		defer s.stop()
		if d, ok := ctx.Deadline(); !ok || !d.Equal(at) {
			t.Fatalf("deadline %v %v, want %v", d, ok, at)
		}
		if ctx.Value(key{}) != "v" {
			t.Fatal("parent's value lost")
		}
		<-ctx.Done() // the test's own timeout bounds this
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			t.Fatalf("err %v", ctx.Err())
		}
	})

	t.Run("parent", func(t *testing.T) {
		pctx, pcancel := context.WithCancel(parent)
		var s storeCtx
		ctx := s.start(pctx, time.Now().Add(time.Hour))
		defer s.stop()
		child, ccancel := context.WithCancel(ctx) // derived before the parent ends
		defer ccancel()
		pcancel()
		<-ctx.Done()
		<-child.Done()
		if !errors.Is(ctx.Err(), context.Canceled) || !errors.Is(child.Err(), context.Canceled) {
			t.Fatalf("err %v, child %v", ctx.Err(), child.Err())
		}
	})

	t.Run("earlier parent deadline", func(t *testing.T) {
		pctx, pcancel := context.WithDeadline(parent, time.Now().Add(time.Minute))
		defer pcancel()
		var s storeCtx
		ctx := s.start(pctx, time.Now().Add(time.Hour))
		defer s.stop()
		pd, _ := pctx.Deadline()
		if d, _ := ctx.Deadline(); !d.Equal(pd) {
			t.Fatalf("deadline %v, want the parent's %v", d, pd)
		}
	})

	t.Run("stop", func(t *testing.T) {
		for _, usedFirst := range []bool{true, false} {
			var s storeCtx
			ctx := s.start(parent, time.Now().Add(time.Hour))
			var child context.Context
			if usedFirst {
				var cancel context.CancelFunc
				child, cancel = context.WithCancel(ctx)
				defer cancel()
			}
			s.stop()
			<-ctx.Done() // closed by stop, or made closed after it
			if !errors.Is(ctx.Err(), context.Canceled) {
				t.Fatalf("used first %v: err %v", usedFirst, ctx.Err())
			}
			if child != nil {
				<-child.Done()
			}
			if ctx.Value(key{}) != "v" {
				t.Fatal("parent's value lost after stop")
			}
		}
	})

	t.Run("unused", func(t *testing.T) {
		var s storeCtx
		ctx := s.start(parent, time.Now().Add(time.Hour))
		_, _ = ctx.Deadline()
		_ = ctx.Value(key{})
		s.stop()
		if s.inner != nil {
			t.Fatal("a context was made for a store that never asked for Done or Err")
		}
	})
}
