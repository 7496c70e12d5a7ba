package batch

// Benchmarks of the batch client's overhead. Run them with
//
//	go test -run '^$' -bench . -benchtime 20000x ./internal/batch/
//
// Every one calls the same instant fake upstream with 8 requests in
// flight. plain-http is the baseline, a bare http.Client loop that posts
// the same body and decodes the answer; the others add aiclient (limiters
// on the memory store, set high), then the whole batch run (input parsing,
// resume bookkeeping, output record per prompt, with and without fsync).
// The ratio of each ns/op to plain-http's is sluice's overhead.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/aiclient"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/memstore"
)

const benchConcurrency = 8

// promptSource generates n JSONL prompts on the fly, never holding them.
type promptSource struct {
	n, i int
	buf  []byte
}

func (s *promptSource) Read(p []byte) (int, error) {
	for len(s.buf) < len(p) && s.i < s.n {
		s.buf = fmt.Appendf(s.buf, `{"id":"p%d","prompt":"Explain rate limiting in plain words, please, for reader number %d of many."}`+"\n", s.i, s.i)
		s.i++
	}
	if len(s.buf) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.buf)
	s.buf = s.buf[:copy(s.buf, s.buf[n:])]
	return n, nil
}

func benchUpstream(b *testing.B) *fakeopenai.Server {
	return fakeopenai.New(b, fakeopenai.Options{MaxRecorded: 1})
}

func benchLimiters(b *testing.B) (*sluice.Limiter, *sluice.Limiter) {
	store, err := memstore.New(memstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = store.Close() })
	reqs, err := sluice.NewLimiter(sluice.Options{Store: store, Limit: sluice.Limit{Rate: 1 << 30, Period: time.Second}})
	if err != nil {
		b.Fatal(err)
	}
	toks, err := sluice.NewLimiter(sluice.Options{Store: store, Limit: sluice.Limit{Rate: 1 << 40, Period: time.Minute}})
	if err != nil {
		b.Fatal(err)
	}
	return reqs, toks
}

func benchClient(b *testing.B, up *fakeopenai.Server) *aiclient.Client {
	reqs, toks := benchLimiters(b)
	c, err := aiclient.New(aiclient.Options{BaseURL: up.BaseURL(), APIKey: "sk", Requests: reqs, Tokens: toks,
		HTTPClient: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchConcurrency * 2}}})
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// parallelN runs f b.N times over benchConcurrency goroutines.
func parallelN(b *testing.B, f func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range benchConcurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				f(i)
			}
		}()
	}
	wg.Wait()
}

func BenchmarkOverhead(b *testing.B) {
	up := benchUpstream(b)
	msg := func(i int) string {
		return fmt.Sprintf("Explain rate limiting in plain words, please, for reader number %d of many.", i)
	}

	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchConcurrency * 2}}
	plain := func(b *testing.B, i int) {
		body, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": msg(i)}}})
		req, _ := http.NewRequest(http.MethodPost, up.BaseURL()+"chat/completions", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer sk")
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			b.Error(err)
			return
		}
		var out aiclient.ChatResponse
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			b.Errorf("status %d, %v", resp.StatusCode, err)
		}
	}
	// Warm the upstream and the connections up before any measurement.
	b.Run("warmup", func(b *testing.B) { parallelN(b, func(i int) { plain(b, i) }) })
	b.Run("plain-http", func(b *testing.B) {
		b.ReportAllocs()
		parallelN(b, func(i int) { plain(b, i) })
	})

	b.Run("aiclient", func(b *testing.B) {
		c := benchClient(b, up)
		b.ReportAllocs()
		b.ResetTimer()
		parallelN(b, func(i int) {
			if _, err := c.Chat(context.Background(), &aiclient.ChatRequest{Model: "m", Messages: []aiclient.Message{{Role: "user", Content: msg(i)}}}); err != nil {
				b.Error(err)
			}
		})
	})

	for _, sync := range []bool{false, true} {
		name := "batch-nosync"
		if sync {
			name = "batch-fsync"
		}
		b.Run(name, func(b *testing.B) {
			c := benchClient(b, up)
			out := b.TempDir() + "/out.jsonl"
			b.ReportAllocs()
			b.ResetTimer()
			sum, err := Run(context.Background(), Config{Input: &promptSource{n: b.N}, Output: out, Client: c, Model: "m", Concurrency: benchConcurrency, NoSync: !sync})
			if err != nil || sum.OK != int64(b.N) {
				b.Fatalf("%v, %+v", err, sum)
			}
		})
	}
}

