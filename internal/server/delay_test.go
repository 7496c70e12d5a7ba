package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
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
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/metrics"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/redisstore"
	"github.com/sluice-io/sluice/storetest"
)

const delayConfig = `
policies:
  smooth: {limit: 10/s burst 5, max_wait: 1s}
  nginx: {limit: 10/s burst 15, delay: 5}
  one: {limit: 10/s burst 1, max_wait: 1s}
tiers:
  smooth: {policies: [smooth]}
authz:
  default_tier: smooth
max_waiting: 4
`

// delaySvc is a server on the given store, whose held requests call sleep.
type delaySvc struct {
	srv *Server
	url string
}

func startDelay(t *testing.T, store sluice.Store, maxWaiting int, sleep func(context.Context, time.Duration) error) *delaySvc {
	t.Helper()
	cfg, err := config.Parse("delay.yaml", []byte(strings.Replace(delayConfig, "max_waiting: 4", fmt.Sprintf("max_waiting: %d", maxWaiting), 1)))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Options{Store: store, Config: cfg, Metrics: metrics.New(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Sleep: sleep, AdminToken: adminToken})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return &delaySvc{srv: srv, url: hs.URL}
}

// metric returns the /metrics line that starts with name, or "".
func (s *delaySvc) metric(t *testing.T, name string) string {
	t.Helper()
	resp, err := http.Get(s.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, name+" ") {
			return line
		}
	}
	return ""
}

type held struct {
	status int
	delay  string // DelayHeader
	body   map[string]any
}

func (s *delaySvc) post(ctx context.Context, body string) (held, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", s.url+"/v1/check", strings.NewReader(body))
	if err != nil {
		return held{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return held{}, err
	}
	defer resp.Body.Close()
	h := held{status: resp.StatusCode, delay: resp.Header.Get(DelayHeader)}
	if err := json.NewDecoder(resp.Body).Decode(&h.body); err != nil {
		return held{}, err
	}
	return h, nil
}

// burst30 sends 30 simultaneous checks of policy to s and checks the
// issue's outcome: atOnce (5 for smooth; NGINX's 6 for nginx) at once, 10
// held 100ms, 200ms, ... 1s (the delays the handler slept, recorded by
// sleep, within 5ms of their ideal), the rest denied with 429.
func burst30(t *testing.T, s *delaySvc, policy, key string, slept func() []time.Duration) {
	atOnce := 5
	if policy == "nginx" {
		atOnce = 6
	}
	t.Helper()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		answers []held
	)
	body := fmt.Sprintf(`{"policy":%q,"key":%q}`, policy, key)
	for range 30 {
		wg.Go(func() {
			h, err := s.post(context.Background(), body)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			answers = append(answers, h)
			mu.Unlock()
		})
	}
	wg.Wait()
	var now, late, denied int
	var headers []int64
	for _, h := range answers {
		switch {
		case h.status == 429:
			denied++
		case h.status == 200 && h.delay == "":
			now++
		case h.status == 200:
			late++
			ms, err := strconv.ParseInt(h.delay, 10, 64)
			if err != nil || int64(h.body["delay_ms"].(float64)) != ms {
				t.Fatalf("delay header %q, body %v", h.delay, h.body)
			}
			headers = append(headers, ms)
		default:
			t.Fatalf("status %d: %v", h.status, h.body)
		}
	}
	if now != atOnce || late != 10 || denied != 20-atOnce {
		t.Fatalf("%d at once, %d held, %d denied; want %d, 10, %d", now, late, denied, atOnce, 20-atOnce)
	}
	delays := slept()
	slices.Sort(delays)
	slices.Sort(headers)
	if len(delays) != 10 {
		t.Fatalf("slept %v, want 10 delays", delays)
	}
	for i, d := range delays {
		ideal := time.Duration(i+1) * 100 * time.Millisecond
		if d < ideal-5*time.Millisecond || d > ideal+5*time.Millisecond {
			t.Fatalf("held request %d slept %s, want %s ± 5ms", i, d, ideal)
		}
		if headers[i] != sluice.CeilMillis(d) {
			t.Fatalf("held request %d: header %dms, slept %s", i, headers[i], d)
		}
	}
	t.Logf("%d at once, %d held %v, %d denied", now, late, delays, denied)
}

// recorder is a sleep that records the delays and returns at once: the
// store's clock stands still, so every delay is computed at one instant.
func recorder() (func(context.Context, time.Duration) error, func() []time.Duration) {
	var mu sync.Mutex
	var ds []time.Duration
	return func(ctx context.Context, d time.Duration) error {
			mu.Lock()
			ds = append(ds, d)
			mu.Unlock()
			return ctx.Err()
		}, func() []time.Duration {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(ds)
		}
}

