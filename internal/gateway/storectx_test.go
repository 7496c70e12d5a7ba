package gateway

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/lease"
)

// TestAdmissionStoreTimeout: store.timeout still bounds an admission
// whose store call goes out to a Redis that hangs (SIGSTOP), although its
// deadline's timer is made only then (storeCtx): the stores here wait 5 s
// themselves (redisstore's and lease's timeouts), and the client is answered 503 in
// about the gateway's 300 ms. Leased: a cold key's first decision goes to
// Redis (lease's fetch and direct decision); unleased: every decision
// does.
func TestAdmissionStoreTimeout(t *testing.T) {
	for _, leased := range []bool{true, false} {
		name := map[bool]string{true: "leased", false: "unleased"}[leased]
		t.Run(name, func(t *testing.T) {
			const key = "sk-hung-redis-client-01"
			tier := Tier(Limits{RPM: 1 << 30, TPM: 1 << 36})
			tier.Lease = &leased
			r := newLeasedRig(t, Config{
				Tiers: map[string]TierConfig{"t": tier},
				Keys:  []KeyConfig{{Name: "a", Hash: sluice.HashKey(key), Tier: "t", Client: "hung"}},
				Store: StoreConfig{Timeout: 300 * time.Millisecond},
			}, nil, func(o *lease.Options) { o.CallTimeout = 5 * time.Second })
			if err := r.srv.Freeze(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = r.srv.Thaw() })
			e := &env{t: t, srv: r.hs}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			res := e.post(ctx, "/v1/chat/completions", key, chatBody)
			took := time.Since(start)
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != 503 {
				t.Fatalf("status %d with Redis stopped, want 503", res.StatusCode)
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
