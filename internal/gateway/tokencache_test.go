package gateway

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/aitoken"
	"github.com/sluice-io/sluice/internal/fakeopenai"
)

// TestConversationCountedOnce: a conversation resent with one more message
// each turn (as chat clients do) is reserved exactly as counting it afresh
// would reserve it, and its earlier large messages are counted from the
// gateway's token cache instead of being tokenized again.
func TestConversationCountedOnce(t *testing.T) {
	e := newEnv(t, Limits{RPM: 1000, TPM: 10_000_000}, fakeopenai.Options{CompletionTokens: 3})
	var conv []map[string]string
	for turn := range 4 {
		conv = append(conv, map[string]string{"role": "user", "content": strings.Repeat("Why do leases bound admissions? ", 30) + string(rune('a'+turn))})
		body, err := json.Marshal(map[string]any{"model": "gpt-4o", "max_tokens": 10, "messages": conv})
		if err != nil {
			t.Fatal(err)
		}
		res := e.post(context.Background(), "/v1/chat/completions", clientKey, string(body))
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("turn %d: status %d", turn, res.StatusCode)
		}
		s := e.settle()
		var r aitoken.Request
		for _, m := range conv {
			b, _ := json.Marshal(m)
			r.Messages = append(r.Messages, b)
		}
		if want := aitoken.ForModel("gpt-4o").PromptTokens(&r) + 10; s.Reserved != want {
			t.Fatalf("turn %d: reserved %d, want %d (counted afresh)", turn, s.Reserved, want)
		}
	}
	if h := e.gw.tokenCache.Hits(); h != 0+1+2+3 {
		t.Fatalf("%d messages counted from the cache, want 6", h)
	}
}
