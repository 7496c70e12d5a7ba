package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/memstore"
)

// lockedBuffer is a log sink safe for concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestServerLogsEveryRequestAndSummary: at debug level the server logs one
// "gateway: request" line per request (streams included, which still
// flush), and on stop a summary with the counts; no line shows a key.
func TestServerLogsEveryRequestAndSummary(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: upstreamKey})
	st, err := memstore.New(memstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	cfg := &Config{
		Upstream: UpstreamConfig{BaseURL: up.URL() + "/v1", APIKeyEnv: "TEST_UPSTREAM_KEY"},
		Store:    StoreConfig{Timeout: 5 * time.Second},
		Tiers:    map[string]TierConfig{"t": Tier(Limits{RPM: 2})},
		Keys:     []KeyConfig{{Name: "test", Hash: sluice.HashKey(clientKey), Tier: "t"}},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	gw, err := New(Options{Config: cfg, Store: st,
		Getenv: func(k string) string { return map[string]string{"TEST_UPSTREAM_KEY": upstreamKey}[k] },
		Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	addr := make(chan net.Addr, 1)
	srv := &Server{Gateway: gw, Addr: "127.0.0.1:0", OnListen: func(a net.Addr) { addr <- a }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	base := "http://" + (<-addr).String()
	post := func(auth, body string) *http.Response {
		req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", auth)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	const chat = `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}],"max_tokens":5`
	statuses := []int{}
	for _, c := range []struct{ auth, body string }{
		{"Bearer " + clientKey, chat + "}"},
		{"Bearer " + clientKey, chat + `,"stream":true}`},
		{"Bearer sk-wrong", chat + "}"},
		{"Bearer " + clientKey, chat + "}"},
	} {
		res := post(c.auth, c.body)
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if strings.Contains(c.body, "stream") && !strings.Contains(string(body), "[DONE]") {
			t.Fatalf("stream body %q", body)
		}
		statuses = append(statuses, res.StatusCode)
	}
	if want := []int{200, 200, 401, 429}; !slices.Equal(statuses, want) {
		t.Fatalf("statuses %v, want %v", statuses, want)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var requests int
	var summary map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		switch line["msg"] {
		case "gateway: request":
			requests++
			if line["status"] == nil || line["duration"] == nil || line["path"] != "/v1/chat/completions" {
				t.Errorf("request line %v", line)
			}
		case "gateway: stopped":
			summary = line
		}
	}
	if requests != 4 {
		t.Errorf("%d request lines, want 4:\n%s", requests, logs.String())
	}
	want := map[string]float64{"requests": 4, "ok": 2, "rate_limited": 1, "client_errors": 1, "server_errors": 0}
	for k, v := range want {
		if summary[k] != v {
			t.Errorf("summary %s = %v, want %v (%v)", k, summary[k], v, summary)
		}
	}
	if strings.Contains(logs.String(), clientKey) || strings.Contains(logs.String(), upstreamKey) || strings.Contains(logs.String(), "sk-wrong") {
		t.Fatal("a key in the logs")
	}
}
