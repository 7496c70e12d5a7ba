package guard

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
)

// A hot key's calls that the store cannot answer in time, because they
// wait for the key's slot or for the store itself, are denied under every
// policy while the node works: a client sending many requests at once on
// its key must not be admitted by fail_open, nor get an error that a proxy
// may admit (error, with Envoy's failure_mode_deny: false). Other keys keep
// their exact answers, and the hot key's limit is intact afterwards.
func TestHotKeyFloodDeniedUnderEveryPolicy(t *testing.T) {
	for _, p := range []Policy{FailOpen, ReturnError, FailClosed, Local} {
		t.Run(p.String(), func(t *testing.T) {
			f := newFaulty(t)
			g := newGuard(t, f, Options{Policy: p, Timeout: 100 * time.Millisecond, MaxInFlightPerKey: 1, MinFailures: 1 << 20, ProbeInterval: 10 * time.Millisecond})
			ctx := context.Background()
			if _, err := g.Apply(ctx, sluice.OpAllow, req("cold", 10)); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the probe answered", func() bool { return g.Ready(ctx) == nil })
			hot := "hot"
			f.holdKey.Store(&hot)
			const callers = 16
			var wg sync.WaitGroup
			var mu sync.Mutex
			admitted, errs := 0, 0
			for range callers {
				wg.Go(func() {
					d, err := g.Apply(ctx, sluice.OpAllow, req(hot, 2))
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err != nil:
						errs++
					case d.Allowed:
						admitted++
					case !d.Degraded || d.RetryAfter <= 0:
						t.Errorf("denial %+v: want Degraded with a RetryAfter", d)
					}
				})
			}
			wg.Wait()
			if admitted != 0 || errs != 0 {
				t.Fatalf("%d callers on a key the store could not answer in time: %d admitted, %d errors; want every one denied", callers, admitted, errs)
			}
			if st := g.Stats(); st.Busy == 0 {
				t.Errorf("no call waited past the deadline for the key's slot: %+v", st)
			}
			f.holdKey.Store(nil)
			for i := range 3 {
				d, err := g.Apply(ctx, sluice.OpAllow, req(hot, 2))
				if err != nil || d.Degraded || d.Allowed != (i < 2) {
					t.Fatalf("hot key afterwards, call %d: %+v %v; want the store's exact answer, 2 of 2 left", i, d, err)
				}
			}
			if d, err := g.Apply(ctx, sluice.OpAllow, req("cold", 10)); err != nil || d.Degraded || !d.Allowed {
				t.Fatalf("cold key: %+v %v", d, err)
			}
		})
	}
}
