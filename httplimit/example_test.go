package httplimit_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/httplimit"
	"github.com/sluice-io/sluice/memstore"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// Limit an API to 1 request per minute per API key.
func ExampleNew() {
	store, _ := memstore.New(memstore.Options{})
	defer store.Close()
	limiter, _ := sluice.NewLimiter(sluice.Options{Store: store, Limit: sluice.PerMinute(1)})
	limit, _ := httplimit.New(httplimit.Options{Limiter: limiter, Key: httplimit.ByHeader("X-API-Key")})
	api := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") }))

	for range 2 {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("X-API-Key", "k-123")
		api.ServeHTTP(rec, req)
		fmt.Printf("%d remaining=%s retry-after=%q\n", rec.Code, rec.Header().Get("X-RateLimit-Remaining"), rec.Header().Get("Retry-After"))
	}
	// Output:
	// 200 remaining=0 retry-after=""
	// 429 remaining=0 retry-after="60"
}
