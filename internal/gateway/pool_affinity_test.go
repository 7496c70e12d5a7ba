package gateway

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/upstream"
)

// TestPoolAffinity: a conversation's requests, named by X-Sluice-Affinity
// or by the body's prompt_cache_key, all go to one upstream of the pool
// (the one whose prompt cache holds their prefix); requests without
// either spread over the upstreams.
func TestPoolAffinity(t *testing.T) {
	ups := []*fakeopenai.Server{fakeopenai.New(t, fakeopenai.Options{}), fakeopenai.New(t, fakeopenai.Options{}), fakeopenai.New(t, fakeopenai.Options{})}
	_, srv := poolGateway(t, poolConfig(t, ups, upstream.Limits{RPM: 1000}), memStore(t), 0, nil)
	counts := func() []int { return []int{ups[0].Count(), ups[1].Count(), ups[2].Count()} }
	onOne := func(before, after []int, n int) bool {
		for i := range after {
			if d := after[i] - before[i]; d != 0 && d != n {
				return false
			}
		}
		return true
	}
	send := func(header, cacheKey string) {
		body := `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}`
		if cacheKey != "" {
			body = strings.Replace(body, `{"model"`, `{"prompt_cache_key":"`+cacheKey+`","model"`, 1)
		}
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+clientKey)
		if header != "" {
			req.Header.Set(AffinityHeader, header)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("status %d", res.StatusCode)
		}
	}
	for _, c := range []struct{ header, key string }{{"conversation-7", ""}, {"", "conversation-9"}} {
		before := counts()
		for range 6 {
			send(c.header, c.key)
		}
		if after := counts(); !onOne(before, after, 6) {
			t.Fatalf("header %q, prompt_cache_key %q: spread %v -> %v", c.header, c.key, before, after)
		}
	}
	// The capacity policy fills the emptiest first: 6 to even it, 6 more.
	before := counts()
	for range 12 {
		send("", "")
	}
	if after := counts(); onOne(before, after, 12) {
		t.Fatalf("no affinity, yet all on one upstream: %v -> %v", before, after)
	}
}
