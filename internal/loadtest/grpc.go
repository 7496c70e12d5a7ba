package loadtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
)

// GRPCOptions configure a run against an Envoy rate limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit).
type GRPCOptions struct {
	// Addr is the service's host:port, such as 127.0.0.1:8081.
	Addr string
	// Domain is the rate-limit domain of every request.
	Domain string
	// Descriptors are the request's descriptors, one "key=value" each; a
	// "{key}" in a value becomes a key number in [0, Keys).
	Descriptors []string
	// Keys is how many distinct values {key} takes; default 1.
	Keys int
	// Streams is the number of requests in flight; default 64.
	Streams int
	// Connections is the number of HTTP/2 connections the streams share;
	// default 4.
	Connections int
	// Duration bounds the run in time.
	Duration time.Duration
	// Requests bounds the run in requests.
	Requests int64
	// Timeout bounds one request; default 5s.
	Timeout time.Duration
	// Rate, when above zero, spaces the requests evenly at that many per
	// second in all (the i-th leaves at the start plus i/Rate, or when a
	// stream is free), to compare servers at one request rate: how many
	// requests share a read or a write is much of a server's CPU per
	// request.
	Rate float64
	// PID, when set, is the server's process id: its CPU time is read from
	// /proc/PID/stat before and after the run.
	PID int
}

// GRPCResult is a gRPC run's outcome.
type GRPCResult struct {
	Result
	// Codes counts answers by overall code (OK, OVER_LIMIT).
	Codes map[string]int64
	// ServerCPU is the server process's user+system CPU time over the run,
	// when GRPCOptions.PID is set.
	ServerCPU time.Duration
	// ClientCPU is this process's (the load generator's) user+system CPU
	// time over the run: on a machine it shares with the server, CPU the
	// server could not use.
	ClientCPU time.Duration
	// FirstError is the first failed call's error, if any failed.
	FirstError error
}

// CPUPerRequest is the server's CPU time per completed request.
func (r *GRPCResult) CPUPerRequest() time.Duration {
	if r.Requests == 0 {
		return 0
	}
	return r.ServerCPU / time.Duration(r.Requests)
}

// String formats the result for people, one figure per line.
func (r *GRPCResult) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "requests   %d in %s (%d errors)\n", r.Requests, r.Elapsed.Round(time.Millisecond), r.Errors)
	if r.FirstError != nil {
		fmt.Fprintf(&b, "first error %v\n", r.FirstError)
	}
	fmt.Fprintf(&b, "throughput %.0f req/s\n", r.Throughput())
	fmt.Fprintf(&b, "codes      OK:%d OVER_LIMIT:%d\n", r.Codes["OK"], r.Codes["OVER_LIMIT"])
	fmt.Fprintf(&b, "latency    p50 %s  p90 %s  p99 %s  p99.9 %s  max %s\n",
		fmtDur(r.Hist.Quantile(0.5)), fmtDur(r.Hist.Quantile(0.9)), fmtDur(r.Hist.Quantile(0.99)),
		fmtDur(r.Hist.Quantile(0.999)), fmtDur(r.Hist.Max()))
	if r.ServerCPU > 0 {
		fmt.Fprintf(&b, "server cpu %s total, %s per request\n", r.ServerCPU.Round(time.Millisecond), fmtDur(r.CPUPerRequest()))
	}
	if r.ClientCPU > 0 && r.Requests > 0 {
		fmt.Fprintf(&b, "client cpu %s total, %s per request\n", r.ClientCPU.Round(time.Millisecond), fmtDur(r.ClientCPU/time.Duration(r.Requests)))
	}
	return b.String()
}

