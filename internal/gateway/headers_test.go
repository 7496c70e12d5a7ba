package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/ratelimittest"
)

var gatewayFields = []string{
	"Ratelimit-Policy", "Ratelimit", "Retry-After", "Retry-After-Ms",
	"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests",
	"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens",
}

func gatewayFieldsOf(h http.Header) http.Header {
	out := http.Header{}
	for _, k := range gatewayFields {
		if v, ok := h[k]; ok {
			out[k] = v
		}
	}
	return out
}

// TestHeadersGoldenSingleLimit: a tier with rpm 500 and a burst of 50
// advertises the rate, 500, not the burst.
func TestHeadersGoldenSingleLimit(t *testing.T) {
	e := newEnv(t, Limits{RPM: 500, RPMBurst: 50}, fakeopenai.Options{})
	res := e.post(context.Background(), "/v1/chat/completions", clientKey, chatBody)
	e.settle()
	want := http.Header{
		"Ratelimit-Policy":               {`"rpm";q=500;w=60;sluice-burst=50`},
		"Ratelimit":                      {`"rpm";r=49;t=1`},
		"X-Ratelimit-Limit-Requests":     {"500"},
		"X-Ratelimit-Remaining-Requests": {"49"},
		"X-Ratelimit-Reset-Requests":     {"120ms"},
	}
	if got := gatewayFieldsOf(res.Header); res.StatusCode != 200 || !reflect.DeepEqual(got, want) {
		t.Fatalf("status %d\n got %v\nwant %v", res.StatusCode, got, want)
	}
	ratelimittest.Check(t, res.Header)
}

// TestHeadersGoldenMultiLimit is issue 12's case: rpm spent, rpd and tpm
// not. Every x-ratelimit-*-requests value comes from rpm (never rpd's
// reset), the token triple from tpm, and RateLimit lists rpm first.
func TestHeadersGoldenMultiLimit(t *testing.T) {
	e := newEnv(t, Limits{RPM: 20, RPMBurst: 5, RPD: 1000, TPM: 10000, TPMBurst: 2000}, fakeopenai.Options{})
	var used int64
	for i := range 5 {
		res := e.post(context.Background(), "/v1/chat/completions", clientKey, chatBody)
		if res.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, res.StatusCode)
		}
		ratelimittest.Check(t, res.Header)
		used += e.settle().Actual
	}
	res := e.post(context.Background(), "/v1/chat/completions", clientKey, chatBody)
	tokMs := used * 6 // tpm 10000/min: 6ms a token to refill
	want := http.Header{
		"Ratelimit-Policy": {`"rpm";q=20;w=60;sluice-burst=5, "rpd";q=1000;w=86400;sluice-burst=1000, "tpm";q=10000;sluice-qu="tokens";w=60;sluice-burst=2000`},
		"Ratelimit":        {fmt.Sprintf(`"rpm";r=0;t=3, "tpm";r=%d;t=1, "rpd";r=995;t=87`, 2000-used)},
		"Retry-After":      {"3"},
		"Retry-After-Ms":   {"3000"},
		// rpm: 20 a minute, none left, full again in 5 × 3s.
		"X-Ratelimit-Limit-Requests":     {"20"},
		"X-Ratelimit-Remaining-Requests": {"0"},
		"X-Ratelimit-Reset-Requests":     {"15s"},
		"X-Ratelimit-Limit-Tokens":       {"10000"},
		"X-Ratelimit-Remaining-Tokens":   {fmt.Sprint(2000 - used)},
		"X-Ratelimit-Reset-Tokens":       {(time.Duration(tokMs) * time.Millisecond).String()},
	}
	if got := gatewayFieldsOf(res.Header); res.StatusCode != 429 || !reflect.DeepEqual(got, want) {
		t.Fatalf("status %d\n got %v\nwant %v", res.StatusCode, got, want)
	}
	ratelimittest.Check(t, res.Header)
}

// TestHeadersConcurrencyAndModels: a concurrency limit is published with
// the draft's concurrent-requests unit and no window, and a model's own
// limits are named after it.
func TestHeadersConcurrencyAndModels(t *testing.T) {
	l := Limits{RPM: 60, Concurrency: 2}
	e := newEnv(t, l, fakeopenai.Options{})
	tc := e.cfg.Tiers["t"]
	tc.Models = map[string]Limits{"gpt-test": {TPM: 1000}}
	e.cfg.Tiers["t"] = tc
	gw, err := New(Options{Config: e.cfg, Store: e.store, Getenv: func(string) string { return upstreamKey }, OnSettled: func(s Settlement) { e.settled <- s }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	e.srv = srv
	res := e.post(context.Background(), "/v1/chat/completions", clientKey, chatBody)
	e.settle()
	p, lim := ratelimittest.Check(t, res.Header)
	if len(p) != 3 || p[0].Name != "rpm" || p[1].Name != "concurrency" || p[1].QU != "concurrent-requests" || p[1].W != 0 ||
		p[2].Name != "tpm:gpt-test" || p[2].Unit != "tokens" || len(lim) != 3 {
		t.Fatalf("policies %+v limits %+v", p, lim)
	}
	if res.Header.Get("x-ratelimit-limit-tokens") != "1000" || res.Header.Get("x-ratelimit-limit-requests") != "60" {
		t.Fatalf("headers %v", res.Header)
	}
}
