package gateway

import (
	"context"
	"encoding/json"
	"fmt"
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
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/memstore"
)

// qenv is a gateway with a queue and several keys, over real sockets.
type qenv struct {
	t   *testing.T
	up  *fakeopenai.Server
	gw  *Gateway
	srv *httptest.Server
	st  sluice.Store
	reg *prometheus.Registry
	cfg *Config
}

// newQueueEnv starts a gateway whose keys are "sk-<name>" for each tier
// name in keys (key name -> tier), with the tiers and queue given.
func newQueueEnv(t *testing.T, st sluice.Store, up *fakeopenai.Server, tiers map[string]TierConfig, keys map[string]string, q QueueConfig) *qenv {
	t.Helper()
	if up == nil {
		up = fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey})
	}
	if st == nil {
		ms, err := memstore.New(memstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ms.Close() })
		st = ms
	}
	cfg := &Config{
		Upstream: UpstreamConfig{BaseURL: up.URL() + "/v1", APIKeyEnv: "TEST_UPSTREAM_KEY"},
		Models:   []string{"gpt-test"},
		Store:    StoreConfig{Timeout: 5 * time.Second},
		Tiers:    tiers,
		Queue:    q,
		Prices:   map[string]PriceConfig{"gpt-test": {Input: "1", Output: "1"}}, // for budgets
	}
	for _, name := range sortedKeys(keys) {
		cfg.Keys = append(cfg.Keys, KeyConfig{Name: name, Hash: sluice.HashKey("sk-" + name), Tier: keys[name], Client: name})
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	gw, err := New(Options{
		Config: cfg, Store: st, Registerer: reg,
		Getenv: func(k string) string { return map[string]string{"TEST_UPSTREAM_KEY": upstreamKey}[k] },
	})
	if err != nil {
		t.Fatal(err)
	}
	e := &qenv{t: t, up: up, gw: gw, st: st, reg: reg, cfg: cfg}
	e.srv = httptest.NewServer(gw)
	t.Cleanup(func() {
		e.srv.Close()
		_ = gw.Close()
	})
	return e
}

// do sends a chat completion with key sk-<name> and returns the response
// with its body read.
func (e *qenv) do(ctx context.Context, name string, header http.Header) (*http.Response, string, error) {
	// The user field tells the upstream's records apart.
	body := strings.Replace(chatBody, `{"model"`, `{"user":"`+name+`","model"`, 1)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return nil, "", err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Authorization", "Bearer sk-"+name)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res, string(b), err
}

// waitFor polls cond until it holds, failing after 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !redistest.PollUntil(time.Now().Add(10*time.Second), cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// depth is the queue depth of class.
func (e *qenv) depth(class string) int64 { return e.gw.queue.fq.Depth(class) }

// holdCapacity takes the model's only concurrency slot with lease id, as
// a request in flight on another instance would.
func (e *qenv) holdCapacity(id string, op sluice.Op) {
	e.t.Helper()
	req := sluice.Request{Key: queueKeyPrefix + "gpt-test:pool:concurrency", Algorithm: sluice.Concurrency,
		Limit: sluice.Limit{Rate: 1, Period: e.cfg.LeaseTTL}, Cost: 1, Lease: id}
	d, err := e.st.Apply(context.Background(), op, req)
	if err != nil || !d.Allowed {
		e.t.Fatalf("%s capacity slot: %v %+v", op, err, d)
	}
}

var oneSlot = map[string]Limits{"gpt-test": {Concurrency: 1}}