// BenchmarkMemory100k runs 100,000 prompts through batch.Run against the
// instant upstream and reports the peak heap in use, sampled every 5ms,
// next to the peak of a 10,000-prompt run: the input is streamed, so ten
// times the prompts must not take ten times the memory.
//
//	go test -run '^$' -bench Memory100k -benchtime 1x ./internal/batch/
func BenchmarkMemory100k(b *testing.B) {
	up := benchUpstream(b)
	peak := func(n int) (uint64, time.Duration) {
		runtime.GC()
		var top atomic.Uint64
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			t := time.NewTicker(5 * time.Millisecond)
			defer t.Stop()
			var ms runtime.MemStats
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					runtime.ReadMemStats(&ms)
					if ms.HeapInuse > top.Load() {
						top.Store(ms.HeapInuse)
					}
				}
			}
		}()
		start := time.Now()
		sum, err := Run(context.Background(), Config{Input: &promptSource{n: n}, Output: b.TempDir() + "/out.jsonl", Client: benchClient(b, up), Model: "m", Concurrency: benchConcurrency, NoSync: true})
		el := time.Since(start)
		close(stop)
		<-done
		if err != nil || sum.OK != int64(n) {
			b.Fatalf("%v, %+v", err, sum)
		}
		return top.Load(), el
	}
	for range b.N {
		small, _ := peak(10_000)
		large, el := peak(100_000)
		b.ReportMetric(float64(small)/(1<<20), "peakMiB-10k")
		b.ReportMetric(float64(large)/(1<<20), "peakMiB-100k")
		b.ReportMetric(float64(large)/float64(small), "ratio-100k/10k")
		b.ReportMetric(100_000/el.Seconds(), "prompts/s")
	}

}

// BenchmarkOverheadRatio interleaves the baseline and the candidates in
// rounds of 2,000 requests each, so that drift in a shared machine's speed
// hits them alike, and reports each one's ns per request and its ratio to
// the plain http.Client loop.
//
//	go test -run '^$' -bench OverheadRatio -benchtime 5x ./internal/batch/
func BenchmarkOverheadRatio(b *testing.B) {
	up := benchUpstream(b)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchConcurrency * 2}}
	c := benchClient(b, up)
	const round = 2000
	body := func(i int) []byte {
		return fmt.Appendf(nil, `{"model":"m","messages":[{"role":"user","content":"Explain rate limiting in plain words, please, for reader number %d of many."}]}`, i)
	}
	runN := func(n int, f func(i int)) time.Duration {
		start := time.Now()
		var next atomic.Int64
		var wg sync.WaitGroup
		for range benchConcurrency {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
					f(i)
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	plain := func(i int) {
		req, _ := http.NewRequest(http.MethodPost, up.BaseURL()+"chat/completions", bytes.NewReader(body(i)))
		req.Header.Set("Authorization", "Bearer sk")
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			b.Error(err)
			return
		}
		var out aiclient.ChatResponse
		_ = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
	}
	client := func(i int) {
		if _, err := c.Chat(context.Background(), &aiclient.ChatRequest{Model: "m", Messages: []aiclient.Message{{Role: "user", Content: fmt.Sprintf("Explain rate limiting in plain words, please, for reader number %d of many.", i)}}}); err != nil {
			b.Error(err)
		}
	}
	batchRun := func(sync bool) time.Duration {
		start := time.Now()
		sum, err := Run(context.Background(), Config{Input: &promptSource{n: round}, Output: b.TempDir() + "/out.jsonl", Client: c, Model: "m", Concurrency: benchConcurrency, NoSync: !sync})
		if err != nil || sum.OK != round {
			b.Fatalf("%v %+v", err, sum)
		}
		return time.Since(start)
	}
	runN(round, plain) // warm-up
	// Each phase's wall time, and the process's CPU time (client and fake
	// upstream together; the upstream's share is the same in every phase).
	var tPlain, tClient, tBatch, tSync, cPlain, cClient, cBatch time.Duration
	measure := func(wall, cpu *time.Duration, f func() time.Duration) {
		c0 := cpuTime()
		*wall += f()
		*cpu += cpuTime() - c0
	}
	var cSync time.Duration
	for range b.N {
		measure(&tPlain, &cPlain, func() time.Duration { return runN(round, plain) })
		measure(&tClient, &cClient, func() time.Duration { return runN(round, client) })
		measure(&tBatch, &cBatch, func() time.Duration { return batchRun(false) })
		measure(&tSync, &cSync, func() time.Duration { return batchRun(true) })
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N*round) }
	b.ReportMetric(per(cPlain), "cpu-ns/req-plain")
	b.ReportMetric(per(cClient)-per(cPlain), "cpu-ns/req-aiclient-extra")
	b.ReportMetric(per(cBatch)-per(cPlain), "cpu-ns/req-batch-extra")
	b.ReportMetric(per(cSync)-per(cPlain), "cpu-ns/req-batch-fsync-extra")
	b.ReportMetric(per(tPlain), "ns/req-plain")
	b.ReportMetric(per(tClient), "ns/req-aiclient")
	b.ReportMetric(per(tBatch), "ns/req-batch")
	b.ReportMetric(per(tSync), "ns/req-batch-fsync")
	b.ReportMetric(per(tClient)/per(tPlain), "x-aiclient")
	b.ReportMetric(per(tBatch)/per(tPlain), "x-batch")
	b.ReportMetric(per(tSync)/per(tPlain), "x-batch-fsync")
}

// cpuTime is the CPU time, user and system, the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
