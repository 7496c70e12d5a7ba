package gateway

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/upstream"
)

func TestLoadPool(t *testing.T) {
	c, err := Load("testdata/pool.yml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Routing.Policy != upstream.PolicyWeighted || c.Routing.MaxAttempts != upstream.DefaultMaxAttempts ||
		c.Upstreams[1].APIVersion != upstream.DefaultAzureAPIVersion || c.Upstreams[0].Weight != 1 || c.Routes["claude-sonnet-4-5"][0].Model != "claude-sonnet-4-5" {
		t.Fatalf("defaults not applied: %+v %+v", c.Routing, c.Upstreams)
	}
	env := map[string]string{"OPENAI_KEY_EAST": "sk-east"}
	err = CheckKeys(c, func(k string) string { return env[k] }, os.ReadFile)
	if !errors.Is(err, upstream.ErrNoKey) || !strings.Contains(err.Error(), "upstream claude") || !strings.Contains(err.Error(), "ANTHROPIC_KEY_A is empty") ||
		strings.Contains(err.Error(), "azure-west") || strings.Contains(err.Error(), "openai-east") {
		t.Fatalf("CheckKeys: %v", err)
	}
	env["ANTHROPIC_KEY_A"] = "sk-ant"
	if err := CheckKeys(c, func(k string) string { return env[k] }, os.ReadFile); err != nil {
		t.Fatal(err)
	}
	c.Upstreams[1].KeyFile = "testdata/missing.key"
	if err := CheckKeys(c, func(k string) string { return env[k] }, os.ReadFile); !errors.Is(err, upstream.ErrNoKey) || !strings.Contains(err.Error(), "upstream azure-west") {
		t.Fatalf("CheckKeys: %v", err)
	}
}

// TestLoadPoolBad: every problem of a pool config is named at its line.
func TestLoadPoolBad(t *testing.T) {
	_, err := Load("testdata/pool_bad.yml")
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("got %v", err)
	}
	msg := err.Error()
	for _, want := range []string{
		`3: upstreams[0].kind: unknown kind "openia"; valid: openai, anthropic, azure-openai, openai-compatible`,
		"upstreams[0].key_env: required",
		"6: upstreams[0].models.gpt-4o.rpm: -1 must be in",
		"7: upstreams[0].models.gpt-4o-mini: no route uses this model",
		"8: upstreams[0].pace: 50ms must be whole milliseconds from 100ms to 30s",
		`11: routes.gpt-4o[0].upstream: unknown upstream "west"; valid: east`,
		`12: routes.gpt-4o[1].model: upstream east declares no model "gpt-5"`,
		"routes: model o3 (named under tiers, models or queue.capacity) has no route",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("missing %q in:\n%s", want, msg)
		}
	}
}

// TestLoadPoolAzureBaseURL: an Azure OpenAI base_url copied from the
// portal's deployment URL, or ending in /openai, is refused with the
// endpoint to set instead: the gateway appends
// /openai/deployments/{deployment}/... itself (Azure OpenAI's REST
// reference: https://learn.microsoft.com/azure/ai-services/openai/reference),
// so either sends every request to a path that answers 404. A bad
// health_path is refused too.
func TestLoadPoolAzureBaseURL(t *testing.T) {
	_, err := Load("testdata/pool_azure_bad.yml")
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("got %v", err)
	}
	msg := err.Error()
	for _, want := range []string{
		`4: upstreams[0].base_url: "https://west.openai.azure.com/openai/deployments/gpt-4o/chat/completions" is a deployment URL: set the resource's endpoint, base_url: https://west.openai.azure.com (`,
		`9: upstreams[1].base_url: "https://east.openai.azure.com/openai/" ends in /openai: set the resource's endpoint, base_url: https://east.openai.azure.com (`,
		`14: upstreams[2].base_url: "https://apim.example.com/ai/openai" ends in /openai: set the resource's endpoint, base_url: https://apim.example.com/ai (`,
		`16: upstreams[2].health_path: "models?x=1" must be a path under base_url`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("missing %q in:\n%s", want, msg)
		}
	}
}
