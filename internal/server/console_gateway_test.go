package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/console"
	"github.com/sluice-io/sluice/internal/fakeopenai"
)

const (
	carolKey = "sk-gw-carol-0003"
	daveKey  = "sk-gw-dave-0004"
)

// limitedGatewayConfig is a service with the console at its default top
// sampling (exact up to 100, then one in 16) and a gateway whose tier
// "small" allows 2 requests a minute: on the test's frozen clock (the
// memory store's fake clock) the third request of a key and every one
// after it is a 429. carol's key has a name; dave's has none, so the
// console names it by its client id.
func limitedGatewayConfig(upstream string) string {
	return testConfig + "console: {enabled: true, sample_interval: 100ms, public_read: true}\n" + limitedGateway(upstream)
}

// limitedGateway is limitedGatewayConfig's gateway: section.
func limitedGateway(upstream string) string {
	return fmt.Sprintf(`gateway:
  listen: 127.0.0.1:0
  upstream: {base_url: %s/v1, allow_no_key: true}
  tiers: {small: {rpm: 2}}
  keys:
    - {name: carol, hash: %s, tier: small}
    - {hash: %s, tier: small, client: dave-ci}
`, upstream, sluice.HashKey(carolKey), sluice.HashKey(daveKey))
}

// gatewayChat sends one chat completion with key and returns its status.
func gatewayChat(t *testing.T, gw, key string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", gw+"/v1/chat/completions", strings.NewReader(`{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`))
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// TestConsoleGatewayFeed: with a gateway in the process, its decisions
// reach the console as serve's do. Its 429s are in the top list under the
// key's name (gw_key:carol) or client id (gw_client:dave-ci), counted
// exactly (5 and 1, not a sample scaled by 16), under the limit that
// denied them (gateway:rpm); the fleet chart has the series
// gateway:requests for its tier with every decision and denial; a look-up
// of gw_key:carol peeks its tier's limits, its rpm spent. No answer holds
// a key or its hash.
func TestConsoleGatewayFeed(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	s, gw := gatewayServiceWith(t, svcOptions{config: limitedGatewayConfig(up.URL())})
	var codes []int
	for range 7 {
		codes = append(codes, gatewayChat(t, gw, carolKey))
	}
	for range 3 {
		codes = append(codes, gatewayChat(t, gw, daveKey))
	}
	if want := "[200 200 429 429 429 429 429 200 200 429]"; fmt.Sprint(codes) != want {
		t.Fatalf("gateway answers %v, want %s", codes, want)
	}

	// The top list: flushed once a second, read at most once a second.
	type hit struct {
		Identity string  `json:"identity"`
		Policy   string  `json:"policy"`
		Denies   float64 `json:"denies"`
		Sampled  bool    `json:"sampled"`
		RetryAt  int64   `json:"retry_at"`
	}
	var top struct {
		Top []hit `json:"top"`
	}
	var raw []string
	for deadline := time.Now().Add(10 * time.Second); ; {
		a := s.do(t, "GET", "/ui/api/top", "")
		raw = append(raw, a.raw)
		if err := json.Unmarshal([]byte(a.raw), &top); err != nil {
			t.Fatal(err)
		}
		if len(top.Top) == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // the flusher's next second
	}
	want := []hit{{"gw_key:carol", "gateway:rpm", 5, false, 0}, {"gw_client:dave-ci", "gateway:rpm", 1, false, 0}}
	if len(top.Top) != 2 {
		t.Fatalf("top: %+v, want %+v", top.Top, want)
	}
	for i := range want {
		got := top.Top[i]
		if got.RetryAt <= time.Now().Add(-time.Minute).UnixMilli() {
			t.Errorf("%s: passes again at %d, before its Retry-After", got.Identity, got.RetryAt)
		}
		got.RetryAt = 0
		if got != want[i] {
			t.Errorf("top[%d] = %+v, want %+v", i, got, want[i])
		}
	}

	// The fleet chart: every decision and denial of tier small.
	var fleet console.FleetChart
	for deadline := time.Now().Add(10 * time.Second); ; {
		a := s.do(t, "GET", "/ui/api/fleet?range=15m", "")
		raw = append(raw, a.raw)
		if err := json.Unmarshal([]byte(a.raw), &fleet); err != nil {
			t.Fatal(err)
		}
		c, x := chartSum(fleet, console.SeriesKey{Policy: GatewaySeries, Tier: "small"})
		if c == 10 && x == 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway's series: %v decisions, %v denials, want 10 and 6 (%+v)", c, x, fleet.Series)
		}
		time.Sleep(100 * time.Millisecond) // the next flush
	}

	// The look-up of carol: her tier's rpm, spent.
	a := s.do(t, "GET", "/ui/api/identity?id=gw_key:carol", "")
	raw = append(raw, a.raw)
	if a.status != 200 || !strings.Contains(a.raw, `"gateway":true`) {
		t.Fatalf("look-up: %d %s", a.status, a.raw)
	}
	var look struct {
		Policies []gatewayPeekJSON `json:"policies"`
	}
	if err := json.Unmarshal([]byte(a.raw), &look); err != nil {
		t.Fatal(err)
	}
	if len(look.Policies) != 1 || look.Policies[0].Policy != "gateway:rpm" || look.Policies[0].Remaining != "0" || look.Policies[0].Allowed || look.Policies[0].Limit != "2/min" {
		t.Fatalf("look-up rows: %+v", look.Policies)
	}
	if a := s.do(t, "GET", "/ui/api/identity?id=gw_key:nobody", ""); a.status != 404 {
		t.Fatalf("unknown gateway key: %d %s", a.status, a.raw)
	}
	for _, r := range raw {
		for _, secret := range []string{carolKey, daveKey, sluice.HashKey(carolKey)[:16], sluice.HashKey(daveKey)[:16]} {
			if strings.Contains(r, secret) {
				t.Fatalf("an answer holds a key or its hash: %s", r)
			}
		}
	}
}

