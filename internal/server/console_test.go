package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/console"
	"github.com/sluice-io/sluice/internal/metrics"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/memstore"
)

const consoleConfig = testConfig + "console: {enabled: true, sample_interval: 100ms, top_sample: 1, public_read: true}\n"

// TestConsoleAPI: the console's JSON API on the memory store: config
// without secrets, the top list from denials (key names, never keys),
// look-up with the override in force, reset only with the admin token,
// bounded simulation.
func TestConsoleAPI(t *testing.T) {
	s := startService(t, svcOptions{config: consoleConfig})
	if a := s.do(t, "GET", "/ui/", ""); a.status != 200 || !strings.Contains(a.raw, "<title>sluice console</title>") || a.header.Get("Content-Security-Policy") == "" {
		t.Fatalf("page: %d %.200s", a.status, a.raw)
	} else {
		// The page sends the admin token to paths relative to itself: no
		// <base> may move them, no form may post elsewhere, no plugin run.
		csp := a.header.Get("Content-Security-Policy")
		for _, want := range []string{"base-uri 'none'", "form-action 'none'", "object-src 'none'", "frame-ancestors 'none'", "script-src 'self'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("Content-Security-Policy %q lacks %s", csp, want)
			}
		}
	}
	if a := s.do(t, "GET", "/ui/app.js", ""); a.status != 200 || !strings.Contains(a.raw, "textContent") {
		t.Fatalf("app.js: %d", a.status)
	}
	ov := s.do(t, "GET", "/ui/api/overview", "")
	if ov.status != 200 || ov.body["admin"] != false || !strings.Contains(ov.raw, `"demo-free"`) {
		t.Fatalf("overview: %d %s", ov.status, ov.raw)
	}
	if strings.Contains(ov.raw, "ba8510809b71") || strings.Contains(ov.raw, adminToken) {
		t.Fatalf("overview leaks a key hash or the token: %s", ov.raw)
	}
	if a := s.do(t, "GET", "/ui/api/overview", "", bearer...); a.body["admin"] != true {
		t.Fatalf("admin overview: %s", a.raw)
	}
	for range 12 {
		s.check(t, fmt.Sprintf(`{"api_key":%q}`, freeKey))
	}
	var top answer
	redistest.PollUntil(time.Now().Add(5*time.Second), func() bool {
		top = s.do(t, "GET", "/ui/api/top", "")
		return strings.Contains(top.raw, `"identity":"key_name:demo-free"`)
	})
	if !strings.Contains(top.raw, `"identity":"key_name:demo-free","policy":"free","denies":2`) || strings.Contains(top.raw, freeKey) {
		t.Fatalf("top: %s", top.raw)
	}
	if a := s.do(t, "PUT", "/v1/overrides", `{"identity":"key_name:demo-free","policy":"free","limit":"40/min"}`, bearer...); a.status != 201 {
		t.Fatal(a.raw)
	}
	id := s.do(t, "GET", "/ui/api/identity?id=key_name:demo-free", "")
	if id.status != 200 || !strings.Contains(id.raw, `"policy":"free","algorithm":"token_bucket","rate":40`) || !strings.Contains(id.raw, `"overridden":true`) || !strings.Contains(id.raw, `"limit":"40/min"`) {
		t.Fatalf("identity: %d %s", id.status, id.raw)
	}
	if a := s.do(t, "GET", "/ui/api/identity?id=key_name:nobody", ""); a.status != 400 {
		t.Fatalf("unknown key name: %d", a.status)
	}
	if a := s.do(t, "POST", "/ui/api/reset?id=key_name:demo-free", ""); a.status != 401 {
		t.Fatalf("reset without token: %d", a.status)
	}
	// Without its confirmation (the id again) a reset does nothing.
	for _, q := range []string{"", "&confirm=", "&confirm=key_name:demo-pro", "&confirm=key_name:demo-free&confirm=key_name:demo-free"} {
		if a := s.do(t, "POST", "/ui/api/reset?id=key_name:demo-free"+q, "", bearer...); a.status != 428 {
			t.Fatalf("reset with %q: %d %s", q, a.status, a.raw)
		}
	}
	if a := s.check(t, fmt.Sprintf(`{"api_key":%q}`, freeKey)); a.status != 429 {
		t.Fatalf("a reset without confirmation reset: %d %s", a.status, a.raw)
	}
	if a := s.do(t, "POST", "/ui/api/reset?id=key_name:demo-free&confirm=key_name:demo-free", "", bearer...); a.status != 200 {
		t.Fatalf("reset: %d %s", a.status, a.raw)
	}
	if a := s.check(t, fmt.Sprintf(`{"api_key":%q}`, freeKey)); a.num("remaining") != 39 {
		t.Fatalf("after reset: %s", a.raw)
	}
	sim := s.do(t, "POST", "/ui/api/simulate", `{"limit":"10/s","pattern":"steady","rps":20,"duration":"10s","algorithms":["gcra","fixed_window"]}`)
	if sim.status != 200 || !strings.Contains(sim.raw, `"totals":{"fixed_window":`) {
		t.Fatalf("simulate: %d %s", sim.status, sim.raw)
	}
	for _, bad := range []string{
		`{"limit":"10/s","pattern":"steady","rps":1e9,"duration":"10s","algorithms":["gcra"]}`,
		`{"limit":"10/s","pattern":"steady","rps":10,"duration":"1000h","algorithms":["gcra"]}`,
		`{"limit":"10/s","pattern":"steady","rps":10,"duration":"10s","algorithms":["concurrency"]}`,
		`{"limit":"10/s","pattern":"nope","rps":10,"duration":"10s","algorithms":["gcra"]}`,
		`{"limit":"10/s","pattern":"steady","rps":10,"duration":"10s","algorithms":[]}`,
	} {
		if a := s.do(t, "POST", "/ui/api/simulate", bad); a.status != 400 {
			t.Errorf("%s: %d %s", bad, a.status, a.raw)
		}
	}
	var ser answer
	redistest.PollUntil(time.Now().Add(5*time.Second), func() bool {
		ser = s.do(t, "GET", "/ui/api/series", "")
		return strings.Contains(ser.raw, `"policy":"free","tier":"free","points":[{`)
	})
	if !strings.Contains(ser.raw, `"policy":"free","tier":"free","points":[{`) {
		t.Fatalf("series: %s", ser.raw)
	}
}