// The check on memory: 10/s burst 5 max_wait 1s, 30 simultaneous
// requests; and NGINX's burst=15 delay=5, which passes one more at once
// (and in all).
func TestDelayModeMemory(t *testing.T) {
	for _, policy := range []string{"smooth", "nginx"} {
		t.Run(policy, func(t *testing.T) {
			clk := clock.NewFake(storetest.T0)
			store, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			sleep, slept := recorder()
			s := startDelay(t, store, 100, sleep) // all 30 may wait here
			burst30(t, s, policy, "k", slept)
		})
	}
}

// The check on real Redis, standalone and Cluster, with the store
// on a fake clock so that the delays are exact.
func TestDelayModeRedis(t *testing.T) {
	for name, url := range map[string]string{"standalone": redistest.Standalone(t).URL(), "cluster": redistest.SharedCluster(t).URL()} {
		t.Run(name, func(t *testing.T) {
			clk := clock.NewFake(storetest.T0)
			store, err := redisstore.New(context.Background(), redisstore.Options{URL: url, Clock: clk, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = store.Close() })
			for _, policy := range []string{"smooth", "nginx"} {
				sleep, slept := recorder()
				s := startDelay(t, store, 100, sleep)
				burst30(t, s, policy, redistest.Prefix(t), slept)
			}
		})
	}
}

// A caller that hangs up while held gives its reservation back: the next
// caller gets its place (its delay), not the one after it.
func TestDelayModeDisconnectRefunds(t *testing.T) {
	clk := clock.NewFake(storetest.T0)
	store, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	sleeping := make(chan time.Duration, 10)
	s := startDelay(t, store, 4, func(ctx context.Context, d time.Duration) error {
		sleeping <- d
		<-ctx.Done()
		return ctx.Err()
	})
	body := `{"policy":"one","key":"gone"}`
	if h, err := s.post(context.Background(), body); err != nil || h.status != 200 || h.delay != "" {
		t.Fatalf("first: %+v %v", h, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.post(ctx, body)
		done <- err
	}()
	if d := <-sleeping; d != 100*time.Millisecond {
		t.Fatalf("held for %s, want 100ms", d)
	}
	peek := func() int64 {
		resp, err := http.Get(s.url + "/v1/status?policy=one&key=gone")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&b); err != nil {
			t.Fatal(err)
		}
		ms, _ := b["delay_ms"].(float64)
		return int64(ms)
	}
	if got := peek(); got != 200 {
		t.Fatalf("while held, the next would wait %dms, want 200", got)
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the cancelled request was answered")
	}
	if !redistest.PollUntil(time.Now().Add(5*time.Second), func() bool { return peek() == 100 }) {
		t.Fatalf("the reservation was not refunded: the next would wait %dms, want 100", peek())
	}
	if n := s.srv.Waiting(); n != 0 {
		t.Fatalf("%d still waiting", n)
	}
	if got := s.metric(t, `sluice_delay_requests_total{result="abandoned"}`); !strings.HasSuffix(got, " 1") {
		t.Fatalf("abandoned metric: %q", got)
	}
}

