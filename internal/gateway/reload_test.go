package gateway

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/memstore"
)

// gatedUpstream answers as cannedUpstream once gate is closed, and tells
// entered when a request reaches it: a request held in flight.
type gatedUpstream struct {
	entered chan struct{}
	gate    chan struct{}
	next    cannedUpstream
}

func (u gatedUpstream) RoundTrip(req *http.Request) (*http.Response, error) {
	u.entered <- struct{}{}
	<-u.gate
	return u.next.RoundTrip(req)
}

// TestSetGatewayDrains: a reload's new Gateway serves every request from
// SetGateway on (a key only it knows is admitted), while a request the
// old one admitted before finishes on it, whole; the old one is closed
// only after that request, never under it.
func TestSetGatewayDrains(t *testing.T) {
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	resp := []byte(`{"id":"x","object":"chat.completion","model":"gpt-test","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14}}`)
	build := func(key string, rt http.RoundTripper) *Gateway {
		cfg := &Config{
			Upstream: UpstreamConfig{BaseURL: "http://upstream.invalid/v1"},
			Models:   []string{"gpt-test"},
			Tiers:    map[string]TierConfig{"t": {RPM: 1000, TPM: 1 << 20}},
			Keys:     []KeyConfig{{Name: "k", Hash: sluice.HashKey(key), Tier: "t"}},
		}
		g, err := New(Options{Config: cfg, Store: st, Transport: rt})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	up := gatedUpstream{entered: make(chan struct{}, 1), gate: make(chan struct{}), next: cannedUpstream{body: resp}}
	old := build("sk-old-0001", up)
	srv := &Server{Gateway: old, Addr: "127.0.0.1:8090"}
	h := srv.Handler()
	do := func(key string) int {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(benchBody))
		req.Host = "127.0.0.1:8090"
		req.Header.Set("Authorization", "Bearer "+key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	held := make(chan int, 1)
	go func() { held <- do("sk-old-0001") }()
	<-up.entered // admitted by the old Gateway, at its upstream

	srv.SetGateway(build("sk-new-0001", cannedUpstream{body: resp}))
	if c := do("sk-new-0001"); c != http.StatusOK {
		t.Fatalf("the new Gateway's key: %d", c)
	}
	if c := do("sk-old-0001"); c != http.StatusUnauthorized {
		t.Fatalf("the old Gateway's key after the swap: %d, want 401", c)
	}
	select {
	case <-old.closing:
		t.Fatal("the old Gateway was closed under its request in flight")
	default:
	}
	close(up.gate)
	if c := <-held; c != http.StatusOK {
		t.Fatalf("the request in flight: %d", c)
	}
	select {
	case <-old.closing:
	case <-time.After(10 * time.Second):
		t.Fatal("the old Gateway was not closed after its last request")
	}
	srv.stop()
	srv.waitRetired()
	_ = srv.Current().Close()
}
