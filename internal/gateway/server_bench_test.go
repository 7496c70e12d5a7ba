package gateway

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// BenchmarkServerHandler is BenchmarkServeHTTP through the Server's
// handler: the Host check and the count of the generation a request is
// served by (reload.go) on top of the Gateway.
func BenchmarkServerHandler(b *testing.B) {
	o, keys := cpuBenchOptions(b)
	gw, err := New(o)
	if err != nil {
		b.Fatal(err)
	}
	defer gw.Close()
	h := (&Server{Gateway: gw, Addr: "127.0.0.1:8090"}).Handler()
	b.ReportAllocs()
	b.ResetTimer()
	var n atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		key := "Bearer " + keys[n.Add(1)%int64(len(keys))]
		for pb.Next() {
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(benchBody))
			req.Host = "127.0.0.1:8090"
			req.Header.Set("Authorization", key)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != 200 {
				b.Fatalf("status %d: %s", w.Code, w.Body)
			}
		}
	})
}
