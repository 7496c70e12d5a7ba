package rlqs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/internal/rlqs"
	"github.com/sluice-io/sluice/redisstore"
)

// countHandler counts log lines.
type countHandler struct{ n atomic.Int64 }

func (h *countHandler) Enabled(context.Context, slog.Level) bool  { return true }
func (h *countHandler) Handle(context.Context, slog.Record) error { h.n.Add(1); return nil }
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler        { return h }
func (h *countHandler) WithGroup(string) slog.Handler             { return h }

// dialFrom connects to addr from a loopback address of its own, so that
// the server sees a client IP of its own.
func dialFrom(t *testing.T, local, addr string) rlqsv3.RateLimitQuotaServiceClient {
	t.Helper()
	return rlqsv3.NewRateLimitQuotaServiceClient(connFrom(t, local, addr))
}

func connFrom(t *testing.T, local, addr string) *grpc.ClientConn {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestAbuse: four client addresses, each at its stream cap, send reports
// back to back (not once an interval), each with new buckets, and
// reconnect; quiet clients on other addresses keep their RLQS and RLS
// p99 within 10× their quiet p99 measured in the same run, the server's
// held structures stay within their ceilings, the excess is dropped and
// counted, and the warnings are a few lines.
func TestAbuse(t *testing.T) {
	srv := redistest.Standalone(t)
	st, err := redisstore.New(context.Background(), redisstore.Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	// The default caps (16 streams per client, 1000 usages per report,
	// 4000 usages and 1000 new buckets per client and interval), and a
	// server ceiling of 5000 buckets that the flood reaches.
	cfg := &rlqs.Config{ReportInterval: time.Second, MaxBuckets: 5000,
		Domains: []rlqs.Domain{{Domain: "envoy", Policies: []rlqs.Policy{{Name: "u", Match: map[string]string{"user": "*"}, RequestsPerUnit: 100, Unit: "second"}}}}}
	logs := &countHandler{}
	reg := prometheus.NewRegistry()
	// The server as sluice serve runs it: RLS and RLQS on one gRPC port,
	// behind the port's per-client guards (envoyrls.Runner).
	in := &instance{t: t, store: st, prefix: redistest.Prefix(t), dir: rlsDir(t), cfg: cfg, log: slog.New(logs), reg: reg}
	in.start()
	t.Cleanup(in.stop)
	q, addr := in.q, in.addr

	// The quiet clients: quietPeers addresses of their own, each with one
	// stream and one report at a time, asked in turn, so that each reports
	// about 25 times a second: light clients, as an Envoy with a few
	// buckets is, while the test gathers 200 samples a second.
	const quietPeers = 8
	vctx, vcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer vcancel()
	type quietStream struct {
		s       rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
		answers chan int
	}
	var vs []quietStream
	for k := range quietPeers {
		s, err := dialFrom(t, fmt.Sprintf("127.0.0.%d", 20+k), addr).StreamRateLimitQuotas(vctx)
		if err != nil {
			t.Fatal(err)
		}
		answers := make(chan int, 100)
		go func() {
			for {
				r, err := s.Recv()
				if err != nil {
					close(answers)
					return
				}
				answers <- len(r.GetBucketAction())
			}
		}()
		vs = append(vs, quietStream{s, answers})
	}
	// ask reports once on the next quiet stream and waits for the answer;
	// a report left unanswered (its store call failed, or the bucket was
	// refused) counts as 2 s, and a late answer is taken by the next ask.
	// Each ask reports a bucket new to the server, as an Envoy does at
	// once when a request first lands in a bucket (Envoy's
	// rate_limit_quota filter sends a report on a new bucket): a store
	// call every time, never an answer from the assignment in force.
	asked := 0
	ask := func() time.Duration {
		asked++
		v := vs[asked%quietPeers]
		t0 := time.Now()
		if err := v.s.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"user": fmt.Sprintf("quiet-%d", asked)}, 5, 0)}}); err != nil {
			t.Fatal(err)
		}
		select {
		case n, open := <-v.answers:
			if !open || n != 1 {
				t.Fatalf("quiet client: stream ended or %d actions", n)
			}
			return time.Since(t0)
		case <-time.After(2 * time.Second):
			return 2 * time.Second
		}
	}
	// The quiet RLS client, on an address of its own: one call at a
	// time, each with a descriptor value of its own (a store call each,
	// never a cached denial).
	rls := rlsv3.NewRateLimitServiceClient(connFrom(t, "127.0.0.10", addr))
	called := 0
	call := func() time.Duration {
		called++
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "rls", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: fmt.Sprint(called)}}}}})
		if err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			return 2 * time.Second // an error or a refusal counts as the timeout
		}
		return time.Since(t0)
	}
	// measure asks and calls in turn, one every pace (pacing, not
	// synchronisation: a quiet client's rate), samples of each, and
	// returns both p99s and the samples.
	const samples, pace = 200, 5 * time.Millisecond
	measure := func() (q99, r99 time.Duration, qs, rs []time.Duration) {
		tick := time.NewTicker(pace)
		defer tick.Stop()
		end := time.Now().Add(8 * time.Second) // a broken server does not hold the test for minutes
		for range samples {
			<-tick.C
			if time.Now().After(end) {
				qs, rs = append(qs, 2*time.Second), append(rs, 2*time.Second)
				continue
			}
			qs = append(qs, ask())
			rs = append(rs, call())
		}
		slices.Sort(qs)
		slices.Sort(rs)
		return p99(qs), p99(rs), qs, rs
	}
	ask() // warm the connections and the script cache
	call()
	quiet, quietRLS, _, _ := measure()

	// The flood comes from another process, as it would from other
	// machines: this test binary again, running TestAbuser.
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	// At the lowest CPU priority: a flood's clients run on machines of
	// their own, and what is measured is what the server does with what
	// they send, not the flood's own CPU taken from this 2-core machine
	// (a race-instrumented client encoding 1000-bucket reports back to
	// back). It still sends more than the budgets take (asserted below).
	child := exec.CommandContext(ctx, "nice", "-n", "19", os.Args[0], "-test.run=^TestAbuser$", "-test.count=1")
	child.Env = append(os.Environ(), "RLQS_ABUSE_ADDR="+addr)
	var out bytes.Buffer
	child.Stdout, child.Stderr = &out, &out
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = child.Wait() }()
	// The peak resident memory of this process (the server, the quiet
	// clients, the test) from here on: the kernel's high-water mark, reset
	// (proc(5), clear_refs 5) so that what earlier tests took is not
	// counted.
	hwm0, hwmErr := resetPeakRSS()
	var most rlqs.Held
	var mostBuckets atomic.Int64 // most.Buckets, read while the sampler runs
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			h := q.Held()
			most.Streams, most.Buckets, most.Peers = max(most.Streams, h.Streams), max(most.Buckets, h.Buckets), max(most.Peers, h.Peers)
			mostBuckets.Store(int64(most.Buckets))
			most.PendingBytes = max(most.PendingBytes, h.PendingBytes)
			time.Sleep(5 * time.Millisecond) // a sampling period, not synchronisation
		}
	}()
	// The flood is on once the four addresses hold most of their streams,
	// their buckets have reached half the ceiling, and the server drops
	// reports.
	// (The flood, at nice 19, may wait seconds for a core on a busy machine.)
	if !redistest.PollUntil(time.Now().Add(15*time.Second), func() bool {
		h := q.Held()
		return h.Peers >= 4+quietPeers && h.Streams >= 32 && mostBuckets.Load() >= int64(cfg.MaxBuckets/2) && testutil.ToFloat64(dropCounter(reg)) > 0
	}) {
		t.Fatalf("no flood (held %+v): %s", q.Held(), out.String())
	}
	loud, loudRLS, qs, rs := measure()
	floodOn := q.Held().Streams >= 32 // the flood lasted the measurement
	peak, _ := peakRSS()
	cancel()
	wg.Wait()
	<-done
	// The quiet p99 again once the flood's streams are gone: the load of
	// this shared machine drifts over the seconds of the test, and the
	// baseline is the larger of the two quiet measurements around the
	// flood.
	if !redistest.PollUntil(time.Now().Add(5*time.Second), func() bool { return q.Held().Streams <= quietPeers }) {
		t.Errorf("the flood's streams still held after it ended: %+v", q.Held())
	}
	quiet2, quietRLS2, _, _ := measure()
	quiet, quietRLS = max(quiet, quiet2), max(quietRLS, quietRLS2)
	dropped := testutil.ToFloat64(dropCounter(reg))
	t.Logf("peak RSS during the flood %d MiB (%d MiB when it began)%v", peak>>20, hwm0>>20, hwmErr)
	t.Logf("RLQS p99 quiet %v, under abuse %v (%.1f×); RLS p99 quiet %v, under abuse %v (%.1f×); most held %+v; %.0f usages dropped; %d log lines",
		quiet, loud, float64(loud)/float64(quiet), quietRLS, loudRLS, float64(loudRLS)/float64(quietRLS), most, dropped, logs.n.Load())
	// The goal (#36): under the flood, the quiet clients' p99 within 10×
	// their quiet p99, all measured here, asserted without the race
	// detector (measured 0.5–7.9×). The quiet p99 is floored at 2 ms: on
	// a 2-core machine shared with other builds a p99 of 200 samples
	// below that measures the scheduler. With the race detector (this
	// binary and the flood's instrumented, the Go side 5–20× slower) 1 to
	// 5 of the 200 samples still meet stalls of 20–90 ms that were not
	// traced to a queue of the server's (the RLS client meets them too):
	// measured 2.3–27.6×, so 60× is asserted there (CI runs other
	// packages' race tests beside this one on 2 cores). Either is far
	// below what the flood did before the fixes (RLQS p99 2 s, reports
	// unanswered; RLS up to 2 s, the store's timeout: 1000× the floor).
	bound := time.Duration(10)
	if raceEnabled {
		bound = 60
	}
	floor := func(d time.Duration) time.Duration { return max(d, 2*time.Millisecond) }
	if loud > bound*floor(quiet) {
		t.Errorf("RLQS p99 under abuse %v > %d × quiet p99 %v (slowest %v)", loud, bound, quiet, qs[len(qs)-5:])
	}
	if loudRLS > bound*floor(quietRLS) {
		t.Errorf("RLS p99 under abuse %v > %d × quiet p99 %v (slowest %v)", loudRLS, bound, quietRLS, rs[len(rs)-5:])
	}
	if !floodOn {
		t.Errorf("the flood ended before the measurement did: %s", out.String())
	}
	if most.Buckets > cfg.MaxBuckets || most.Streams > rlqs.DefaultMaxStreams || most.Peers > rlqs.DefaultMaxStreams+4096 || most.PendingBytes > rlqs.MaxPendingBytes {
		t.Errorf("held %+v beyond the ceilings (buckets %d, streams %d)", most, cfg.MaxBuckets, rlqs.DefaultMaxStreams)
	}
	if dropped == 0 || most.Buckets < cfg.MaxBuckets/2 {
		t.Errorf("dropped %.0f, held at most %d buckets: the flood did not reach the budgets and the ceiling", dropped, most.Buckets)
	}
	// One line per kind of warning per 10 s: a handful, not one per bucket.
	if n := logs.n.Load(); n > 10 {
		t.Errorf("%d log lines; want a few", n)
	}
}