// TestQueueWaitsForCapacity: a request over the model's capacity waits
// and is sent once a slot frees, with x-sluice-queued-ms; a request whose
// wait passes max_wait gets 429 with the time it waited.
func TestQueueWaitsForCapacity(t *testing.T) {
	e := newQueueEnv(t, nil, nil, map[string]TierConfig{"t": {RPM: 1000}}, map[string]string{"a": "t"},
		QueueConfig{MaxWait: 5 * time.Second, Capacity: oneSlot, Poll: time.Millisecond})
	e.holdCapacity("elsewhere", sluice.OpAllow)
	type answer struct {
		res  *http.Response
		body string
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		res, body, err := e.do(context.Background(), "a", nil)
		got <- answer{res, body, err}
	}()
	waitFor(t, "the request to queue", func() bool { return e.depth("default") == 1 })
	if e.up.Count() != 0 {
		t.Fatal("a queued request reached the upstream")
	}
	e.holdCapacity("elsewhere", sluice.OpRefund)
	a := <-got
	if a.err != nil || a.res.StatusCode != 200 {
		t.Fatalf("%v %v %s", a.err, a.res, a.body)
	}
	ms, err := strconv.Atoi(a.res.Header.Get("x-sluice-queued-ms"))
	if err != nil || ms < 0 {
		t.Fatalf("x-sluice-queued-ms %q", a.res.Header.Get("x-sluice-queued-ms"))
	}
	if n := testutil.ToFloat64(e.gw.queue.results.WithLabelValues("t", "default", "admitted")); n != 1 {
		t.Fatalf("admitted after waiting: %v", n)
	}
}

// TestQueueTimeout: a request still over capacity at max_wait gets 429.
func TestQueueTimeout(t *testing.T) {
	e := newQueueEnv(t, nil, nil, map[string]TierConfig{"t": {RPM: 1000}}, map[string]string{"a": "t"},
		QueueConfig{MaxWait: 50 * time.Millisecond, Capacity: oneSlot, Poll: time.Millisecond})
	e.holdCapacity("elsewhere", sluice.OpAllow)
	res, body, err := e.do(context.Background(), "a", nil)
	if err != nil || res.StatusCode != 429 || !strings.Contains(body, "shared capacity") {
		t.Fatalf("%v %v %s", err, res, body)
	}
	if ms, _ := strconv.Atoi(res.Header.Get("x-sluice-queued-ms")); ms < 50 {
		t.Fatalf("x-sluice-queued-ms %q, want >= 50", res.Header.Get("x-sluice-queued-ms"))
	}
	if res.Header.Get("Retry-After") != "1" || res.Header.Get("retry-after-ms") != "1000" || strings.Contains(body, "in 0s") {
		t.Fatalf("a concurrency slot's retry is a second: Retry-After %q, retry-after-ms %q, %s",
			res.Header.Get("Retry-After"), res.Header.Get("retry-after-ms"), body)
	}
	if n := testutil.ToFloat64(e.gw.queue.results.WithLabelValues("t", "default", "timeout")); n != 1 {
		t.Fatalf("timeouts: %v", n)
	}
	if e.up.Count() != 0 {
		t.Fatal("upstream reached")
	}
}

// TestQueueTimeoutUntried: a request queued behind another for the
// capacity and never tried before max_wait (the capacity is known busy
// until the next poll) still gets a retry time of a second, not "try again
// in 0s" with retry-after-ms 1.
func TestQueueTimeoutUntried(t *testing.T) {
	e := newQueueEnv(t, nil, nil, map[string]TierConfig{"t": {RPM: 1000}}, map[string]string{"a": "t", "b": "t"},
		QueueConfig{MaxWait: 200 * time.Millisecond, Capacity: oneSlot, Poll: time.Minute})
	e.holdCapacity("elsewhere", sluice.OpAllow)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := make(chan struct{})
	go func() {
		defer close(first)
		_, _, _ = e.do(ctx, "a", nil)
	}()
	waitFor(t, "a to queue", func() bool { return e.depth("default") == 1 })
	res, body, err := e.do(context.Background(), "b", nil)
	if err != nil || res.StatusCode != 429 || !strings.Contains(body, "shared capacity") {
		t.Fatalf("%v %v %s", err, res, body)
	}
	if res.Header.Get("Retry-After") != "1" || res.Header.Get("retry-after-ms") != "1000" || strings.Contains(body, "in 0s") {
		t.Fatalf("Retry-After %q, retry-after-ms %q, %s", res.Header.Get("Retry-After"), res.Header.Get("retry-after-ms"), body)
	}
	<-first
}