// TestConsoleOff: without console.enabled, /ui serves no console, and
// says how to enable it rather than a bare 404: a browser (which sends
// Accept: text/html on a navigation) gets a short page with the setting
// and where to read more, under a CSP that runs nothing; an API client
// gets the JSON error with the same.
func TestConsoleOff(t *testing.T) {
	s := startService(t, svcOptions{})
	for _, path := range []string{"/ui", "/ui/", "/ui/index.html"} {
		a := s.do(t, "GET", path, "", "Accept", "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8")
		if a.status != 404 || a.header.Get("Content-Type") != "text/html; charset=utf-8" ||
			!strings.Contains(a.raw, "console:\n  enabled: true") || !strings.Contains(a.raw, "docs/API.md") ||
			!strings.HasPrefix(a.header.Get("Content-Security-Policy"), "default-src 'none'") {
			t.Fatalf("%s in a browser: %d %v %s", path, a.status, a.header, a.raw)
		}
	}
	for _, path := range []string{"/ui/", "/ui/api/overview"} {
		a := s.do(t, "GET", path, "")
		if a.status != 404 || !strings.Contains(a.raw, "console: {enabled: true}") || !strings.Contains(a.raw, "docs/API.md") {
			t.Fatalf("%s: %d %s", path, a.status, a.raw)
		}
	}
}