// chartSum adds up the decisions and denials of k over the chart.
func chartSum(ch console.FleetChart, k console.SeriesKey) (c, x float64) {
	for _, s := range ch.Series {
		if s.SeriesKey == k {
			for _, p := range s.Points {
				c += p.Decisions
				x += p.Denials
			}
		}
	}
	return c, x
}

// TestConsoleGatewaySpendChart: what the gateway's settled requests
// charged their budgets is charted as the series gateway:spend of the
// tier, in micro-dollars: after one request of alice's, the chart's sum is
// what the spend view says her key's budget spent.
func TestConsoleGatewaySpendChart(t *testing.T) {
	s, gw := gatewayService(t)
	if code := gatewayChat(t, gw, aliceKey); code != 200 {
		t.Fatalf("a request through the gateway: %d", code)
	}
	var micros float64
	for deadline := time.Now().Add(10 * time.Second); ; {
		var fleet console.FleetChart
		if err := json.Unmarshal([]byte(s.do(t, "GET", "/ui/api/fleet?range=15m", "").raw), &fleet); err != nil {
			t.Fatal(err)
		}
		if micros, _ = chartSum(fleet, console.SeriesKey{Policy: GatewaySpendSeries, Tier: "t"}); micros > 0 {
			break
		}
		if time.Now().After(deadline) {
			var keys []console.SeriesKey
			for _, ser := range fleet.Series {
				keys = append(keys, ser.SeriesKey)
			}
			t.Fatalf("no spend charted; series %v", keys)
		}
		time.Sleep(100 * time.Millisecond) // the next flush
	}
	var spent string
	for _, r := range spendRows(t, s) {
		if rest, ok := strings.CutPrefix(r, "key alice: "); ok {
			spent, _, _ = strings.Cut(rest, " ")
		}
	}
	if want := fmt.Sprintf("%.6f", micros/1e6); spent != want {
		t.Fatalf("charted $%s, the spend view says alice spent $%s", want, spent)
	}
}
