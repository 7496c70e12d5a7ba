package httplimit_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/httplimit"
	"github.com/sluice-io/sluice/memstore"
)

// delayed starts the middleware in delay mode on a fake clock; sleep
// stands in for the limiter's timer.
//
// The returned channel receives the X-Test-Tag header of every request
// once the middleware has returned for it (after any refund), so that a
// test can wait for that instead of for time to pass.
func delayed(t *testing.T, maxWaiting int, sleep func(context.Context, time.Duration) error) (*httptest.Server, *atomic.Int64, *sluice.Limiter, <-chan string) {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store, _ := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	lim, err := sluice.NewLimiter(sluice.Options{Store: store, Limit: sluice.Limit{Rate: 10, Period: time.Second, Burst: 5}, Sleep: sleep})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httplimit.New(httplimit.Options{Limiter: lim, Key: httplimit.ByHeader("X-API-Key"), MaxWait: time.Second, MaxWaiting: maxWaiting})
	if err != nil {
		t.Fatal(err)
	}
	var served atomic.Int64
	inner := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		_, _ = io.WriteString(w, "ok")
	}))
	finished := make(chan string, 1000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inner.ServeHTTP(w, r)
		finished <- r.Header.Get("X-Test-Tag")
	}))
	t.Cleanup(srv.Close)
	return srv, &served, lim, finished
}

func send(ctx context.Context, url string) (int, string, error) {
	return sendTagged(ctx, url, "")
}

func sendTagged(ctx context.Context, url, tag string) (int, string, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("X-API-Key", "k")
	req.Header.Set("X-Test-Tag", tag)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get(httplimit.DelayHeader), nil
}

// The check through the middleware: 10/s burst 5, MaxWait 1s, 30
// simultaneous requests: 5 at once, 10 held 100ms ... 1s, 15 get 429.
func TestMiddlewareDelayMode(t *testing.T) {
	var mu sync.Mutex
	var slept []time.Duration
	srv, served, _, _ := delayed(t, 100, func(ctx context.Context, d time.Duration) error {
		mu.Lock()
		slept = append(slept, d)
		mu.Unlock()
		return ctx.Err()
	})
	var wg sync.WaitGroup
	var now, late, denied atomic.Int64
	var headers sync.Map
	for range 30 {
		wg.Go(func() {
			code, delay, err := send(context.Background(), srv.URL)
			switch {
			case err != nil:
				t.Error(err)
			case code == 429:
				denied.Add(1)
			case code == 200 && delay == "":
				now.Add(1)
			case code == 200:
				late.Add(1)
				headers.Store(delay, true)
			}
		})
	}
	wg.Wait()
	if now.Load() != 5 || late.Load() != 10 || denied.Load() != 15 || served.Load() != 15 {
		t.Fatalf("%d at once, %d held, %d denied, %d served; want 5, 10, 15, 15", now.Load(), late.Load(), denied.Load(), served.Load())
	}
	slices.Sort(slept)
	for i, d := range slept {
		ideal := time.Duration(i+1) * 100 * time.Millisecond
		if d < ideal-5*time.Millisecond || d > ideal+5*time.Millisecond {
			t.Fatalf("held request %d slept %s, want %s ± 5ms", i, d, ideal)
		}
		if _, ok := headers.Load(strconv.FormatInt(sluice.CeilMillis(d), 10)); !ok {
			t.Fatalf("no answer carried %s = %s", httplimit.DelayHeader, d)
		}
	}
	if len(slept) != 10 {
		t.Fatalf("slept %v", slept)
	}
}

// A caller that hangs up while held is refunded and never reaches the
// handler; at most MaxWaiting are held, the rest answered at once.
func TestMiddlewareDelayCancelAndBound(t *testing.T) {
	var inSleep atomic.Int64
	sleeping := make(chan struct{}, 100)
	release := make(chan struct{})
	srv, served, lim, finished := delayed(t, 2, func(ctx context.Context, d time.Duration) error {
		inSleep.Add(1)
		defer inSleep.Add(-1)
		sleeping <- struct{}{}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	// Runs before the server's Close (cleanups run last first), so that a
	// failed assertion does not leave Close waiting on a held handler.
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free)
	for range 5 {
		if code, _, err := send(context.Background(), srv.URL); err != nil || code != 200 {
			t.Fatalf("burst: %d %v", code, err)
		}
	}
	// A held request takes the 100ms slot, then one whose caller will hang
	// up takes the 200ms slot: the newest, so that nothing was reserved
	// behind it and all of it comes back (Reservation.Cancel).
	held := make(chan int, 1)
	go func() {
		code, _, _ := send(context.Background(), srv.URL)
		held <- code
	}()
	<-sleeping
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() { _, _, err := sendTagged(ctx, srv.URL, "gone"); gone <- err }()
	<-sleeping
	// Both slots are taken: the next is decided at once, and denied.
	if code, _, err := send(context.Background(), srv.URL); err != nil || code != 429 {
		t.Fatalf("past MaxWaiting: %d %v", code, err)
	}
	cancel()
	if err := <-gone; err == nil {
		t.Fatal("cancelled request answered")
	}
	// Its 200ms slot is refunded once the middleware has returned for it:
	// the next waits 200ms, not 300ms.
	for tag := range finished {
		if tag == "gone" {
			break
		}
	}
	if n := inSleep.Load(); n != 1 {
		t.Fatalf("%d requests still sleep, want only the held one", n)
	}
	rv, err := lim.Reserve(context.Background(), "key:"+sluice.HashKey("k"), 1, time.Second)
	if err != nil || !rv.Decision.Allowed || rv.Decision.Delay != 200*time.Millisecond {
		t.Fatalf("after the refund: %+v %v, want a delay of 200ms", rv.Decision, err)
	}
	free()
	if code := <-held; code != 200 {
		t.Fatalf("held request: %d", code)
	}
	if served.Load() != 6 {
		t.Fatalf("handler served %d, want 6 (the cancelled one never)", served.Load())
	}
}
