package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/memstore"
)

// peekGate counts the store's peeks and, while hold is set, blocks them
// until released.
type peekGate struct {
	sluice.Store
	peeks   atomic.Int64
	hold    atomic.Bool
	fail    atomic.Bool // peeks fail, as in a Redis pause
	entered chan struct{}
	release chan struct{}
}

func (s *peekGate) ApplyAll(ctx context.Context, op sluice.Op, reqs []sluice.Request) ([]sluice.Decision, error) {
	if op == sluice.OpPeek {
		s.peeks.Add(1)
		if s.hold.Load() {
			s.entered <- struct{}{}
			<-s.release
		}
		if s.fail.Load() {
			return nil, errors.New("store paused")
		}
	}
	return s.Store.ApplyAll(ctx, op, reqs)
}

func statusRemaining(t *testing.T, res *http.Response) int64 {
	t.Helper()
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var b Status
	if err := json.Unmarshal(raw, &b); err != nil || res.StatusCode != 200 || len(b.Limits) == 0 {
		t.Fatalf("status %d %v: %s", res.StatusCode, err, raw)
	}
	for _, l := range b.Limits {
		if l.Name == "rpm" {
			return l.Remaining
		}
	}
	t.Fatalf("no rpm limit: %s", raw)
	return 0
}

// A key hammering GET /v1/status cannot make the store work for each
// call: concurrent calls share one peek, and an answer is reused for
// statusReuse unless the key's own traffic moved its state.
func TestStatusBoundsStoreWork(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	mem, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close() })
	st := &peekGate{Store: mem, entered: make(chan struct{}, 100), release: make(chan struct{})}
	e := newEnvStore(t, Limits{RPM: 100, TPM: 100000}, fakeopenai.Options{}, st, clk)
	var mu sync.Mutex
	now := time.Unix(1_700_000_000, 0)
	e.gw.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	get := func() *http.Response { return e.do("GET", "/v1/status", "Bearer "+clientKey, "", nil) }

	// 50 concurrent calls while the first peek is held: one peek for all.
	st.hold.Store(true)
	var wg sync.WaitGroup
	answers := make(chan int64, 50)
	for range 50 {
		wg.Go(func() { answers <- statusRemaining(t, get()) })
	}
	<-st.entered
	st.hold.Store(false)
	close(st.release)
	wg.Wait()
	close(answers)
	for r := range answers {
		if r != 100 {
			t.Fatalf("remaining %d, want 100", r)
		}
	}
	if n := st.peeks.Load(); n != 1 {
		t.Fatalf("50 concurrent status calls made %d peeks, want 1", n)
	}
	// Polled again within statusReuse: the same answer, no peek.
	for range 100 {
		statusRemaining(t, get())
	}
	if n := st.peeks.Load(); n != 1 {
		t.Fatalf("polling within %s made %d peeks, want 1", statusReuse, n)
	}
	// Past statusReuse: a fresh peek.
	advance(statusReuse)
	statusRemaining(t, get())
	if n := st.peeks.Load(); n != 2 {
		t.Fatalf("after %s: %d peeks, want 2", statusReuse, n)
	}
	// The key's own request is seen at once, not statusReuse later.
	if res := e.post(context.Background(), "/v1/chat/completions", clientKey, `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":10}`); res.StatusCode != 200 {
		t.Fatalf("request: %d", res.StatusCode)
	}
	e.settle()
	if r := statusRemaining(t, get()); r != 99 {
		t.Fatalf("after one request: remaining %d, want 99", r)
	}

	// A settlement is seen at once too: status read while a stream is
	// held shows its reservation, and after the stream ends its refund.
	hold := make(chan struct{})
	e.up.Enqueue(fakeopenai.Fault{HoldAfter: 1, Hold: hold})
	res := e.post(context.Background(), "/v1/chat/completions", clientKey, `{"model":"gpt-test","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":1000}`)
	if res.StatusCode != 200 {
		t.Fatalf("stream: %d", res.StatusCode)
	}
	during := statusTokens(t, get())
	close(hold)
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	e.settle()
	if after := statusTokens(t, get()); after <= during {
		t.Fatalf("tpm remaining %d during the stream, %d after its settlement: the refund is not shown", during, after)
	}
}

