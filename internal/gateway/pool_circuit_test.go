package gateway

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/internal/upstream"
	"github.com/sluice-io/sluice/redisstore"
)

// TestPoolCircuitFleetWide: two gateway replicas on one real Redis, the
// first upstream of the route answering 503. After upstream.FailThreshold
// failures through replica A (on a route serving only the failing
// upstream, so that A keeps sending to it), replica B's first request goes
// to the healthy upstream without trying the failing one: the circuit is
// the fleet's, not A's.
func TestPoolCircuitFleetWide(t *testing.T) {
	url := redistest.Standalone(t).URL()
	bad := fakeopenai.New(t, fakeopenai.Options{Default: fakeopenai.Fault{Status: 503}})
	good := fakeopenai.New(t, fakeopenai.Options{})
	cfg := poolConfig(t, []*fakeopenai.Server{bad, good}, upstream.Limits{RPM: 1000})
	// Names of their own on the shared Redis.
	tag := strings.NewReplacer(":", "", "/", "", "{", "", "}", "").Replace(redistest.Prefix(t))
	tag = tag[max(len(tag)-20, 0):]
	for i := range cfg.Upstreams {
		old := cfg.Upstreams[i].Name
		cfg.Upstreams[i].Name = tag + "-" + old
		for j := range cfg.Routes["gpt-test"] {
			if cfg.Routes["gpt-test"][j].Upstream == old {
				cfg.Routes["gpt-test"][j].Upstream = cfg.Upstreams[i].Name
			}
		}
	}
	cfg.Keys[0].Client = tag + "c"
	cfg.Models = append(cfg.Models, "gpt-bad")
	cfg.Routes["gpt-bad"] = cfg.Routes["gpt-test"][:1]
	cfg.Routing.Policy = upstream.PolicyLatency // the route's order while no latency is known: the failing one first
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var srvs []string
	for range 2 {
		st, err := redisstore.New(context.Background(), redisstore.Options{URL: url, DisableDenyCache: true, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		_, srv := poolGateway(t, cfg, st, 0, nil)
		srvs = append(srvs, srv.URL)
	}
	badBody := strings.Replace(chatBody, `"model":"gpt-test"`, `"model":"gpt-bad"`, 1)
	if badBody == chatBody {
		t.Fatal("chatBody names no gpt-test")
	}
	for i := range upstream.FailThreshold {
		if status, _, body := postTo(t, srvs[0], badBody); status != 503 {
			t.Fatalf("A's request %d: %d %s", i, status, body)
		}
	}
	if n := bad.Count(); n != upstream.FailThreshold {
		t.Fatalf("failing upstream got %d requests, want %d", n, upstream.FailThreshold)
	}
	status, _, body := postTo(t, srvs[1], chatBody)
	if status != 200 {
		t.Fatalf("B: %d %s", status, body)
	}
	if n, g := bad.Count(), good.Count(); n != upstream.FailThreshold || g != 1 {
		t.Fatalf("after B's request: failing upstream got %d (want %d: B tried it), healthy %d", n, upstream.FailThreshold, g)
	}
}
