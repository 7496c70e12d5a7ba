package redisstore

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
)

// A lease's chunk fetches (calls marked sluice.WaitForReply) each take a
// dedicated connection from rueidis' blocking pool, which grew to the most
// fetches ever in flight and kept them all: ~1.5 MB of buffers each, which
// the GC marks on every cycle (the gateway's tail benchmark held 44-160 of
// them, 110 MB of its live heap, and mark phases of 15-57 ms). 200 fetches
// at once, each 20 ms behind a delaying proxy, must leave at most
// dedicatedPoolSize connections at Redis beside the shared one and the
// group commit's, and all 200 must be answered.
func TestDedicatedPoolBounded(t *testing.T) {
	srv := redistest.NewStandalone(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	proxy.Delay.Store(int64(20 * time.Millisecond))
	s, err := New(context.Background(), Options{URL: "redis://" + proxy.Addr(), Timeout: 50 * time.Millisecond, DisableDenyCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	clients := func() int {
		t.Helper()
		info, err := srv.Info(context.Background(), "clients")
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.Atoi(info["connected_clients"])
		if err != nil {
			t.Fatalf("connected_clients %q: %v", info["connected_clients"], err)
		}
		return n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// One call first, so the shared connection is up before we count.
	req := sluice.Request{Key: redistest.Prefix(t) + "k", Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 1 << 20, Period: time.Second, Burst: 1 << 20}, Cost: 1}
	if _, err := s.Apply(ctx, sluice.OpAllow, req); err != nil {
		t.Fatal(err)
	}
	before := clients()
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := req
			r.Key = redistest.Prefix(t) + "k" + strconv.Itoa(i)
			d, err := s.Apply(sluice.WaitForReply(ctx), sluice.OpAllow, r)
			if err == nil && !d.Allowed {
				t.Errorf("fetch %d denied: %+v", i, d)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a fetch failed: %v", err)
		}
	}
	// Redis counts the proxy's connections: one per client connection.
	if after := clients(); after-before > dedicatedPoolSize {
		t.Fatalf("%d connections at Redis after 200 fetches at once (%d before): the dedicated pool grew past its cap of %d", after, before, dedicatedPoolSize)
	} else {
		t.Logf("connections at Redis: %d before, %d after 200 fetches at once (cap %d)", before, after, dedicatedPoolSize)
	}
}