// TestQueueOwnLimit: a key over its own rpm waits until its next request
// is due, instead of a 429; with max_wait shorter than that, 429 at once.
func TestQueueOwnLimit(t *testing.T) {
	// One every 500ms: the next request arrives well before it is due
	// however slowly a loaded machine answers the last one.
	tiers := map[string]TierConfig{"t": {RPM: 120, RPMBurst: 1}}
	e := newQueueEnv(t, nil, nil, tiers, map[string]string{"a": "t"}, QueueConfig{MaxWait: 2 * time.Second})
	for i := range 3 {
		res, body, err := e.do(context.Background(), "a", nil)
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("request %d: %v %v %s", i, err, res, body)
		}
		if i > 0 && res.Header.Get("x-sluice-queued-ms") == "" {
			t.Fatalf("request %d was not queued", i)
		}
	}
	short := newQueueEnv(t, nil, nil, map[string]TierConfig{"t": {RPM: 1, RPD: 10}}, map[string]string{"a": "t"}, QueueConfig{MaxWait: 10 * time.Second})
	if res, _, _ := short.do(context.Background(), "a", nil); res.StatusCode != 200 {
		t.Fatal(res.Status)
	}
	start := time.Now()
	res, body, _ := short.do(context.Background(), "a", nil)
	if res.StatusCode != 429 || !strings.Contains(body, "requests per minute") || res.Header.Get("x-sluice-queued-ms") != "" {
		t.Fatalf("want an immediate 429 for the rpm limit: %v %s", res.Status, body)
	}
	if took := time.Since(start); took > 5*time.Second { // a wait is max_wait, 10s
		t.Fatalf("a hopeless request waited %s", took)
	}
}

