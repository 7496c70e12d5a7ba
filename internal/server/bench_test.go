package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/metrics"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/memstore"
)

// benchConfig has one policy large enough that decisions are admissions.
const benchConfig = `
policies:
  bench: {algorithm: gcra, limit: 1000000/s}
`

// benchConns is the number of concurrent clients, as `sluice loadtest -c 64`.
const benchConns = 64

// BenchmarkDecision compares, in one run, a decision made in-process on a
// store with the same decision through the HTTP API (/v1/check over a real
// socket, 64 keep-alive connections), on the memory store and on Redis.
// ns/op is per decision across all goroutines, so decisions/s = 1e9/ns.
func BenchmarkDecision(b *testing.B) {
	for _, backend := range []string{"memory", "redis"} {
		b.Run(backend, func(b *testing.B) {
			store, closer := benchStore(b, backend)
			defer closer.Close()
			p := &config.Policy{Name: "bench", Algorithm: sluice.GCRA, Limit: sluice.PerSecond(1000000)}
			b.Run("store", func(b *testing.B) {
				var n atomic.Uint64
				b.ReportAllocs()
				b.SetParallelism(benchConns / max(1, runtimeProcs()))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						k := "user-" + strconv.FormatUint(n.Add(1)%10000, 10)
						req := sluice.Request{Key: storeKey(k, p), Algorithm: p.Algorithm, Limit: p.Limit, Cost: 1}
						if _, err := store.ApplyAll(context.Background(), sluice.OpAllow, []sluice.Request{req}); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
			b.Run("http", func(b *testing.B) {
				url := benchServer(b, store)
				tr := &http.Transport{MaxIdleConnsPerHost: benchConns, MaxConnsPerHost: benchConns}
				defer tr.CloseIdleConnections()
				client := &http.Client{Transport: tr}
				var n atomic.Uint64
				b.ReportAllocs()
				b.SetParallelism(benchConns / max(1, runtimeProcs()))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						body := `{"policy":"bench","key":"user-` + strconv.FormatUint(n.Add(1)%10000, 10) + `"}`
						resp, err := client.Post(url, "application/json", strings.NewReader(body))
						if err != nil {
							b.Error(err)
							return
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != 200 {
							b.Errorf("status %d", resp.StatusCode)
							return
						}
					}
				})
			})
		})
	}
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }

func benchStore(b *testing.B, backend string) (sluice.Store, io.Closer) {
	if backend == "memory" {
		s, err := memstore.New(memstore.Options{})
		if err != nil {
			b.Fatal(err)
		}
		return s, s
	}
	srv := redistest.Standalone(b)
	s, c, err := openRedis(context.Background(), config.StoreSection{URL: srv.URL(), FailurePolicy: config.FailOpen, Timeout: time.Second}, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	return s, c
}

func benchServer(b *testing.B, store sluice.Store) string {
	cfg, err := config.Parse("bench.yaml", []byte(benchConfig))
	if err != nil {
		b.Fatal(err)
	}
	srv, err := New(Options{Store: store, Config: cfg, Metrics: metrics.New(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Handler()}
	go func() { _ = hs.Serve(ln) }()
	b.Cleanup(func() { _ = hs.Close() })
	return "http://" + ln.Addr().String() + "/v1/check"
}

// BenchmarkHandlerCheck is the /v1/check handler alone, without sockets:
// decode, one memory-store call, encode.
func BenchmarkHandlerCheck(b *testing.B) {
	store, closer := benchStore(b, "memory")
	defer closer.Close()
	cfg, err := config.Parse("bench.yaml", []byte(benchConfig))
	if err != nil {
		b.Fatal(err)
	}
	srv, err := New(Options{Store: store, Config: cfg, Metrics: metrics.New(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	h := srv.Handler()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		w := &discardWriter{h: http.Header{}}
		for pb.Next() {
			req, _ := http.NewRequest("POST", "/v1/check", strings.NewReader(`{"policy":"bench","key":"user-1234"}`))
			clear(w.h)
			h.ServeHTTP(w, req)
			if w.code != 200 {
				b.Fatalf("status %d", w.code)
			}
		}
	})
}

type discardWriter struct {
	h    http.Header
	code int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(code int)        { w.code = code }

// BenchmarkHandlerAuthz is the /v1/authz handler alone, without sockets:
// "key" is an API key on its tier (the baseline); "routes" adds twenty
// routes matched against forwarded URI, method and host headers and a
// ?policy=, the work policy selection adds to a forward-auth request.
func BenchmarkHandlerAuthz(b *testing.B) {
	doc := `
policies:
  bench: {algorithm: gcra, limit: 1000000/s}
  extra: {algorithm: gcra, limit: 1000000/s}
tiers:
  t: {policies: [bench]}
keys:
  - {hash: ` + sluice.HashKey("bench-key") + `, tier: t}
authz:
  selectable_policies: [extra]
  routes:
`
	for i := range 20 {
		doc += "    - {path_prefix: /api/v" + strconv.Itoa(i) + "/items, methods: [POST], host: api.example.com, policies: [extra]}\n"
	}
	cfg, err := config.Parse("bench.yaml", []byte(doc))
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name, target string
		hdr          []string
	}{
		{"key", "/v1/authz", []string{"X-API-Key", "bench-key"}},
		{"routes", "/v1/authz?policy=extra", []string{"X-API-Key", "bench-key", "X-Forwarded-Uri", "/api/v19/items/42?x=1", "X-Forwarded-Method", "POST", "X-Forwarded-Host", "api.example.com"}},
	} {
		b.Run(c.name, func(b *testing.B) {
			store, closer := benchStore(b, "memory")
			defer closer.Close()
			srv, err := New(Options{Store: store, Config: cfg, Metrics: metrics.New(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			h := srv.Handler()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				w := &discardWriter{h: http.Header{}}
				for pb.Next() {
					req, _ := http.NewRequest("GET", c.target, nil)
					req.RemoteAddr = "127.0.0.1:1234"
					for i := 0; i+1 < len(c.hdr); i += 2 {
						req.Header.Add(c.hdr[i], c.hdr[i+1])
					}
					clear(w.h)
					h.ServeHTTP(w, req)
					if w.code != 200 {
						b.Fatalf("status %d", w.code)
					}
				}
			})
		})
	}
}
