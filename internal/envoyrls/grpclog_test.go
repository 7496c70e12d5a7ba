package envoyrls

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

// TestGRPCLogger: grpc-go's lines come out of the configured slog handler,
// as JSON with the right level, filtered by its level.
func TestGRPCLogger(t *testing.T) {
	var buf bytes.Buffer
	lg := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	l := GRPCLogger(func() *slog.Logger { return lg })
	l.Infof("transport: %s", "hidden")
	l.Warningln("bad client", 1)
	l.Errorf("transport: %v", "closed")
	if l.V(0) || l.V(2) {
		t.Error("verbose logging on at warn level")
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines (info hidden), got:\n%s", buf.String())
	}
	for i, want := range []struct{ level, msg string }{{"WARN", "bad client 1"}, {"ERROR", "transport: closed"}} {
		var rec map[string]any
		if err := json.Unmarshal([]byte(lines[i]), &rec); err != nil {
			t.Fatalf("line %d is not JSON: %q", i, lines[i])
		}
		if rec["level"] != want.level || rec["msg"] != want.msg || rec["component"] != "grpc" {
			t.Errorf("line %d: %v, want %v", i, rec, want)
		}
	}
}
