package gateway

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/upstream"
)

// killable is a TCP front for a fake upstream that can be killed (its
// listener closed and its connections cut, so that a dial is refused, as
// for a provider's host that went away) and restarted on the same port.
type killable struct {
	t      *testing.T
	addr   string // 127.0.0.1:PORT, kept across restarts
	target string
	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]bool
}

func newKillable(t *testing.T, target string) *killable {
	k := &killable{t: t, addr: "127.0.0.1:0", target: target, conns: map[net.Conn]bool{}}
	k.start()
	t.Cleanup(k.kill)
	return k
}

// URL is the front's root.
func (k *killable) URL() string { return "http://" + k.addr }

func (k *killable) start() {
	ln, err := net.Listen("tcp", k.addr)
	if err != nil {
		k.t.Fatalf("restart on %s: %v", k.addr, err)
	}
	k.mu.Lock()
	k.ln, k.addr = ln, ln.Addr().String()
	k.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", k.target)
			if err != nil {
				_ = c.Close()
				continue
			}
			k.mu.Lock()
			k.conns[c], k.conns[up] = true, true
			k.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
			go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
		}
	}()
}

func (k *killable) kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ln != nil {
		_ = k.ln.Close()
		k.ln = nil
	}
	for c := range k.conns {
		_ = c.Close()
		delete(k.conns, c)
	}
}

// deadPool starts a gateway routing gpt-test to fronts[i] as up{i}, with
// limits l, probing an unreachable upstream from 20 to 80 ms apart.
func deadPool(t *testing.T, fronts []*killable, l upstream.Limits, deadline time.Duration) (*httptest.Server, *prometheus.Registry) {
	t.Helper()
	ls := make([]upstream.Limits, len(fronts))
	for i := range ls {
		ls[i] = l
	}
	return deadPoolLimits(t, fronts, ls, deadline, upstream.PolicyLatency) // up0 first while no latency is known
}

