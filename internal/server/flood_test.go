package server

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluice-io/sluice/internal/redistest"
)

// TestRedisFloodOneKey: 1,500 concurrent checks of one key on a healthy
// Redis with a 50 ms deadline, no over-limit cache and a limit of 2/min.
// Most miss the deadline, waiting for the key's slot or for Redis; under
// every failure policy they are denied, so no more than the limit (2) are
// admitted. Before, fail_open admitted up to 1,491 (every late call; and
// all of them once the late probes of the starved process had opened the
// circuit), and error answered 503, which a proxy that fails open admits.
func TestRedisFloodOneKey(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, policy := range []string{"fail_open", "error", "local"} {
		t.Run(policy, func(t *testing.T) {
			cfg := testConfig + fmt.Sprintf("store: {url: %q, failure_policy: %s, timeout: 50ms, local_cache: false}\n", srv.URL(), policy)
			s := startService(t, svcOptions{redis: true, config: cfg})
			body := fmt.Sprintf(`{"policy":"anon","key":%q}`, redistest.Prefix(t)) // 2/min: nothing comes back during the flood
			c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1500}}
			defer c.CloseIdleConnections()
			var admitted, unavailable, degraded atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for range 1500 {
				wg.Go(func() {
					<-start
					resp, err := c.Post(s.url+"/v1/check", "application/json", strings.NewReader(body))
					if err != nil {
						return
					}
					defer resp.Body.Close()
					switch resp.StatusCode {
					case http.StatusOK:
						admitted.Add(1)
					case http.StatusServiceUnavailable:
						unavailable.Add(1)
					}
					if resp.Header.Get("Sluice-Degraded") != "" {
						degraded.Add(1)
					}
				})
			}
			close(start)
			wg.Wait()
			t.Logf("admitted %d, 503 %d, degraded %d", admitted.Load(), unavailable.Load(), degraded.Load())
			if admitted.Load() > 2 || unavailable.Load() > 0 {
				t.Fatalf("a flood of one key: %d admitted (limit 2), %d answered 503", admitted.Load(), unavailable.Load())
			}
		})
	}
}
