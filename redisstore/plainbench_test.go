package redisstore

import (
	"context"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/clock"
	"github.com/sluice-io/sluice/internal/redistest"
)

// BenchmarkPlainAllow: one plain-path decision (OpAllow, cost 1) on
// real Redis, with the test clock mid-window: cold keys (each key once)
// and warm ones (1000 keys, over and over). For allocs/op; its time is
// the round trip's.
func BenchmarkPlainAllow(b *testing.B) {
	url := redistest.Standalone(b).URL()
	for _, warm := range []bool{false, true} {
		b.Run(map[bool]string{false: "cold", true: "warm"}[warm], func(b *testing.B) {
			clk := clock.NewFake(time.Date(2026, 1, 1, 0, 30, 0, 0, time.UTC))
			s := newStore(b, Options{URL: url, Clock: clk, PlainWindows: true, DisableDenyCache: true})
			prefix := redistest.Prefix(b)
			keys := make([]string, 1000)
			for i := range keys {
				keys[i] = prefix + strconv.Itoa(i)
			}
			req := sluice.Request{Algorithm: sluice.FixedWindow, Limit: sluice.Limit{Rate: 1e9, Period: time.Hour}, Cost: 1}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if warm {
					req.Key = keys[i%len(keys)]
				} else {
					b.StopTimer()
					req.Key = prefix + "c" + strconv.Itoa(i)
					b.StartTimer()
				}
				if d, err := s.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed {
					b.Fatalf("%+v %v", d, err)
				}
			}
			if s.Stats().Plain == 0 {
				b.Fatal("the plain path was not taken")
			}
		})
	}
}

// BenchmarkGroupCommit: decisions from 64 callers on 100 000 cold keys,
// each command sent alone (direct, as before group commit) or through
// the group commit (grouped), against a redis-server of its own: the
// plain path (fixed window with PlainWindows) and GCRA's script. Besides
// ns/op it reports Redis's CPU per decision (INFO cpu), the reads Redis
// made per decision (INFO stats total_reads_processed: 1/reads is the
// commands per read) and this process's CPU per decision. Run it with
// -count to repeat:
//
//	go test -run '^$' -bench GroupCommit -benchtime 200000x -count 3 ./redisstore/
func BenchmarkGroupCommit(b *testing.B) {
	srv := redistest.NewStandalone(b)
	for _, path := range []string{"plain", "gcra"} {
		for _, mode := range []string{"direct", "grouped"} {
			b.Run(path+"/"+mode, func(b *testing.B) { benchGroupCommit(b, srv, path, mode == "direct") })
		}
	}
}

func benchGroupCommit(b *testing.B, srv *redistest.Server, path string, direct bool) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 30, 0, 0, time.UTC))
	s := newStore(b, Options{URL: srv.URL(), Clock: clk, PlainWindows: path == "plain", DisableDenyCache: true,
		noGroupCommit: direct})
	keys := make([]string, 100_000)
	prefix := redistest.Prefix(b)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
	}
	ctx := context.Background()
	if _, err := srv.Do(ctx, "FLUSHALL"); err != nil {
		b.Fatal(err)
	}
	if _, err := srv.Do(ctx, "CONFIG", "RESETSTAT"); err != nil {
		b.Fatal(err)
	}
	req := sluice.Request{Algorithm: sluice.FixedWindow, Limit: sluice.Limit{Rate: 1e9, Period: time.Hour}, Cost: 1}
	if path == "gcra" {
		req.Algorithm = sluice.GCRA
	}
	cpu0, reads0 := redisCPU(b, srv)
	self0 := selfCPU()
	var next atomic.Uint64
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req := req
		for pb.Next() {
			// A multiplicative step spreads the callers over the keys.
			req.Key = keys[next.Add(1)*40503%uint64(len(keys))]
			if d, err := s.Apply(ctx, sluice.OpAllow, req); err != nil || !d.Allowed {
				b.Errorf("%+v %v", d, err)
				return
			}
		}
	})
	b.StopTimer()
	cpu1, reads1 := redisCPU(b, srv)
	b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "redis-cpu-ns/op")
	b.ReportMetric(float64(reads1-reads0)/float64(b.N), "redis-reads/op")
	b.ReportMetric(float64(selfCPU()-self0)/float64(b.N), "cpu-ns/op")
	if path == "plain" && s.Stats().Plain < uint64(b.N) {
		b.Fatal("the plain path was not taken")
	}
}

// redisCPU returns srv's CPU time so far (user + system, from INFO cpu)
// and the reads it has processed since its stats were reset.
func redisCPU(b *testing.B, srv *redistest.Server) (time.Duration, int64) {
	b.Helper()
	ctx := context.Background()
	info, err := srv.Info(ctx, "cpu")
	if err != nil {
		b.Fatal(err)
	}
	var cpu float64
	for _, f := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(info[f], 64)
		if err != nil {
			b.Fatalf("INFO cpu %s: %v", f, err)
		}
		cpu += v
	}
	stats, err := srv.Info(ctx, "stats")
	if err != nil {
		b.Fatal(err)
	}
	reads, err := strconv.ParseInt(stats["total_reads_processed"], 10, 64)
	if err != nil {
		b.Fatalf("INFO stats total_reads_processed: %v", err)
	}
	return time.Duration(cpu * 1e9), reads
}

// selfCPU is this process's user and system CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
