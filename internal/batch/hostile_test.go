package batch

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice/aiclient"
)

// TestHugeAnswerStaysResumable: an answer of 11 MiB of '<' (code, HTML:
// any text heavy in <, > and &) fits the client's 16 MiB response bound.
// Its record must be readable when the output is resumed: json.Marshal's
// HTML escaping wrote each '<' as 6 bytes, a 66 MiB line over the 64 MiB
// a resume reads, so every rerun refused the output.
func TestHugeAnswerStaysResumable(t *testing.T) {
	answer := strings.Repeat("<", 11<<20)
	body, err := json.Marshal(map[string]any{
		"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": answer}, "finish_reason": "stop"}},
		"usage":   map[string]any{"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
	})
	if err != nil {
		t.Fatal(err)
	}
	body = []byte(strings.ReplaceAll(string(body), `\u003c`, "<")) // as a server sends it
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	out := dir + "/out.jsonl"
	client := testClient(t, srv.URL, func(o *aiclient.Options) { o.AttemptTimeout = time.Minute })
	if sum := runBatch(t, context.Background(), Config{Input: openFile(t, writeInput(t, dir, "a", 2)), Output: out, Client: client, Model: "m"}); sum.OK != 2 {
		t.Fatalf("first run: %+v", sum)
	}
	first := calls.Load()
	sum, err := Run(context.Background(), Config{Input: openFile(t, writeInput(t, dir, "a", 2)), Output: out, Client: client, Model: "m"})
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	if sum.SkippedOK != 2 || calls.Load() != first {
		t.Fatalf("resume: summary %+v, upstream %d; want both skipped", sum, calls.Load())
	}
}