// A flood cannot make an instance hold more than max_waiting requests:
// the rest are answered at once, 429 (the key is reserved ahead), and the
// held ones still get through.
func TestDelayModeBoundsWaiting(t *testing.T) {
	clk := clock.NewFake(storetest.T0)
	store, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var inSleep, peak atomic.Int64
	s := startDelay(t, store, 4, func(ctx context.Context, d time.Duration) error {
		n := inSleep.Add(1)
		defer inSleep.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	body := `{"policy":"one","key":"flood"}`
	if h, err := s.post(context.Background(), body); err != nil || h.status != 200 {
		t.Fatalf("first: %+v %v", h, err)
	}
	const n = 50
	statuses := make(chan held, n)
	for range n {
		go func() {
			h, err := s.post(context.Background(), body)
			if err != nil {
				t.Error(err)
			}
			statuses <- h
		}()
	}
	// All but max_waiting (4) are answered without being held.
	refused := 0
	for refused < n-4 {
		h := <-statuses
		if h.status != 429 {
			t.Fatalf("unheld answer %d: %+v", refused, h)
		}
		refused++
	}
	if w := s.srv.Waiting(); w != 4 {
		t.Fatalf("%d waiting, want 4", w)
	}
	if got := s.metric(t, "sluice_delay_waiting"); got != "sluice_delay_waiting 4" {
		t.Fatalf("waiting gauge: %q", got)
	}
	if got := s.metric(t, `sluice_delay_requests_total{result="unheld"}`); got != fmt.Sprintf(`sluice_delay_requests_total{result="unheld"} %d`, n-4) {
		t.Fatalf("unheld metric: %q", got)
	}
	close(release)
	for range 4 {
		if h := <-statuses; h.status != 200 || h.delay == "" {
			t.Fatalf("held answer: %+v", h)
		}
	}
	if peak.Load() > 4 {
		t.Fatalf("%d held at once, bound 4", peak.Load())
	}
	if got := s.metric(t, `sluice_delay_requests_total{result="held"}`); got != `sluice_delay_requests_total{result="held"} 4` {
		t.Fatalf("held metric: %q", got)
	}
	if got := s.metric(t, "sluice_delay_seconds_count"); got != "sluice_delay_seconds_count 4" {
		t.Fatalf("delay histogram: %q", got)
	}
}

// /v1/authz holds too, with the header, before answering the proxy.
func TestDelayModeAuthz(t *testing.T) {
	clk := clock.NewFake(storetest.T0)
	store, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	sleep, slept := recorder()
	s := startDelay(t, store, 4, sleep)
	for i := range 7 {
		resp, err := http.Get(s.url + "/v1/authz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := ""
		if i >= 5 {
			want = strconv.Itoa((i - 4) * 100)
		}
		if resp.StatusCode != 200 || resp.Header.Get(DelayHeader) != want {
			t.Fatalf("authz %d: %d, delay %q, want %q", i, resp.StatusCode, resp.Header.Get(DelayHeader), want)
		}
	}
	if got := slept(); len(got) != 2 || got[0] != 100*time.Millisecond || got[1] != 200*time.Millisecond {
		t.Fatalf("slept %v", got)
	}
}

// A runtime override of a delay-mode policy keeps its delay threshold: the
// override's burst is NGINX's, its first delay requests pass at once.
func TestDelayModeRuntimeOverride(t *testing.T) {
	clk := clock.NewFake(storetest.T0)
	store, err := memstore.New(memstore.Options{Clock: clk, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	sleep, slept := recorder()
	s := startDelay(t, store, 100, sleep)
	req, _ := http.NewRequest("PUT", s.url+"/v1/overrides", strings.NewReader(`{"identity":"vip","policy":"nginx","limit":"20/s burst 30"}`))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 && resp.StatusCode != 201 {
		t.Fatalf("PUT override: %d", resp.StatusCode)
	}
	var now, late, denied int
	for range 40 {
		h, err := s.post(context.Background(), `{"policy":"nginx","key":"vip"}`)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case h.status == 429:
			denied++
		case h.delay == "":
			now++
		default:
			late++
		}
	}
	// NGINX's rate=20r/s burst=30 delay=5: 6 at once, 25 held 50ms apart,
	// 9 denied.
	if now != 6 || late != 25 || denied != 9 {
		t.Fatalf("%d at once, %d held, %d denied; want 6, 25, 9", now, late, denied)
	}
	if d := slept(); d[len(d)-1] != 1250*time.Millisecond {
		t.Fatalf("longest delay %s, want 1.25s", d[len(d)-1])
	}
}

// A caller that hangs up while held, with Redis paused (SIGSTOP): its
// goroutine and waiting slot are given back while Redis is still paused
// (the refund is bounded by the store's timeout, not left waiting for
// Redis).
func TestDelayModeDisconnectRedisPaused(t *testing.T) {
	srv := redistest.NewStandalone(t)
	store, err := redisstore.New(context.Background(), redisstore.Options{URL: srv.URL(), Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	sleeping := make(chan time.Duration, 10)
	s := startDelay(t, store, 4, func(ctx context.Context, d time.Duration) error {
		sleeping <- d
		<-ctx.Done()
		return ctx.Err()
	})
	body := fmt.Sprintf(`{"policy":"one","key":%q}`, redistest.Prefix(t))
	if h, err := s.post(context.Background(), body); err != nil || h.status != 200 || h.delay != "" {
		t.Fatalf("first: %+v %v", h, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.post(ctx, body)
		done <- err
	}()
	<-sleeping
	if n := s.srv.Waiting(); n != 1 {
		t.Fatalf("%d waiting, want 1", n)
	}
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Thaw() }()
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the cancelled request was answered")
	}
	if !redistest.PollUntil(time.Now().Add(10*time.Second), func() bool {
		return s.srv.Waiting() == 0 && strings.HasSuffix(s.metric(t, `sluice_delay_requests_total{result="abandoned"}`), " 1")
	}) {
		t.Fatalf("the held request was not let go while Redis is paused: %d waiting", s.srv.Waiting())
	}
}
