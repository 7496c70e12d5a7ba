package gateway

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/internal/upstream"
)

// TestPoolHostileClient: a hostile client sends, five at once every half
// period, a whitespace prompt ('hi' and 40,000 spaces: a few thousand
// tokens by the gateway's tokenizer, 10,000 by the provider's rate
// limiter), one of 20 high-detail images (85 tokens an image by the
// tokenizer, 765 by the provider) and three of 1,500 one-letter messages,
// beside a victim sending a small request 10 times a period. The
// provider counts as Azure says it estimates, from every character of
// the request (fakeopenai's CountBody): more than the pool's estimate,
// twice as much for the many messages, so some hostile requests are
// refused by the provider, each naming its count ("Requested N"); one of
// 5,000 messages, sent first, as larger than the whole limit ("Request
// too large"). Those
// refusals are the hostile client's: they correct the estimate (the
// learned ratio) and are answered to it, and never cool the upstream, so
// the victim gets at least 28 of its 30 through.
func TestPoolHostileClient(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{TPM: 40_000, RPM: 10_000, CountBody: true, CompletionTokens: 4, Period: fleetPeriod})
	cfg := poolConfig(t, []*fakeopenai.Server{up}, upstream.Limits{TPM: 40_000})
	cfg.Keys = append(cfg.Keys, KeyConfig{Name: "hostile", Hash: sluice.HashKey(clientKey2), Tier: "t"})
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	_, srv := poolGateway(t, cfg, memStore(t), fleetPeriod, reg)
	post := func(key, body string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	img := `{"type":"image_url","image_url":{"url":"` + fakeopenai.ImageDataURL(1024, 1024) + `","detail":"high"}}`
	hostile := []string{
		`{"model":"gpt-test","max_tokens":10,"messages":[{"role":"user","content":"hi` + strings.Repeat(" ", 40_000) + `"}]}`,
		`{"model":"gpt-test","max_tokens":10,"messages":[{"role":"user","content":[{"type":"text","text":"look"}` + strings.Repeat(","+img, 20) + `]}]}`,
	}
	// 1,500 one-letter messages, three at once: the provider counts each
	// one's punctuation too, twice the pool's estimate.
	many := `{"model":"gpt-test","max_tokens":10,"messages":[` + strings.TrimSuffix(strings.Repeat(`{"role":"user","content":"a"},`, 1500), ",") + `]}`
	hostile = append(hostile, many, many, many)
	// And 5,000 of them, first: within the limit by the pool's estimate,
	// past it by the provider's count ("Request too large"), answered 400.
	huge := `{"model":"gpt-test","max_tokens":10,"messages":[` + strings.TrimSuffix(strings.Repeat(`{"role":"user","content":"a"},`, 5000), ",") + `]}`
	if s := post(clientKey2, huge); s != http.StatusBadRequest {
		t.Errorf("a request past the provider's limit by its count: %d, want 400", s)
	}
	var wg sync.WaitGroup
	var hostileStatuses sync.Map
	stop := make(chan struct{})
	wg.Go(func() {
		tick := time.NewTicker(fleetPeriod / 2)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for _, b := range hostile {
				wg.Go(func() {
					s := post(clientKey2, b)
					n, _ := hostileStatuses.LoadOrStore(s, new(atomic.Int64))
					n.(*atomic.Int64).Add(1)
				})
			}
		}
	})
	var victim atomic.Int64
	var vwg sync.WaitGroup
	tick := time.NewTicker(fleetPeriod / 10)
	for range 30 {
		<-tick.C
		vwg.Go(func() {
			if post(clientKey, chatBody) == 200 {
				victim.Add(1)
			}
		})
	}
	tick.Stop()
	vwg.Wait()
	close(stop)
	wg.Wait()
	var hs []string
	hostileStatuses.Range(func(k, v any) bool {
		hs = append(hs, fmt.Sprintf("%v:%d", k, v.(*atomic.Int64).Load()))
		return true
	})
	own := counter(t, reg, "sluice_gateway_upstream_request_refusals_total", nil)
	cool := counter(t, reg, "sluice_gateway_upstream_cooldowns_total", nil)
	t.Logf("victim %d/30; hostile statuses %v; provider 429s %d, of them the request's own %v; cooldowns %v", victim.Load(), hs, up.Limited(), own, cool)
	if victim.Load() < 28 {
		t.Errorf("the victim got %d of 30 through beside the hostile client", victim.Load())
	}
	// A 429 for the traffic as a whole (an image request refused while
	// the provider still counted an undercounted request the store had
	// not yet been told of) cools, briefly; those for the request's own
	// size never do.
	if own == 0 || cool > float64(up.Limited())-own {
		t.Errorf("%d provider 429s, %v attributed to the request's own size, %v cooldowns: want some attributed, and none of them cooling", up.Limited(), own, cool)
	}
}