// RunGRPC sends ShouldRateLimit calls until the duration passes, the
// request count is reached or ctx is done.
func RunGRPC(ctx context.Context, o GRPCOptions) (*GRPCResult, error) {
	if o.Addr == "" || o.Domain == "" || len(o.Descriptors) == 0 {
		return nil, errors.New("loadtest: gRPC needs an address, a domain and descriptors")
	}
	if o.Duration <= 0 && o.Requests <= 0 {
		return nil, errors.New("loadtest: give a duration or a request count")
	}
	if o.Keys < 0 || o.Streams < 0 || o.Connections < 0 || o.Streams > 10000 || o.Connections > 64 || !(o.Rate >= 0) {
		return nil, errors.New("loadtest: keys, streams (at most 10000), connections (at most 64) or rate out of range")
	}
	o.Keys = max(o.Keys, 1)
	if o.Streams == 0 {
		o.Streams = 64
	}
	if o.Connections == 0 {
		o.Connections = 4
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	var tmpl []descTemplate
	for _, d := range o.Descriptors {
		k, v, ok := strings.Cut(d, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("loadtest: descriptor %q: want key=value", d)
		}
		p, s, keyed := strings.Cut(v, "{key}")
		tmpl = append(tmpl, descTemplate{key: k, prefix: p, suffix: s, keyed: keyed})
	}
	conns := make([]*grpc.ClientConn, o.Connections)
	for i := range conns {
		c, err := grpc.NewClient(o.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodecV2(wireCodec{base: encoding.GetCodecV2(proto.Name)})))
		if err != nil {
			return nil, fmt.Errorf("loadtest: dial %s: %w", o.Addr, err)
		}
		defer c.Close()
		conns[i] = c
	}
	cpu0, err := procCPU(o.PID)
	if err != nil {
		return nil, err
	}
	self0, err := procCPU(os.Getpid())
	if err != nil {
		return nil, err
	}
	runCtx := ctx
	if o.Duration > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, o.Duration)
		defer cancel()
	}
	size := 0 // a request's largest wire size
	for _, e := range tmpl {
		size += 24 + len(e.key) + len(e.prefix) + len(e.suffix) + 20
	}
	size += 8 + len(o.Domain)
	var sent, paced atomic.Int64
	type worker struct {
		hist       *Histogram
		ok, over   int64
		n, errs    int64
		firstError error
	}
	workers := make([]*worker, o.Streams)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wk := &worker{hist: NewHistogram()}
		workers[w] = wk
		conn := conns[w%len(conns)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each worker draws its keys at random, so that the
			// workers spread over all of them (walking one sequence a
			// step apart, they touched some 2k of 100k).
			rng := rand.New(rand.NewPCG(uint64(w), 0x9E3779B97F4A7C15))
			var resp wireResponse
			for runCtx.Err() == nil {
				if o.Requests > 0 && sent.Add(1) > o.Requests {
					return
				}
				if o.Rate > 0 {
					at := start.Add(time.Duration(float64(paced.Add(1)) / o.Rate * float64(time.Second)))
					if d := time.Until(at); d > 0 {
						t := time.NewTimer(d)
						select {
						case <-t.C:
						case <-runCtx.Done():
							t.Stop()
							return
						}
					}
				}
				req := &wireRequest{b: appendRequest(make([]byte, 0, size), o.Domain, tmpl, rng.IntN(o.Keys))}
				cctx, cancel := context.WithTimeout(runCtx, o.Timeout)
				t0 := time.Now()
				err := conn.Invoke(cctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, req, &resp)
				cancel()
				if err != nil {
					// A call cut by the end of the run is not an error. Its
					// own deadline can fire a moment before the run's.
					if deadline, ok := runCtx.Deadline(); runCtx.Err() != nil || (ok && !time.Now().Before(deadline)) {
						return
					}
					wk.errs++
					if wk.firstError == nil {
						wk.firstError = err
					}
					continue
				}
				wk.hist.Record(time.Since(t0))
				wk.n++
				if resp.code == rlsv3.RateLimitResponse_OVER_LIMIT {
					wk.over++
				} else {
					wk.ok++
				}
			}
		}()
	}
	wg.Wait()
	res := &GRPCResult{Result: Result{Elapsed: time.Since(start), Status: map[int]int64{}, Hist: NewHistogram()}, Codes: map[string]int64{}}
	cpu1, err := procCPU(o.PID)
	if err != nil {
		return nil, err
	}
	res.ServerCPU = cpu1 - cpu0
	self1, err := procCPU(os.Getpid())
	if err != nil {
		return nil, err
	}
	res.ClientCPU = self1 - self0
	var firstErr error
	for _, wk := range workers {
		res.Requests += wk.n
		res.Errors += wk.errs
		res.Hist.Merge(wk.hist)
		res.Codes["OK"] += wk.ok
		res.Codes["OVER_LIMIT"] += wk.over
		if firstErr == nil {
			firstErr = wk.firstError
		}
	}
	if res.Requests == 0 && firstErr != nil {
		return res, fmt.Errorf("loadtest: every call failed: %w", firstErr)
	}
	res.FirstError = firstErr
	return res, nil
}

// clockTicks is Linux's USER_HZ, the unit of /proc/PID/stat's CPU times.
const clockTicks = 100

// procCPU returns a process's user+system CPU time from /proc/PID/stat,
// or 0 for PID 0.
func procCPU(pid int) (time.Duration, error) {
	if pid == 0 {
		return 0, nil
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("loadtest: server cpu: %w", err)
	}
	// The command name, field 2, may hold spaces: count from its ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("loadtest: server cpu: malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("loadtest: server cpu: malformed /proc/%d/stat", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("loadtest: server cpu: malformed /proc/%d/stat", pid)
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}
