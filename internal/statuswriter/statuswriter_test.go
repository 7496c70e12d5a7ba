package statuswriter_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluice-io/sluice/internal/statuswriter"
)

func TestStatus(t *testing.T) {
	cases := []struct {
		name  string
		write func(w http.ResponseWriter)
		want  int
	}{
		{"nothing", func(http.ResponseWriter) {}, 0},
		{"body only", func(w http.ResponseWriter) { _, _ = w.Write([]byte("x")) }, 200},
		{"429", func(w http.ResponseWriter) { w.WriteHeader(429) }, 429},
		{"second code ignored", func(w http.ResponseWriter) { w.WriteHeader(503); w.WriteHeader(200) }, 503},
		{"103 then 200", func(w http.ResponseWriter) { w.WriteHeader(103); w.WriteHeader(200) }, 200},
		{"flush first", func(w http.ResponseWriter) { w.(http.Flusher).Flush(); w.WriteHeader(500) }, 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			sw := statuswriter.New(rec)
			c.write(sw)
			if sw.Status() != c.want {
				t.Fatalf("Status() = %d, want %d", sw.Status(), c.want)
			}
		})
	}
}

// Flush reaches the underlying writer, directly and through
// http.ResponseController.
func TestFlushReachesWriter(t *testing.T) {
	rec := httptest.NewRecorder()
	sw := statuswriter.New(rec)
	if err := http.NewResponseController(sw).Flush(); err != nil || !rec.Flushed {
		t.Fatalf("ResponseController.Flush: %v, flushed %v", err, rec.Flushed)
	}
}