func dropCounter(reg *prometheus.Registry) prometheus.Collector {
	return collectorFunc(func(ch chan<- prometheus.Metric) {
		mfs, _ := reg.Gather()
		var sum float64
		for _, mf := range mfs {
			if mf.GetName() == "sluice_rlqs_dropped_total" {
				for _, m := range mf.GetMetric() {
					sum += m.GetCounter().GetValue()
				}
			}
		}
		ch <- prometheus.MustNewConstMetric(prometheus.NewDesc("x", "x", nil, nil), prometheus.CounterValue, sum)
	})
}

// TestAbuser is TestAbuse's flood, run in a process of its own (it does
// nothing unless RLQS_ABUSE_ADDR is set): four client addresses, each
// with 16 streams (the cap), each sending reports of 1000 new buckets
// (the cap) back to back and opening a new stream after every 5.
// RLQS_ABUSE_PEERS sets the number of addresses (127.0.0.2 on) and
// RLQS_ABUSE_ID_BYTES pads each bucket id to about that size, within the
// 16 entries and 1024 bytes a bucket id may have (TestAbuseMemory).
func TestAbuser(t *testing.T) {
	addr := os.Getenv("RLQS_ABUSE_ADDR")
	if addr == "" {
		t.Skip("run by TestAbuse")
	}
	peers, idBytes := 4, 0
	if n, err := strconv.Atoi(os.Getenv("RLQS_ABUSE_PEERS")); err == nil {
		peers = n
	}
	if n, err := strconv.Atoi(os.Getenv("RLQS_ABUSE_ID_BYTES")); err == nil {
		idBytes = n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 38*time.Second) // killed earlier by TestAbuse
	defer cancel()
	var wg sync.WaitGroup
	for a := range peers {
		c := dialFrom(t, fmt.Sprintf("127.0.0.%d", 2+a), addr)
		// Two reports of 1000 buckets, sent in turn by each stream: on a
		// new stream every bucket is new to the server.
		var msgs []*rlqsv3.RateLimitQuotaUsageReports
		for k := range 2 {
			var us []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
			for b := range rlqs.DefaultMaxUsagesPerReport {
				us = append(us, usage(paddedID(fmt.Sprintf("%d-%d-%d", a, k, b), idBytes), 1000, 1000))
			}
			msgs = append(msgs, &rlqsv3.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: us})
		}
		for range rlqs.DefaultMaxStreamsPerPeer {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					sctx, scancel := context.WithCancel(ctx)
					s, err := c.StreamRateLimitQuotas(sctx)
					if err != nil {
						scancel()
						continue
					}
					go func() {
						for {
							if _, err := s.Recv(); err != nil {
								return
							}
						}
					}()
					for k := 0; k < 5 && ctx.Err() == nil; k++ {
						if s.Send(msgs[k%2]) != nil {
							break
						}
					}
					scancel()
				}
			}()
		}
	}
	wg.Wait()
}