// deadPoolLimits is deadPool with limits ls[i] on up{i} and a policy.
func deadPoolLimits(t *testing.T, fronts []*killable, ls []upstream.Limits, deadline time.Duration, policy string) (*httptest.Server, *prometheus.Registry) {
	t.Helper()
	cfg := &Config{
		Models: []string{"gpt-test"},
		Store:  StoreConfig{Timeout: 5 * time.Second},
		Tiers:  map[string]TierConfig{"t": Tier(Limits{RPM: 1_000_000, TPM: 100_000_000})},
		Keys:   []KeyConfig{{Name: "test", Hash: sluice.HashKey(clientKey), Tier: "t"}},
		Routes: map[string][]upstream.Target{},
	}
	cfg.Routing.Policy = policy
	cfg.Routing.Deadline = deadline
	cfg.Routing.Margin = new(float64) // the exact limits
	for i, f := range fronts {
		name := "up" + strconv.Itoa(i)
		cfg.Upstreams = append(cfg.Upstreams, upstream.Def{Name: name, Kind: upstream.OpenAI, BaseURL: f.URL() + "/v1", KeyEnv: "KEY",
			Models: map[string]upstream.Limits{"gpt-test-" + strconv.Itoa(i): ls[i]}})
		cfg.Routes["gpt-test"] = append(cfg.Routes["gpt-test"], upstream.Target{Upstream: name, Model: "gpt-test-" + strconv.Itoa(i)})
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	gw, err := New(Options{Config: cfg, Store: memStore(t), Getenv: func(string) string { return upstreamKey }, Registerer: reg,
		ProbeMin: 20 * time.Millisecond, ProbeMax: 80 * time.Millisecond,
		Admin: func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer "+deadAdmin }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(func() { srv.Close(); _ = gw.Close() })
	return srv, reg
}

// TestPoolDeadUpstreamProbed: an upstream whose listener is closed is
// found by one client request, which fails over; after it no client
// request is sent there (one connection error in all), the gateway
// probes it with its own GET /v1/models and the upstream's key (OpenAI's
// cheapest read: https://platform.openai.com/docs/api-reference/models/list),
// and once it listens again the first thing it receives is a probe;
// then it is back in rotation.
func TestPoolDeadUpstreamProbed(t *testing.T) {
	a, b := fakeopenai.New(t, fakeopenai.Options{}), fakeopenai.New(t, fakeopenai.Options{})
	fa, fb := newKillable(t, strings.TrimPrefix(a.URL(), "http://")), newKillable(t, strings.TrimPrefix(b.URL(), "http://"))
	srv, reg := deadPool(t, []*killable{fa, fb}, upstream.Limits{RPM: 1000}, 5*time.Second)
	fa.kill()
	for i := range 20 {
		if status, _, body := postTo(t, srv.URL, chatBody); status != 200 {
			t.Fatalf("request %d: %d %s", i, status, body)
		}
	}
	if n := counter(t, reg, "sluice_gateway_upstream_requests_total", map[string]string{"upstream": "up0", "status": "error"}); n != 1 {
		t.Fatalf("%v client requests tried the dead upstream, want the 1 that found it", n)
	}
	if n := counter(t, reg, "sluice_gateway_upstream_unreachable_total", map[string]string{"upstream": "up0"}); n != 1 {
		t.Fatalf("unreachable %v times, want 1", n)
	}
	waitFor(t, "2 failed probes", func() bool {
		return counter(t, reg, "sluice_gateway_upstream_probes_total", map[string]string{"upstream": "up0", "result": "down"}) >= 2
	})
	if a.Count() != 0 {
		t.Fatalf("the dead upstream received %d requests", a.Count())
	}
	if s := deadStatus(t, srv.URL)[0]; s.Upstream != "up0" || s.Up || s.Unreachable == nil || s.Unreachable.Probes < 2 {
		t.Fatalf("the dead upstream's status: %+v %+v", s, s.Unreachable)
	}
	fa.start()
	waitFor(t, "a probe answered", func() bool {
		return counter(t, reg, "sluice_gateway_upstream_probes_total", map[string]string{"upstream": "up0", "result": "up"}) == 1
	})
	got := a.Requests()
	if len(got) == 0 || got[0].Method != "GET" || got[0].Path != "/v1/models" || got[0].Authorization != "Bearer "+upstreamKey {
		t.Fatalf("the restarted upstream first received %+v, want the probe GET /v1/models with its key", got)
	}
	for _, r := range got {
		if r.Method != "GET" {
			t.Fatalf("a client request (%s %s) reached the upstream before a probe was answered", r.Method, r.Path)
		}
	}
	// Back in rotation: client requests reach it again (once the
	// fleet-wide cooldown of the refused connection, 1 s, has lapsed).
	waitFor(t, "a client request at the revived upstream", func() bool {
		if status, _, body := postTo(t, srv.URL, chatBody); status != 200 {
			t.Fatalf("%d %s", status, body)
		}
		for _, r := range a.Requests() {
			if r.Method == "POST" {
				return true
			}
		}
		return false
	})
	if n := counter(t, reg, "sluice_gateway_upstream_failovers_total", nil); n != 1 {
		t.Fatalf("%v failovers, want the 1 of the request that found the upstream dead", n)
	}
	if s := deadStatus(t, srv.URL)[0]; s.Unreachable != nil {
		t.Fatalf("the revived upstream's status: %+v", s.Unreachable)
	}
}

const deadAdmin = "admin-of-the-dead-pool"

// deadStatus reads the pool's status with the admin token.
func deadStatus(t *testing.T, url string) []upstream.Status {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url+"/v1/status", nil)
	req.Header.Set("Authorization", "Bearer "+deadAdmin)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var st struct{ Upstreams []upstream.Status }
	if err := json.NewDecoder(res.Body).Decode(&st); err != nil || len(st.Upstreams) == 0 {
		t.Fatalf("status: %d %v", res.StatusCode, err)
	}
	return st.Upstreams
}

// TestPoolDeadUpstreamNoRoom429: one upstream dies with room left while
// the other is at its limit; at 3× the pooled capacity, the requests that
// find it dead, and all after, get sluice's 429 with a Retry-After (never
// 502 upstream_unreachable, which is for every upstream dead), and the
// live provider refuses nothing; with every upstream dead, 502.
func TestPoolDeadUpstreamNoRoom429(t *testing.T) {
	const rpmA, rpmB = 30, 2
	// The providers count as OpenAI does (fakeopenai limits.go).
	a, b := fakeopenai.New(t, fakeopenai.Options{RPM: rpmA}), fakeopenai.New(t, fakeopenai.Options{RPM: rpmB})
	fa, fb := newKillable(t, strings.TrimPrefix(a.URL(), "http://")), newKillable(t, strings.TrimPrefix(b.URL(), "http://"))
	srv, reg := deadPoolLimits(t, []*killable{fa, fb}, []upstream.Limits{{RPM: rpmA}, {RPM: rpmB}}, time.Second, upstream.PolicyCapacity)
	// Both alive: b fills up (the capacity policy spreads by headroom:
	// about one request in 16 goes to b), a keeps room.
	sent := 0
	for ; b.Count() < rpmB && sent < rpmA; sent++ {
		if status, _, body := postTo(t, srv.URL, chatBody); status != 200 {
			t.Fatalf("request %d: %d %s", sent, status, body)
		}
	}
	if b.Count() != rpmB || a.Count() >= rpmA {
		t.Fatalf("b got %d, want its %d; a %d, want some room left", b.Count(), rpmB, a.Count())
	}
	sentA := a.Count()
	fa.kill()
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	work := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				status, h, body := postTo(t, srv.URL, chatBody)
				if status == 429 {
					if ra, err := strconv.Atoi(h.Get("Retry-After")); err != nil || ra < 1 || h.Get("retry-after-ms") == "" || !strings.Contains(body, "rate_limit_exceeded") {
						t.Errorf("429 without a real Retry-After: %v %s", h, body)
					}
				}
				mu.Lock()
				statuses[status]++
				mu.Unlock()
			}
		}()
	}
	for i := range 3*(rpmA+rpmB) - sent {
		work <- i
	}
	close(work)
	wg.Wait()
	if statuses[429] != 3*(rpmA+rpmB)-sent {
		t.Fatalf("statuses %v, want only 429", statuses)
	}
	if n := counter(t, reg, "sluice_gateway_upstream_requests_total", map[string]string{"upstream": "up0", "status": "error"}); n < 1 {
		t.Fatalf("no request found up0 dead (%v): the failover's 429 was not exercised", n)
	}
	if b.Limited() != 0 || a.Count() != sentA || b.Count() != rpmB {
		t.Fatalf("the live provider refused %d and got %d; the dead one got %d more", b.Limited(), b.Count(), a.Count()-sentA)
	}
	// Every upstream dead (and with room): the first request finds both,
	// and then 502, not a 429 with a Retry-After nobody can keep.
	c, d := fakeopenai.New(t, fakeopenai.Options{}), fakeopenai.New(t, fakeopenai.Options{})
	fc, fd := newKillable(t, strings.TrimPrefix(c.URL(), "http://")), newKillable(t, strings.TrimPrefix(d.URL(), "http://"))
	srv, _ = deadPool(t, []*killable{fc, fd}, upstream.Limits{RPM: 100}, time.Second)
	fc.kill()
	fd.kill()
	for i := range 3 {
		status, _, body := postTo(t, srv.URL, chatBody)
		if status != 502 || !strings.Contains(body, "upstream_unreachable") {
			t.Fatalf("every upstream dead, request %d: %d %s", i, status, body)
		}
	}
}
