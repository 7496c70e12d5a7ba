package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/gateway"
)

// The upstreams' provider keys: they must never reach the console.
const (
	eastUpstreamKey = "sk-up-east-secret-9f3a"
	westUpstreamKey = "sk-up-west-secret-71bc"
)

// poolService runs a service whose gateway: section has a pool of two
// upstreams, as `sluice serve` runs it (cmd/sluice's gatewayComponent: its
// headroom given to the console): east, whose provider allows 50 rpm of
// the 100 declared (learned from its headers), and west, whose provider
// answers every request 429 with Retry-After 120 (so it cools). One
// request by alice is sent first, to east, then one to west (failing over
// to east): the gateway's URL is returned once both were sent.
func poolService(t *testing.T) *svc {
	t.Helper()
	east := fakeopenai.New(t, fakeopenai.Options{APIKey: eastUpstreamKey, RPM: 50})
	west := fakeopenai.New(t, fakeopenai.Options{APIKey: westUpstreamKey, Default: fakeopenai.Fault{Status: 429, RetryAfter: "120"}})
	cfg := consoleConfig + fmt.Sprintf(`gateway:
  listen: 127.0.0.1:0
  upstreams:
    - {name: east, kind: openai, base_url: %s/v1, key_env: SLUICE_TEST_EAST_KEY, region: us-east, models: {gpt-test-e: {rpm: 100, tpm: 100000}}}
    - {name: west, kind: openai, base_url: %s/v1, key_env: SLUICE_TEST_WEST_KEY, models: {gpt-test-w: {rpm: 100}}}
  routes:
    gpt-test: [{upstream: east, model: gpt-test-e}, {upstream: west, model: gpt-test-w}]
    gpt-west: [{upstream: west, model: gpt-test-w}, {upstream: east, model: gpt-test-e}]
  tiers: {t: {rpm: 1000}}
  keys:
    - {name: alice, hash: %s, tier: t}
`, east.URL(), west.URL(), sluice.HashKey(aliceKey))
	keys := map[string]string{"SLUICE_TEST_EAST_KEY": eastUpstreamKey, "SLUICE_TEST_WEST_KEY": westUpstreamKey}
	addr := make(chan net.Addr, 1)
	s := startService(t, svcOptions{config: cfg, components: []ComponentFunc{func(d Deps) (Component, error) {
		gw, err := gateway.New(gateway.Options{Config: d.Config().File.Gateway, Store: d.Store, Logger: d.Logger, Getenv: func(k string) string { return keys[k] },
			Admin: d.IsAdmin})
		if err != nil {
			return nil, err
		}
		d.SetGatewayUpstreams(func(ctx context.Context) (any, error) { return gw.Upstreams(ctx) })
		return &gateway.Server{Gateway: gw, Addr: "127.0.0.1:0", OnListen: func(a net.Addr) { addr <- a }}, nil
	}}})
	var gw string
	select {
	case a := <-addr:
		gw = "http://" + a.String()
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway did not listen")
	}
	// gpt-test tries east first (both full, in config order); gpt-west
	// tries west, which answers 429: the request fails over to east.
	for _, model := range []string{"gpt-test", "gpt-west"} {
		req, _ := http.NewRequest("POST", gw+"/v1/chat/completions", strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}],"max_tokens":10}`))
		req.Header.Set("Authorization", "Bearer "+aliceKey)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("a request for %s through the gateway: %d", model, res.StatusCode)
		}
	}
	if west.Count() != 1 || len(east.Accepted()) != 2 {
		t.Fatalf("west got %d requests, east accepted %d; want 1 and 2", west.Count(), len(east.Accepted()))
	}
	s.gw = gw
	return s
}

// TestConsoleGatewayUpstreams: with a pooled gateway in the process, the
// console's upstreams view (admin token) lists each upstream model with
// its declared limits, those in force (east's rpm learned from its
// provider's headers), what the store and the provider have left, and
// whether it is up: west, which answered 429 with Retry-After 120, is
// cooling for about two minutes. No upstream key is in the answer.
func TestConsoleGatewayUpstreams(t *testing.T) {
	s := poolService(t)
	if a := s.do(t, "GET", "/ui/api/upstreams", ""); a.status != 401 {
		t.Fatalf("without the token: %d %s", a.status, a.raw)
	}
	a := s.do(t, "GET", "/ui/api/upstreams", "", bearer...)
	if a.status != 200 {
		t.Fatalf("upstreams: %d %s", a.status, a.raw)
	}
	for _, secret := range []string{eastUpstreamKey, westUpstreamKey, eastUpstreamKey[:12], "SLUICE_TEST_EAST_KEY"} {
		if strings.Contains(a.raw, secret) {
			t.Fatalf("the upstreams view shows %q: %s", secret, a.raw)
		}
	}
	var rep struct {
		Pool      bool
		Upstreams []struct {
			Upstream, Region, Model   string
			Declared, Limits          map[string]int64
			Remaining                 map[string]int64
			ProviderRemainingRequests int64 `json:"provider_remaining_requests"`
			Up                        bool
			CooldownUntil             *time.Time `json:"cooldown_until"`
		}
	}
	if err := json.Unmarshal([]byte(a.raw), &rep); err != nil || !rep.Pool || len(rep.Upstreams) != 2 {
		t.Fatalf("%v: %s", err, a.raw)
	}
	e, w := rep.Upstreams[0], rep.Upstreams[1]
	if e.Upstream != "east" || e.Region != "us-east" || e.Model != "gpt-test-e" || !e.Up || e.CooldownUntil != nil {
		t.Errorf("east: %+v", e)
	}
	if e.Declared["rpm"] != 100 || e.Declared["tpm"] != 100000 || e.Limits["rpm"] != 50 || e.Limits["tpm"] != 100000 {
		t.Errorf("east's limits: declared %v, in force %v; want rpm 50 learned of 100", e.Declared, e.Limits)
	}
	if e.ProviderRemainingRequests != 48 || e.Remaining["rpm"] < 46 || e.Remaining["rpm"] > 48 {
		t.Errorf("east's remaining: provider %d, store %v; want 48 and about 48", e.ProviderRemainingRequests, e.Remaining)
	}
	if w.Upstream != "west" || w.Up || w.CooldownUntil == nil {
		t.Fatalf("west, answering 429: %+v", w)
	}
	if left := time.Until(*w.CooldownUntil); left < 100*time.Second || left > 121*time.Second {
		t.Errorf("west cools for %v, want about 120s", left)
	}
	if w.Remaining["rpm"] != 0 {
		t.Errorf("west's store remaining %v, want rpm 0 while cooling", w.Remaining)
	}
}

// TestGatewayStatusTopologyAdminOnly: the gateway's GET /v1/status shows
// the pool's upstreams (names, limits, what is left) to the service's
// admin token (Deps.IsAdmin, as `sluice serve` wires it), and never to a
// client key, which sees its own limits only; a wrong token is 401.
func TestGatewayStatusTopologyAdminOnly(t *testing.T) {
	s := poolService(t)
	get := func(token string) (int, string) {
		req, _ := http.NewRequest("GET", s.gw+"/v1/status", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var b strings.Builder
		_, _ = io.Copy(&b, res.Body)
		return res.StatusCode, b.String()
	}
	status, body := get(aliceKey)
	if status != 200 || !strings.Contains(body, `"tier":"t"`) {
		t.Fatalf("alice's status: %d %s", status, body)
	}
	for _, topology := range []string{"upstreams", "east", "west", "gpt-test-e", "us-east"} {
		if strings.Contains(body, topology) {
			t.Fatalf("a client key's status shows %q: %s", topology, body)
		}
	}
	status, body = get(adminToken)
	var rep struct {
		Upstreams []struct{ Upstream, Model string }
	}
	if err := json.Unmarshal([]byte(body), &rep); status != 200 || err != nil || len(rep.Upstreams) != 2 || rep.Upstreams[0].Upstream != "east" {
		t.Fatalf("the admin's status: %d %v %s", status, err, body)
	}
	for _, secret := range []string{eastUpstreamKey, westUpstreamKey, "SLUICE_TEST_EAST_KEY"} {
		if strings.Contains(body, secret) {
			t.Fatalf("the admin's status shows %q", secret)
		}
	}
	// Last: a wrong token also starts its client's backoff, in which
	// even the right one is refused for a while.
	if status, body := get("not-" + adminToken); status != 401 || strings.Contains(body, "east") {
		t.Fatalf("a wrong token: %d %s", status, body)
	}
}

// TestConsoleUpstreamsWithoutGateway: without a gateway in the process
// the upstreams view answers 404, saying why.
func TestConsoleUpstreamsWithoutGateway(t *testing.T) {
	s := startService(t, svcOptions{config: consoleConfig})
	if a := s.do(t, "GET", "/ui/api/upstreams", "", bearer...); a.status != 404 || !strings.Contains(a.raw, "gateway") {
		t.Fatalf("%d %s", a.status, a.raw)
	}
}