// paddedID is the bucket id {user: user} with entries added up to about
// size bytes of keys and values, at most 16 entries of at most 1024 bytes
// in all (the largest id the server takes).
func paddedID(user string, size int) map[string]string {
	id := map[string]string{"user": user}
	n := len("user") + len(user)
	for k := 0; len(id) < 16 && n+64 <= min(size, 1024); k++ {
		key := fmt.Sprintf("k%02d", k)
		id[key] = strings.Repeat("v", 64-len(key))
		n += 64
	}
	return id
}

// p99 is the nearest-rank 99th percentile of sorted ds.
func p99(ds []time.Duration) time.Duration {
	return ds[(len(ds)*99+99)/100-1]
}

// resetPeakRSS resets this process's VmHWM to its resident size and
// returns it (proc(5): writing 5 to /proc/PID/clear_refs).
func resetPeakRSS() (int64, error) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return 0, fmt.Errorf("reset the peak RSS: %w", err)
	}
	return peakRSS()
}

// peakRSS reads this process's VmHWM, in bytes.
func peakRSS() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("peak RSS: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb int64
			if _, err := fmt.Sscan(v, &kb); err != nil {
				return 0, fmt.Errorf("peak RSS: %q: %w", line, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("peak RSS: no VmHWM in /proc/self/status")
}
