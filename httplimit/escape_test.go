package httplimit

import (
	"net/http/httptest"
	"testing"
)

// TestErrorBodyNotHTMLEscaped: the middleware's JSON error shows <, > and
// & as written, never as \u003c (issue 27), and goes with nosniff.
func TestErrorBodyNotHTMLEscaped(t *testing.T) {
	w := httptest.NewRecorder()
	writeError(w, 429, "rate_limited", "send X-API-Key: <key> & retry", 1000)
	if got, want := w.Body.String(), `{"error":"rate_limited","message":"send X-API-Key: <key> & retry","retry_after_ms":1000}`+"\n"; got != want {
		t.Errorf("body %s, want %s", got, want)
	}
	if w.Header().Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("no nosniff: %v", w.Header())
	}
}
