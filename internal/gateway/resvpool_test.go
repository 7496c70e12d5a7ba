package gateway

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
)

// TestResvPoolOrder holds the pool's array with room in front (popFront,
// push, insert) to a plain slice with slices.Insert, the form it
// replaced, over random takes, batches and reservations given back; and
// the slots it no longer uses hold no reservation (their ids would be
// kept from the GC).
func TestResvPoolOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var p resvPool
	var want []pooledResv
	t0 := time.Unix(1_700_000_000, 0)
	n := 0
	next := func() pooledResv {
		n++
		return pooledResv{id: strconv.Itoa(n), key: "k" + strconv.Itoa(n), at: t0.Add(time.Duration(n) * time.Millisecond)}
	}
	for step := range 20000 {
		switch op := rng.IntN(10); {
		case op < 4 && len(want) > 0: // a request takes the oldest
			got := p.popFront()
			if got != want[0] {
				t.Fatalf("step %d: took %v, want %v", step, got, want[0])
			}
			want = want[1:]
		case op < 5: // a batch arrives
			for range rng.IntN(70) {
				r := next()
				p.push(r)
				want = append(want, r)
			}
		default: // a reservation comes back, by its age
			r := pooledResv{id: "back" + strconv.Itoa(step), at: t0.Add(time.Duration(rng.IntN(n+1)) * time.Millisecond)}
			i, _ := slices.BinarySearchFunc(p.ids, r.at, func(e pooledResv, t time.Time) int { return e.at.Compare(t) })
			p.insert(i, r)
			want = slices.Insert(want, i, r)
		}
		if !slices.Equal(p.ids, want) {
			t.Fatalf("step %d: pool %v, want %v", step, p.ids, want)
		}
		for j := range p.buf {
			if (j < p.head || j >= p.head+len(p.ids)) && p.buf[j] != (pooledResv{}) {
				t.Fatalf("step %d: slot %d outside the pool holds %v", step, j, p.buf[j])
			}
		}
		if len(want) > 300 {
			for range 200 {
				p.popFront()
			}
			want = want[200:]
		}
	}
}

