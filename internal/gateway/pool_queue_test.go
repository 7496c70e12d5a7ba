package gateway

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/upstream"
)

// TestPoolWaitInQueueClasses: with a queue configured, a request waiting
// for upstream room waits in the fair queue's priority classes: a batch
// request that began waiting first is served after an interactive one
// that came later, when the upstream has room for one.
func TestPoolWaitInQueueClasses(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	cfg := poolConfig(t, []*fakeopenai.Server{up}, upstream.Limits{RPM: 1})
	cfg.Tiers = map[string]TierConfig{"inter": {RPM: 1000, TPM: 1_000_000, Class: "interactive"}, "bulk": {RPM: 1000, TPM: 1_000_000, Class: "batch"}}
	cfg.Keys = []KeyConfig{{Name: "i", Hash: sluice.HashKey("sk-inter-0001"), Tier: "inter"}, {Name: "b", Hash: sluice.HashKey("sk-bulk-0001"), Tier: "bulk"}}
	cfg.Queue = QueueConfig{MaxWait: 10 * time.Second, Poll: time.Millisecond,
		Classes: map[string]ClassConfig{"interactive": {Priority: 10}, "batch": {Priority: 0}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	const period = time.Second // one request per period: time enough for both to queue
	gw, srv := poolGateway(t, cfg, memStore(t), period, nil)
	post := func(key, who string) {
		body := strings.Replace(chatBody, "say something nice", who, 1)
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return
		}
		_ = res.Body.Close()
		if res.StatusCode != 200 {
			t.Errorf("%s: %d", who, res.StatusCode)
		}
	}
	post("sk-inter-0001", "first") // takes the room
	var wg sync.WaitGroup
	wg.Go(func() { post("sk-bulk-0001", "batch") })
	waitFor(t, "the batch request to wait", func() bool { return gw.queue.fq.Depth("batch") == 1 })
	wg.Go(func() { post("sk-inter-0001", "interactive") })
	waitFor(t, "the interactive request to wait", func() bool { return gw.queue.fq.Depth("interactive") == 1 })
	wg.Wait()
	var order []string
	for _, r := range up.Requests() {
		for _, who := range []string{"first", "batch", "interactive"} {
			if strings.Contains(string(r.Body), who+" about") {
				order = append(order, who)
			}
		}
	}
	if strings.Join(order, ",") != "first,interactive,batch" {
		t.Fatalf("upstream order %v, want the interactive request before the batch one", order)
	}
}