func statusTokens(t *testing.T, res *http.Response) int64 {
	t.Helper()
	defer res.Body.Close()
	var b Status
	if err := json.NewDecoder(res.Body).Decode(&b); err != nil || res.StatusCode != 200 {
		t.Fatalf("status %d %v", res.StatusCode, err)
	}
	for _, l := range b.Limits {
		if l.Name == "tpm" {
			return l.Remaining
		}
	}
	t.Fatalf("no tpm limit: %+v", b)
	return 0
}

// While the store fails (a Redis pause), status calls queued behind a
// failing peek are answered 503 at once instead of one store timeout
// each, and the next call after statusReuse tries the store again.
func TestStatusStoreDown(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	mem, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close() })
	st := &peekGate{Store: mem, entered: make(chan struct{}, 100), release: make(chan struct{})}
	e := newEnvStore(t, Limits{RPM: 100, TPM: 100000}, fakeopenai.Options{}, st, clk)
	var mu sync.Mutex
	now := time.Unix(1_700_000_000, 0)
	e.gw.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	get := func() *http.Response { return e.do("GET", "/v1/status", "Bearer "+clientKey, "", nil) }

	st.fail.Store(true)
	st.hold.Store(true)
	var wg sync.WaitGroup
	codes := make(chan int, 20)
	for range 20 {
		wg.Go(func() { res := get(); codes <- res.StatusCode; res.Body.Close() })
	}
	<-st.entered
	st.hold.Store(false)
	close(st.release)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusServiceUnavailable {
			t.Fatalf("status %d while the store fails, want 503", c)
		}
	}
	if n := st.peeks.Load(); n != 1 {
		t.Fatalf("20 calls behind a failing peek made %d peeks, want 1", n)
	}
	// The store is back: after statusReuse the next call peeks and answers.
	st.fail.Store(false)
	mu.Lock()
	now = now.Add(statusReuse)
	mu.Unlock()
	if r := statusRemaining(t, get()); r != 100 || st.peeks.Load() != 2 {
		t.Fatalf("after the store returned: remaining %d, %d peeks", r, st.peeks.Load())
	}
}

// TestStatusConcurrencyInFlight: /v1/status shows a concurrency limit as
// "2 in flight", never as a rate over the lease TTL ("2/10min", issue 27),
// with the slots left; a rate limit keeps its form.
func TestStatusConcurrencyInFlight(t *testing.T) {
	e := newEnv(t, Limits{RPM: 20, Concurrency: 2}, fakeopenai.Options{})
	res := e.do("GET", statusPath, "Bearer "+clientKey, "", nil)
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var b Status
	if err := json.Unmarshal(raw, &b); err != nil || res.StatusCode != 200 {
		t.Fatalf("status %d %v: %s", res.StatusCode, err, raw)
	}
	got := map[string]StatusLimit{}
	for _, l := range b.Limits {
		got[l.Name] = l
	}
	if c := got["concurrency"]; c.Limit != "2 in flight" || c.Remaining != 2 {
		t.Errorf("concurrency: %+v, want 2 in flight, 2 remaining: %s", c, raw)
	}
	if r := got["rpm"]; r.Limit != "20/min" {
		t.Errorf("rpm: %+v: %s", r, raw)
	}
}

// TestConcurrencyDenialInFlight: the 429 of a concurrency limit says
// "limit 1 in flight", not a rate over the lease TTL.
func TestConcurrencyDenialInFlight(t *testing.T) {
	hold, held := make(chan struct{}), make(chan struct{})
	e := newEnv(t, Limits{RPM: 100, Concurrency: 1}, fakeopenai.Options{
		CompletionTokens: 5, Default: fakeopenai.Fault{HoldAfter: 1, Hold: hold, Held: held},
	})
	first := make(chan struct{})
	go func() {
		defer close(first)
		res := e.do("POST", "/v1/chat/completions", "Bearer "+clientKey, `{"model":"gpt-test","stream":true,`+msgs+`,"max_tokens":5}`, nil)
		_, _ = io.ReadAll(res.Body)
		res.Body.Close()
	}()
	<-held
	res := e.do("POST", "/v1/chat/completions", "Bearer "+clientKey, chatBody, nil)
	ae := decodeError(t, res)
	close(hold)
	<-first
	if res.StatusCode != http.StatusTooManyRequests || !strings.Contains(ae.Error.Message, "limit 1 in flight, 0 left") {
		t.Fatalf("second call: %d %+v", res.StatusCode, ae)
	}
}
