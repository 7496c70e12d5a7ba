package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/metrics"
	"github.com/sluice-io/sluice/internal/tracing"
)

// BenchmarkTracingOverhead measures, in one run, the CPU per /v1/check
// decision, as process CPU time (handler, decode, memory store, encode;
// one goroutine) with
// tracing off, the only per-request work tracing off adds to a build
// without it (tracing.Recording on a request context like net/http's: off,
// no handler or store wrapper is installed at all), and the decision with
// tracing on (every request sampled, batched to a discarding exporter).
// off-check reports its cost as %_of_decision, on its cost as x_off
// (times the decision with tracing off). Run the three in one process:
//
//	go test -run '^$' -bench TracingOverhead -benchtime 50000x ./internal/server
func BenchmarkTracingOverhead(b *testing.B) {
	newHandler := func(tr *tracing.Tracing) http.Handler {
		store, closer := benchStore(b, "memory")
		b.Cleanup(func() { closer.Close() })
		cfg, err := config.Parse("bench.yaml", []byte(benchConfig))
		if err != nil {
			b.Fatal(err)
		}
		srv, err := New(Options{Store: tr.Store(store), Config: cfg, Metrics: metrics.New(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			b.Fatal(err)
		}
		return tr.Handler(srv.Handler())
	}
	// A context as deep as net/http's for a server request.
	ctx := context.WithValue(context.Background(), http.ServerContextKey, &http.Server{})
	ctx = context.WithValue(ctx, http.LocalAddrContextKey, &net.TCPAddr{})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	decide := func(h http.Handler) func(b *testing.B) {
		return func(b *testing.B) {
			w := &discardWriter{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequestWithContext(ctx, "POST", "/v1/check", strings.NewReader(`{"policy":"bench","key":"user-1234"}`))
				clear(w.h)
				h.ServeHTTP(w, req)
				if w.code != 200 {
					b.Fatalf("status %d", w.code)
				}
			}
		}
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	off, on := newHandler(nil), newHandler(tracing.New(tp))

	var offNs, checkNs, onNs float64
	b.Run("off", func(b *testing.B) {
		c0 := cpuNanos()
		decide(off)(b)
		offNs = float64(cpuNanos()-c0) / float64(b.N)
		b.ReportMetric(offNs, "cpu-ns/op")
	})
	b.Run("off-check", func(b *testing.B) {
		c0 := cpuNanos()
		n := 0
		for b.Loop() {
			if tracing.Recording(ctx) {
				n++
			}
		}
		if n != 0 {
			b.Fatal("recording with tracing off")
		}
		checkNs = float64(cpuNanos()-c0) / float64(b.N)
		b.ReportMetric(checkNs, "cpu-ns/op")
		if offNs > 0 {
			b.ReportMetric(100*checkNs/offNs, "%_of_decision")
		}
	})
	b.Run("on", func(b *testing.B) {
		c0 := cpuNanos()
		decide(on)(b)
		_ = tp.ForceFlush(context.Background()) // the exporter's share counts
		onNs = float64(cpuNanos()-c0) / float64(b.N)
		b.ReportMetric(onNs, "cpu-ns/op")
		if offNs > 0 {
			b.ReportMetric(onNs/offNs, "x_off")
		}
	})
}

// cpuNanos is the process's CPU time (user + system, every thread), so that
// the batching exporter's goroutine counts too and a loaded machine's
// waiting does not.
func cpuNanos() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