// TestConsoleSimulateOneAtATime: the simulator needs no token, so an
// instance runs one simulation at a time; a second caller meanwhile gets
// 429 with Retry-After, not a share of the CPU the decisions need.
func TestConsoleSimulateOneAtATime(t *testing.T) {
	cfg, err := config.Parse("console.yaml", []byte(consoleConfig))
	if err != nil {
		t.Fatal(err)
	}
	store, err := memstore.New(memstore.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	srv, err := New(Options{Store: store, Config: cfg, Metrics: metrics.New(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	const body = `{"limit":"10/s","pattern":"steady","rps":20,"duration":"10s","algorithms":["gcra"]}`
	simulate := func() *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/ui/api/simulate", strings.NewReader(body))
		r.Host = "127.0.0.1:8080" // httptest's example.com is no name sluice is known by
		srv.Handler().ServeHTTP(w, r)
		return w
	}
	srv.simulating <- struct{}{} // a simulation is running
	if w := simulate(); w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("while one runs: %d %q %s", w.Code, w.Header().Get("Retry-After"), w.Body)
	}
	<-srv.simulating
	for range 2 { // the slot is given back after each
		if w := simulate(); w.Code != http.StatusOK {
			t.Fatalf("alone: %d %s", w.Code, w.Body)
		}
	}
}

// TestConsoleTopReadsShared: GET /ui/api/top needs no token, so however
// many callers ask at once, an instance reads the fleet's top list from
// Redis at most once a flush interval (console.Top.Read): before, each
// call was a read of its own, whose cost on the shared Redis (up to 32 MB
// and 0.4 s when callers had filled the list) every caller could repeat.
func TestConsoleTopReadsShared(t *testing.T) {
	srv := redistest.NewStandalone(t)
	cfg := redisConfig(srv.URL(), "local") + "console: {enabled: true, sample_interval: 1s, top_sample: 1, public_read: true}\n"
	s := startService(t, svcOptions{redis: true, config: cfg})
	ctx := context.Background()
	reads := func() int64 {
		n, err := srv.CommandCalls(ctx, "zrange")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := reads()
	start := time.Now()
	const callers = 40
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			resp, err := http.Get(s.url + "/ui/api/top")
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("GET /ui/api/top: %d", resp.StatusCode)
			}
		})
	}
	wg.Wait()
	// One read is one ZRANGE per minute of the window; one read per flush
	// interval that the calls spanned, and one more for the edges.
	perRead := int64(console.Window / time.Minute)
	most := perRead * (2 + int64(time.Since(start)/console.FlushInterval))
	if got := reads() - before; got == 0 || got > most {
		t.Fatalf("%d calls at once: %d ZRANGE, want 1 to %d", callers, got, most)
	}
}

// TestKeyNamePrefixReserved: "key_name:NAME" is how the console and the
// overrides name a configured API key, so a check's key may not start
// with it. Before, a caller whose key was "key_name:demo-free" showed in
// the top list exactly as the API key demo-free does (its denials added
// to the key's), and the operator who looked it up from there to throttle
// or reset it acted on the customer's key instead, while no override
// could reach the caller's own bucket.
func TestKeyNamePrefixReserved(t *testing.T) {
	s := startService(t, svcOptions{config: consoleConfig})
	for _, req := range []struct{ method, path, body string }{
		{"POST", "/v1/check", `{"policy":"b","key":"key_name:demo-free"}`},
		{"POST", "/v1/check", `{"checks":[{"policy":"a","key":"tenant:x"},{"policy":"b","key":"key_name:x"}]}`},
		{"GET", "/v1/status?policy=b&key=key_name:demo-free", ""},
		// An API key's identity spells the key's bucket: the caller
		// would spend the key's limits.
		{"POST", "/v1/check", `{"policy":"b","key":"key:` + sluice.HashKey(freeKey) + `"}`},
		{"GET", "/v1/status?policy=b&key=key:" + sluice.HashKey(freeKey), ""},
	} {
		if a := s.do(t, req.method, req.path, req.body); a.status != 400 || !strings.Contains(a.raw, "names") {
			t.Errorf("%s %s %s: %d %s", req.method, req.path, req.body, a.status, a.raw)
		}
	}
	for _, ok := range []string{`{"policy":"b","key":"tenant:key_name:x"}`, `{"policy":"b","key":"key_names"}`, fmt.Sprintf(`{"api_key":%q}`, freeKey)} {
		if a := s.check(t, ok); a.status != 200 {
			t.Errorf("%s: %d %s", ok, a.status, a.raw)
		}
	}
}
