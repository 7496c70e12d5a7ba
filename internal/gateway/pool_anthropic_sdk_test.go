package gateway

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeanthropic"
	"github.com/sluice-io/sluice/internal/upstream"
)

// TestPoolAnthropicSDK: the official Anthropic SDK, streaming and not,
// against a pool of two Anthropic upstreams; the first one tried answers
// 529 and the request fails over before the first byte, each upstream
// getting its own model id.
func TestPoolAnthropicSDK(t *testing.T) {
	a := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey, OutputTokens: 6})
	b := fakeanthropic.New(t, fakeanthropic.Options{APIKey: upstreamKey, OutputTokens: 6})
	cfg := &Config{
		Models: []string{"claude-test"},
		Store:  StoreConfig{Timeout: 5 * time.Second},
		Tiers:  map[string]TierConfig{"t": Tier(Limits{RPM: 1000, TPM: 1_000_000})},
		Keys:   []KeyConfig{{Name: "test", Hash: sluice.HashKey(clientKey), Tier: "t"}},
		Routes: map[string][]upstream.Target{},
	}
	for i, up := range []*fakeanthropic.Server{a, b} {
		name, model := fmt.Sprintf("ant%d", i), fmt.Sprintf("claude-test-%d", i)
		cfg.Upstreams = append(cfg.Upstreams, upstream.Def{Name: name, Kind: upstream.Anthropic, BaseURL: up.URL() + "/v1", KeyEnv: "KEY_" + name,
			Models: map[string]upstream.Limits{model: {RPM: 100, TPM: 100000}}})
		cfg.Routes["claude-test"] = append(cfg.Routes["claude-test"], upstream.Target{Upstream: name, Model: model})
	}
	cfg.Routing.Policy = upstream.PolicyLatency // ant0 first: no latency known, stable order
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	_, srv := poolGateway(t, cfg, memStore(t), 0, nil)
	client := anthropic.NewClient(option.WithBaseURL(srv.URL), option.WithAPIKey(clientKey), option.WithMaxRetries(0))
	ctx := context.Background()

	// The stream goes to ant0, which is overloaded, then to ant1.
	a.Enqueue(fakeanthropic.Fault{Status: 529})
	stream := client.Messages.NewStreaming(ctx, messageParams(20))
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acc.Content) != 1 || acc.Content[0].Text != strings.Repeat("tok ", 6) || acc.Usage.OutputTokens != 6 {
		t.Fatalf("stream %+v", acc)
	}
	if a.Count() != 1 || b.Count() != 1 {
		t.Fatalf("stream: ant0 got %d, ant1 %d", a.Count(), b.Count())
	}

	// ant0 failed on this replica: the JSON request goes to ant1 first,
	// which is overloaded now, then to ant0.
	b.Enqueue(fakeanthropic.Fault{Status: 529})
	msg, err := client.Messages.New(ctx, messageParams(20))
	if err != nil {
		t.Fatal(err)
	}
	if len(msg.Content) != 1 || msg.Content[0].Text != strings.Repeat("tok ", 6) || msg.Usage.OutputTokens != 6 {
		t.Fatalf("message %+v", msg)
	}
	if a.Count() != 2 || b.Count() != 2 {
		t.Fatalf("message: ant0 got %d, ant1 %d", a.Count(), b.Count())
	}
	for i, up := range []*fakeanthropic.Server{a, b} {
		for _, r := range up.Requests() {
			if want := fmt.Sprintf(`"model":"claude-test-%d"`, i); !strings.Contains(string(r.Body), want) || r.Header.Get("X-Api-Key") != upstreamKey {
				t.Fatalf("ant%d got %s with key %q", i, r.Body, r.Header.Get("X-Api-Key"))
			}
		}
	}
}
