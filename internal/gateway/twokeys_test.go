package gateway

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeanthropic"
)

// TestTwoValidKeysRefused: a request that carries two different valid
// client keys (Authorization: Bearer and x-api-key, or two Authorization
// lines) is refused with 400 before the upstream sees it: which client it
// is, and whose limits it spends, would depend on the header read. One
// valid key beside a wrong one, or the same key twice, is served.
func TestTwoValidKeysRefused(t *testing.T) {
	up := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey, InputTokens: 5, OutputTokens: 5})
	cfg := &Config{
		Upstream: UpstreamConfig{BaseURL: up.URL() + "/v1", API: APIAnthropic},
		Models:   []string{"claude-test"},
		Store:    StoreConfig{Timeout: 5 * time.Second},
		Tiers:    map[string]TierConfig{"t": Tier(Limits{RPM: 1000})},
		Keys: []KeyConfig{
			{Name: "one", Hash: sluice.HashKey(clientKey), Tier: "t"},
			{Name: "two", Hash: sluice.HashKey(clientKey2), Tier: "t"},
		},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	_, srv, _ := startGateway(t, cfg, fakeClockStore(t), func(k string) string { return map[string]string{DefaultAnthropicKeyEnv: upstreamKey}[k] }, nil)
	for _, c := range []struct {
		name   string
		hdr    []string
		status int
	}{
		{"bearer and a different valid x-api-key", []string{"Authorization", "Bearer " + clientKey, "X-Api-Key", clientKey2}, 400},
		{"x-api-key and a different valid bearer", []string{"X-Api-Key", clientKey, "Authorization", "bearer " + clientKey2}, 400},
		{"two Authorization lines", []string{"Authorization", "Bearer " + clientKey, "Authorization", "Bearer " + clientKey2}, 400},
		{"two x-api-key lines", []string{"X-Api-Key", clientKey2, "X-Api-Key", clientKey}, 400},
		{"the same key twice", []string{"Authorization", "Bearer " + clientKey, "X-Api-Key", " " + clientKey}, 200},
		{"a valid bearer beside a wrong x-api-key", []string{"Authorization", "Bearer " + clientKey, "X-Api-Key", "sk-wrong"}, 200},
		{"a wrong bearer beside a valid x-api-key", []string{"Authorization", "Bearer sk-wrong", "X-Api-Key", clientKey}, 401},
	} {
		before := up.Count()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/messages", strings.NewReader(messagesBody))
		req.Header.Set("anthropic-version", "2023-06-01")
		req.Header.Set("content-type", "application/json")
		for i := 0; i < len(c.hdr); i += 2 {
			req.Header.Add(c.hdr[i], c.hdr[i+1])
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != c.status {
			res.Body.Close()
			t.Fatalf("%s: status %d, want %d", c.name, res.StatusCode, c.status)
		}
		if c.status != 200 {
			if ae := decodeAnthError(t, res); c.status == 400 && !strings.Contains(ae.Error.Message, "send one key") {
				t.Errorf("%s: %+v", c.name, ae)
			}
			if up.Count() != before {
				t.Errorf("%s: the upstream saw the refused request", c.name)
			}
		}
		res.Body.Close()
	}
}