// TestResvPoolBound: the reservations a client's pool holds in the store
// (one Redis key each, pooledKey) stay within its capacity: what its
// requests take over resvCoverRTTs of its batches' round trips, at least
// two batches, at most resvPoolMax; and they are released at most
// 2*resvAge after its last request, not left for LeaseTTL.
//   - Many clients turn hot at once, as BenchmarkServeHTTPLeased warms
//     up (32 requests each, round robin, settlements not awaited): before,
//     each kept two full batches (127 of 128 for 32 requests), sized to a
//     third of resvAge at its rate.
//   - One of them sends a burst of 200 at once: its pool ends within its
//     capacity (the reservations given back past it are released).
//   - Then silence: the sweep releases every pool, and Redis holds no
//     reservation (before, they stayed until the client's next request or
//     LeaseTTL).
//
// Every reservation Redis holds is in a pool or to be released (settled):
// none lost, none released twice (a release of an id not held is refused).
func TestResvPoolBound(t *testing.T) {
	ctx := context.Background()
	const clients, each = 24, 32
	keys := make([]string, clients)
	var kc []KeyConfig
	for i := range keys {
		keys[i] = fmt.Sprintf("sk-bound-client-%04d", i)
		kc = append(kc, KeyConfig{Name: "k", Hash: sluice.HashKey(keys[i]), Tier: "t", Client: fmt.Sprintf("bound%d", i)})
	}
	r := newLeasedRig(t, Config{
		Tiers: map[string]TierConfig{"t": Tier(Limits{RPM: 1 << 30, TPM: 1 << 36, RPD: 1 << 36})},
		Keys:  kc,
	}, nil)
	gw := r.gw
	var skew atomic.Int64 // the gateway's clock runs this far ahead
	gw.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	var settled atomic.Int64
	go func() {
		for range r.settled {
			settled.Add(1)
		}
	}()
	var sent atomic.Int64
	serve := func(key string) {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chatBody))
		req.Header.Set("Authorization", "Bearer "+key)
		w := httptest.NewRecorder()
		gw.ServeHTTP(w, req)
		sent.Add(1)
		if w.Code != 200 {
			t.Errorf("status %d: %s", w.Code, w.Body)
		}
	}
	quiet := func() {
		t.Helper()
		if !redistest.PollUntil(time.Now().Add(20*time.Second), func() bool {
			return settled.Load() == sent.Load() && gw.asyncResv.Load() == 0
		}) {
			t.Fatalf("%d of %d requests settled after 20s", settled.Load(), sent.Load())
		}
	}
	// held is how many reservations Redis holds (a pooled key each).
	held := func() int {
		t.Helper()
		ks, err := r.srv.Do(ctx, "KEYS", "{gw:bound*}:reservation:*")
		if err != nil {
			t.Fatal(err)
		}
		return len(ks.([]any))
	}
	// pooled is every client's pool and reservations to release, and the
	// largest pool over its capacity.
	pooled := func() (ids, rel, over int) {
		for _, k := range keys {
			p := &gw.keys[sluice.HashKey(k)].resv
			p.mu.Lock()
			ids, rel = ids+len(p.ids), rel+len(p.settled)
			if c := p.capacity(gw.now()); len(p.ids) > c || c > resvPoolMax {
				over = max(over, len(p.ids)-c, c-resvPoolMax)
			}
			p.mu.Unlock()
		}
		return ids, rel, over
	}
	// consistent waits for the store to hold exactly the pools and the
	// reservations to release (a batch of releases may be in flight).
	consistent := func(what string) int {
		t.Helper()
		var ids, rel, h int
		if !redistest.PollUntil(time.Now().Add(10*time.Second), func() bool {
			ids, rel, _ = pooled()
			h = held()
			return h == ids+rel
		}) {
			t.Fatalf("%s: Redis holds %d reservations, the pools %d and %d to release", what, h, ids, rel)
		}
		return h
	}

	for i := range clients * each {
		serve(keys[i%clients])
	}
	quiet()
	ids, rel, over := pooled()
	t.Logf("warm: %d clients x %d requests: %d pooled, %d to release", clients, each, ids, rel)
	if over > 0 {
		t.Fatalf("a pool holds %d over its capacity", over)
	}
	// A client sending one request at a time among others has one in
	// flight and a gap between two of its requests of about clients
	// requests': a few reservations cover it. The bound leaves room for
	// a loaded machine's slow round trips (each widens the cover).
	if h := consistent("warm"); h > clients*16 {
		t.Fatalf("Redis holds %d reservations for %d clients of %d requests each, want at most %d", h, clients, each, clients*16)
	}

	// A burst from one client: 200 requests at once.
	const burst = 200
	var wg sync.WaitGroup
	for range burst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			serve(keys[0])
		}()
	}
	wg.Wait()
	quiet()
	ids, rel, over = pooled()
	p0 := &gw.keys[sluice.HashKey(keys[0])].resv
	p0.mu.Lock()
	n0, c0, armed := len(p0.ids), p0.capacity(gw.now()), p0.sweep != nil
	p0.mu.Unlock()
	t.Logf("after a burst of %d: the client's pool %d (capacity %d); %d pooled, %d to release in all", burst, n0, c0, ids, rel)
	if over > 0 {
		t.Fatalf("a pool holds %d over its capacity", over)
	}
	consistent("burst")
	if !armed {
		t.Fatal("no sweep armed for a hot client's pool")
	}

	// Silence: a resvAge later, the sweep releases every pool.
	skew.Store(int64(gw.resvAge()))
	for _, k := range keys {
		gw.sweepReservations(gw.keys[sluice.HashKey(k)])
	}
	if !redistest.PollUntil(time.Now().Add(10*time.Second), func() bool { return held() == 0 }) {
		ids, rel, _ := pooled()
		t.Fatalf("Redis holds %d reservations a resvAge after the clients' last request (%d pooled, %d to release)", held(), ids, rel)
	}
}