// TestQueueSpentBudgetRefusedAtOnce: a request whose budget is spent is
// answered 429 insufficient_quota at once, not after waiting max_wait for
// the model's capacity (held elsewhere) and then told the capacity is
// busy; so is one queued behind another request for the capacity.
func TestQueueSpentBudgetRefusedAtOnce(t *testing.T) {
	tiers := map[string]TierConfig{"t": {RPM: 1000, Budgets: []BudgetConfig{{USD: "1", Per: "day"}}}}
	e := newQueueEnv(t, nil, nil, tiers, map[string]string{"a": "t", "b": "t"},
		QueueConfig{MaxWait: 2 * time.Second, Capacity: oneSlot, Poll: time.Millisecond})
	// Spend a's budget, as its earlier requests would have.
	lv := e.gw.keys[sluice.HashKey("sk-a")].levels
	for i, s := range lv.specs {
		if s.kind == kindBudget {
			req := sluice.Request{Key: lv.keys[i], Algorithm: s.alg, Limit: s.limit, Cost: s.limit.Rate}
			if _, err := e.st.Apply(context.Background(), sluice.OpCharge, req); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.holdCapacity("elsewhere", sluice.OpAllow)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiting := make(chan struct{})
	for _, behind := range []bool{false, true} {
		if behind {
			go func() { // b waits for the capacity, ahead of a
				defer close(waiting)
				_, _, _ = e.do(ctx, "b", nil)
			}()
			waitFor(t, "b to queue", func() bool { return e.depth("default") == 1 })
		}
		res, body, err := e.do(context.Background(), "a", nil)
		if err != nil || res.StatusCode != 429 || !strings.Contains(body, "insufficient_quota") || res.Header.Get("x-sluice-queued-ms") != "" {
			t.Fatalf("behind %v: want an immediate insufficient_quota: %v %v %s", behind, err, res, body)
		}
	}
	cancel()
	<-waiting
	if e.up.Count() != 0 {
		t.Fatal("upstream reached")
	}
}

// TestQueueFairTokensSettled: fair in tokens, a client's recent usage is
// what its requests used once they settle, not their reservation
// (max_tokens 50 reserved, 8 produced).
func TestQueueFairTokensSettled(t *testing.T) {
	e := newQueueEnv(t, nil, nil, map[string]TierConfig{"t": {RPM: 1000}}, map[string]string{"a": "t"},
		QueueConfig{MaxWait: time.Second, Fairness: "tokens", HalfLife: time.Hour}) // no decay to speak of
	res, body, err := e.do(context.Background(), "a", nil)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("%v %v %s", err, res, body)
	}
	var got struct {
		Usage struct {
			Total int `json:"total_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil || got.Usage.Total == 0 {
		t.Fatalf("usage: %v %s", err, body)
	}
	want := float64(got.Usage.Total)
	waitFor(t, "the usage to settle", func() bool {
		u := e.gw.queue.fq.RecentUsage("a")
		return u > want-0.01 && u < want+0.01
	})
}

// TestQueueDisconnect: a client that leaves while queued is taken out of
// the queue at once and never charged: the next request gets the slot.
func TestQueueDisconnect(t *testing.T) {
	e := newQueueEnv(t, nil, nil, map[string]TierConfig{"t": {RPM: 1000}}, map[string]string{"a": "t", "b": "t"},
		QueueConfig{MaxWait: 10 * time.Second, Capacity: oneSlot, Poll: time.Millisecond})
	e.holdCapacity("elsewhere", sluice.OpAllow)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, _, err := e.do(ctx, "a", nil)
		errc <- err
	}()
	waitFor(t, "a to queue", func() bool { return e.depth("default") == 1 })
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("canceled request answered")
	}
	waitFor(t, "a to leave the queue", func() bool { return e.depth("default") == 0 })
	e.holdCapacity("elsewhere", sluice.OpRefund)
	res, body, err := e.do(context.Background(), "b", nil)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("%v %v %s", err, res, body)
	}
	if e.up.Count() != 1 {
		t.Fatalf("upstream saw %d requests, want b's only", e.up.Count())
	}
	waitFor(t, "the canceled outcome", func() bool {
		return testutil.ToFloat64(e.gw.queue.results.WithLabelValues("t", "default", "canceled")) == 1
	})
}

// TestQueueFull: a key cannot hold more than max_per_key waiting requests;
// the next gets 429 queue_full at once.
func TestQueueFull(t *testing.T) {
	e := newQueueEnv(t, nil, nil, map[string]TierConfig{"t": {RPM: 1000}}, map[string]string{"a": "t"},
		QueueConfig{MaxWait: 10 * time.Second, Capacity: oneSlot, MaxPerKey: 2})
	e.holdCapacity("elsewhere", sluice.OpAllow)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, _ = e.do(ctx, "a", nil)
		}()
	}
	waitFor(t, "two queued", func() bool { return e.depth("default") == 2 })
	res, body, err := e.do(context.Background(), "a", nil)
	if err != nil || res.StatusCode != 429 || !strings.Contains(body, `"queue_full"`) || res.Header.Get("Retry-After") != "1" {
		t.Fatalf("%v %v %s", err, res, body)
	}
	cancel()
	wg.Wait()
}

// TestQueueFullBytes: waiting bodies are bounded in bytes too, so large
// bodies cannot fill memory within the count bounds.
func TestQueueFullBytes(t *testing.T) {
	e := newQueueEnv(t, nil, nil, map[string]TierConfig{"t": {RPM: 1000}}, map[string]string{"a": "t"},
		QueueConfig{MaxWait: 10 * time.Second, Capacity: oneSlot, MaxBytes: int64(len(chatBody)) - 1})
	e.holdCapacity("elsewhere", sluice.OpAllow)
	res, body, err := e.do(context.Background(), "a", nil)
	if err != nil || res.StatusCode != 429 || !strings.Contains(body, `"queue_full"`) {
		t.Fatalf("%v %v %s", err, res, body)
	}
}

// TestQueueShutdown: requests still waiting when the gateway closes are
// answered 503, not left without an answer.
func TestQueueShutdown(t *testing.T) {
	e := newQueueEnv(t, nil, nil, map[string]TierConfig{"t": {RPM: 1000}}, map[string]string{"a": "t"},
		QueueConfig{MaxWait: time.Minute, Capacity: oneSlot})
	e.holdCapacity("elsewhere", sluice.OpAllow)
	type answer struct {
		res  *http.Response
		body string
	}
	got := make(chan answer, 1)
	go func() {
		res, body, err := e.do(context.Background(), "a", nil)
		if err != nil {
			t.Error(err)
		}
		got <- answer{res, body}
	}()
	waitFor(t, "the request to queue", func() bool { return e.depth("default") == 1 })
	if err := e.gw.Close(); err != nil {
		t.Fatal(err)
	}
	a := <-got
	if a.res == nil || a.res.StatusCode != 503 || !strings.Contains(a.body, "shutting_down") {
		t.Fatalf("%+v", a)
	}
}

// TestQueueServerShutdown: when the server stops, a request waiting in
// the queue is answered 503 at once, so that the HTTP drain ends without
// waiting max_wait (a minute here, beyond the shutdown timeout).
func TestQueueServerShutdown(t *testing.T) {
	e := newQueueEnv(t, nil, nil, map[string]TierConfig{"t": {RPM: 1000}}, map[string]string{"a": "t"},
		QueueConfig{MaxWait: time.Minute, Capacity: oneSlot})
	e.holdCapacity("elsewhere", sluice.OpAllow)
	addr := make(chan net.Addr, 1)
	srv := &Server{Gateway: e.gw, Addr: "127.0.0.1:0", ShutdownTimeout: 5 * time.Second, OnListen: func(a net.Addr) { addr <- a }}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(ctx) }()
	e.srv.URL = "http://" + (<-addr).String() // e.do goes through srv
	type answer struct {
		res  *http.Response
		body string
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		res, body, err := e.do(context.Background(), "a", nil)
		got <- answer{res, body, err}
	}()
	waitFor(t, "the request to queue", func() bool { return e.depth("default") == 1 })
	stop()
	a := <-got
	if a.err != nil || a.res.StatusCode != 503 || !strings.Contains(a.body, "shutting_down") {
		t.Fatalf("%v %v %s", a.err, a.res, a.body)
	}
	if err := <-ran; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}

// TestQueuePriorityNotForgeable: the class comes from the key's
// configuration only: a batch key sending priority headers still waits
// behind an interactive request that came later.
func TestQueuePriorityNotForgeable(t *testing.T) {
	tiers := map[string]TierConfig{"inter": {RPM: 1000, Class: "interactive"}, "bulk": {RPM: 1000, Class: "batch"}}
	e := newQueueEnv(t, nil, nil, tiers, map[string]string{"i": "inter", "b": "bulk"}, QueueConfig{
		MaxWait: 10 * time.Second, Capacity: oneSlot, Poll: time.Millisecond,
		Classes: map[string]ClassConfig{"interactive": {Priority: 10}, "batch": {Priority: 0}},
	})
	e.holdCapacity("elsewhere", sluice.OpAllow)
	forged := http.Header{
		"X-Sluice-Priority": {"interactive"}, "X-Sluice-Class": {"interactive"},
		"Priority": {"u=0"}, "X-Priority": {"1000"},
	}
	var wg sync.WaitGroup
	send := func(name string, h http.Header) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, body, err := e.do(context.Background(), name, h)
			if err != nil || res.StatusCode != 200 {
				t.Errorf("%s: %v %v %s", name, err, res, body)
			}
		}()
	}
	send("b", forged)
	waitFor(t, "b to queue", func() bool { return e.depth("batch") == 1 })
	send("i", nil)
	waitFor(t, "i to queue", func() bool { return e.depth("interactive") == 1 })
	// Free the slot once: the higher class takes it; b follows when i's
	// settlement frees the slot again.
	e.holdCapacity("elsewhere", sluice.OpRefund)
	wg.Wait()
	// One slot: the upstream's order is the order of admission.
	reqs := e.up.Requests()
	if len(reqs) != 2 || !strings.Contains(string(reqs[0].Body), `"user":"i"`) {
		t.Fatalf("b went first: %d requests, first %s", len(reqs), reqs[0].Body)
	}
	// b's wait is reported under its configured class, batch.
	if c := testutil.CollectAndCount(e.gw.queue.waited); c != 2 {
		t.Fatalf("%d wait series, want one per class", c)
	}
	if n := testutil.ToFloat64(e.gw.queue.results.WithLabelValues("bulk", "batch", "admitted")); n != 1 {
		t.Fatalf("batch admissions after waiting: %v", n)
	}
}

// TestQueueConfigInvalid: the queue's bounds and references are checked.
func TestQueueConfigInvalid(t *testing.T) {
	base := func() *Config {
		return &Config{
			Upstream: UpstreamConfig{BaseURL: "http://127.0.0.1:1/v1"},
			Tiers:    map[string]TierConfig{"t": {RPM: 10}},
			Keys:     []KeyConfig{{Name: "k", Hash: sluice.HashKey("sk-k"), Tier: "t"}},
		}
	}
	for _, tc := range []struct {
		want string
		edit func(c *Config)
	}{
		{"queue.max_wait", func(c *Config) { c.Queue.MaxWait = -time.Second }},
		{"queue.max_wait", func(c *Config) { c.Queue.MaxWait = time.Hour }},
		{"queue.max_per_key", func(c *Config) { c.Queue.MaxPerKey = -1 }},
		{"queue.max_total", func(c *Config) { c.Queue.MaxTotal = 1 << 30 }},
		{"queue.fairness", func(c *Config) { c.Queue.Fairness = "vibes" }},
		{"queue.classes", func(c *Config) {
			c.Queue.Classes = map[string]ClassConfig{"a": {Share: 80}, "b": {Share: 30}}
		}},
		{"queue.classes.a.share", func(c *Config) { c.Queue.Classes = map[string]ClassConfig{"a": {Share: 101}} }},
		{"queue.classes.a.priority", func(c *Config) { c.Queue.Classes = map[string]ClassConfig{"a": {Priority: 1 << 40}} }},
		{"tiers.t.class", func(c *Config) { c.Tiers["t"] = TierConfig{RPM: 10, Class: "gold"} }},
		{"keys[0].class", func(c *Config) { c.Keys[0].Class = "gold" }},
		{"keys[0].weight", func(c *Config) { c.Keys[0].Weight = -1 }},
		{"queue.capacity.gpt-x.rpm", func(c *Config) { c.Queue.Capacity = map[string]Limits{"gpt-x": {RPM: -5}} }},
		{"queue.capacity.gpt-x", func(c *Config) { c.Queue.Capacity = map[string]Limits{"gpt-x": {}} }},
		{"queue.capacity.bad model", func(c *Config) { c.Queue.Capacity = map[string]Limits{"bad model": {RPM: 5}} }},
	} {
		c := base()
		tc.edit(c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.want, err)
		}
	}
	if err := base().Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestQueueParse: the section decodes from YAML, strictly.
func TestQueueParse(t *testing.T) {
	doc := fmt.Sprintf(`
upstream: {base_url: "http://127.0.0.1:1/v1"}
tiers:
  pro: {rpm: 600, class: interactive, weight: 2}
  free: {rpm: 60}
keys:
  - {name: a, hash: %s, tier: pro}
  - {name: b, hash: %s, tier: free, class: interactive}
queue:
  max_wait: 2s
  max_per_key: 8
  fairness: tokens
  classes:
    interactive: {priority: 10, share: 70}
    batch: {priority: 0, share: 30}
  capacity:
    gpt-4o: {rpm: 1800, tpm: 300000, concurrency: 40}
`, sluice.HashKey("sk-a"), sluice.HashKey("sk-b"))
	c, err := Parse("gw.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if c.Queue.MaxWait != 2*time.Second || c.Queue.Classes["interactive"].Share != 70 || c.Tiers["pro"].Weight != 2 || c.Queue.MaxPerTier != DefaultQueueMaxPerTier {
		t.Fatalf("%+v", c.Queue)
	}
	if _, err := Parse("gw.yaml", []byte(strings.Replace(doc, "max_per_key", "max_per_kye", 1))); err == nil || !strings.Contains(err.Error(), "max_per_kye") {
		t.Fatalf("unknown field: %v", err)
	}
}

// TestQueueCapacitySettles: the model capacity's tokens are settled to the
// usage the upstream reported, like the key's own.
func TestQueueCapacitySettles(t *testing.T) {
	e := newQueueEnv(t, nil, nil, map[string]TierConfig{"t": {RPM: 1000}}, map[string]string{"a": "t"},
		// 1 token a minute refills: the bucket shows the charge exactly.
		QueueConfig{Capacity: map[string]Limits{"gpt-test": {TPM: 1, TPMBurst: 10000}}})
	res, body, err := e.do(context.Background(), "a", nil)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("%v %v %s", err, res, body)
	}
	var usage struct {
		Usage struct {
			Total int64 `json:"total_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(body), &usage); err != nil || usage.Usage.Total == 0 {
		t.Fatalf("usage: %v %s", err, body)
	}
	tpm := sluice.Request{Key: queueKeyPrefix + "gpt-test:pool:tpm", Algorithm: sluice.GCRA, Limit: sluice.Limit{Rate: 1, Period: time.Minute, Burst: 10000}}
	waitFor(t, "the capacity's tokens settled to usage", func() bool {
		d, err := e.st.Apply(context.Background(), sluice.OpPeek, tpm)
		return err == nil && d.Remaining == 10000-usage.Usage.Total
	})
}
