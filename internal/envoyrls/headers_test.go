package envoyrls

import (
	"net/http"
	"reflect"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-io/sluice/internal/ratelimittest"
)

func headersOf(resp *rlsv3.RateLimitResponse) http.Header {
	h := http.Header{}
	for _, v := range resp.GetResponseHeadersToAdd() {
		h.Add(v.GetKey(), v.GetValue())
	}
	return h
}

// TestHeadersGolden holds the response headers Envoy adds to the header
// model of docs/API.md: one IETF item per enforced descriptor, rate and
// burst apart, for one descriptor and for several.
func TestHeadersGolden(t *testing.T) {
	e := newEnv(t, memStore, "testdata/config", func(o *Options) { o.ResponseHeaders = true })
	check := func(what string, resp *rlsv3.RateLimitResponse, want http.Header) {
		t.Helper()
		h := headersOf(resp)
		if !reflect.DeepEqual(h, want) {
			t.Errorf("%s:\n got %v\nwant %v", what, h, want)
		}
		ratelimittest.Check(t, h)
	}
	// tb is 10/s with a burst of 20.
	check("single", e.call("algos", desc("tb", "u")), http.Header{
		"Ratelimit-Policy":      {`"algos.tb";q=10;w=1;sluice-burst=20`},
		"Ratelimit":             {`"algos.tb";r=19;t=1`},
		"X-Ratelimit-Limit":     {"20"}, // the burst: Remaining never above Limit
		"X-Ratelimit-Remaining": {"19"},
		"X-Ratelimit-Reset":     {"1"},
	})
	// gcra (10/s, burst 10) denies the 11th request; tb has 10 left.
	for range 10 {
		e.call("algos", desc("tb", "m"), desc("gcra", "m"))
	}
	check("multi, denied", e.call("algos", desc("tb", "m"), desc("gcra", "m")), http.Header{
		"Ratelimit-Policy":      {`"algos.tb";q=10;w=1;sluice-burst=20, "algos.gcra";q=10;w=1;sluice-burst=10`},
		"Ratelimit":             {`"algos.gcra";r=0;t=1, "algos.tb";r=10;t=1`},
		"X-Ratelimit-Limit":     {"10"},
		"X-Ratelimit-Remaining": {"0"},
		"X-Ratelimit-Reset":     {"1"},
		"Retry-After":           {"1"},
	})
	// A descriptor repeated gets distinct names.
	check("repeated", e.call("algos", desc("tb", "r1"), desc("tb", "r2")), http.Header{
		"Ratelimit-Policy":      {`"algos.tb";q=10;w=1;sluice-burst=20, "algos.tb#2";q=10;w=1;sluice-burst=20`},
		"Ratelimit":             {`"algos.tb";r=19;t=1, "algos.tb#2";r=19;t=1`},
		"X-Ratelimit-Limit":     {"20"},
		"X-Ratelimit-Remaining": {"19"},
		"X-Ratelimit-Reset":     {"1"},
	})
}
