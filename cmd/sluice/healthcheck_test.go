package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestHealthcheck runs `sluice healthcheck` against a real `sluice serve`
// (the container HEALTHCHECK), and against answers it must reject.
func TestHealthcheck(t *testing.T) {
	base := startServe(t, "--config", "../../examples/sluice.yaml")
	if err := run(context.Background(), []string{"healthcheck", base + "/healthz"}, io.Discard, io.Discard); err != nil {
		t.Fatalf("healthcheck of a running serve: %v", err)
	}

	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer down.Close()
	for _, tc := range []struct{ name, url, want string }{
		{"503", down.URL + "/healthz", "503"},
		{"not http", "file:///etc/passwd", "not an http(s) URL"},
		{"no host", "http:///healthz", "not an http(s) URL"},
		{"password hidden", strings.Replace(down.URL, "http://", "http://user:secret@", 1) + "/x", "503"},
	} {
		err := run(context.Background(), []string{"healthcheck", tc.url}, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to mention %q", tc.name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: error shows the URL's password: %v", tc.name, err)
		}
	}
}
