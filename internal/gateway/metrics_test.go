package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/fakeopenai"
)

// TestSettleMetrics: every settled request counts once in its tier, model
// and status (the instruments of forTierModel for 200, the labelled
// vector for any other status), its tokens by kind, and its upstream and
// overhead times. The fake upstream answers the third request 429 as
// OpenAI does over its own RPM (fakeopenai limits.go).
func TestSettleMetrics(t *testing.T) {
	e := newEnv(t, Limits{RPM: 100, TPM: 1_000_000}, fakeopenai.Options{CompletionTokens: 5, PromptTokens: 7, RPM: 2})
	for range 3 {
		res := e.post(context.Background(), "/v1/chat/completions", clientKey, `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":16}`)
		_, _ = res.Body.Read(make([]byte, 1))
		<-e.settled
	}
	rec := httptest.NewRecorder()
	e.gw.Metrics().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{
		`sluice_gateway_requests_total{model="gpt-test",status="200",tier="t"} 2`,
		`sluice_gateway_requests_total{model="gpt-test",status="429",tier="t"} 1`,
		`sluice_gateway_tokens_total{kind="prompt",model="gpt-test",tier="t"} 14`,
		`sluice_gateway_tokens_total{kind="completion",model="gpt-test",tier="t"} 10`,
		`sluice_gateway_upstream_seconds_count{model="gpt-test",tier="t"} 3`,
		`sluice_gateway_overhead_seconds_count{model="gpt-test",tier="t"} 3`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(body, "sluice_gateway_"))
		}
	}
}

// grepLines returns the lines of s that start with prefix.
func grepLines(s, prefix string) string {
	var out []string
	for l := range strings.Lines(s) {
		if strings.HasPrefix(l, prefix) && !strings.Contains(l, "_bucket") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "")
}
