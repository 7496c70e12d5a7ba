// Package loadtest is the load generator behind `sluice loadtest`: N
// connections, each sending requests back to back over keep-alive HTTP/1.1,
// for a duration or a request count, recording every latency in a bounded
// log-linear histogram (under 1% error). It reports throughput, status
// counts and latency percentiles.
package loadtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Options configure a run. URL is required, and Duration or Requests.
type Options struct {
	// URL is the endpoint, such as http://127.0.0.1:8080/v1/check. Only
	// loopback and private test addresses should be targeted.
	URL string
	// Method defaults to POST when Body is set, GET otherwise.
	Method string
	// Body is the request body. Each "{key}" in it is replaced by a key
	// number from 0 to Keys-1, so requests spread over Keys keys.
	Body string
	// Header is added to every request.
	Header http.Header
	// Keys is how many distinct keys {key} takes; default 1.
	Keys int
	// Connections is the number of concurrent connections; default 64.
	Connections int
	// Duration bounds the run in time.
	Duration time.Duration
	// Requests bounds the run in requests.
	Requests int64
	// Timeout bounds one request; default 5s.
	Timeout time.Duration
	// NetHTTP sends through net/http's client instead of the lean
	// HTTP/1.1 client used for http:// URLs. https:// always uses net/http.
	NetHTTP bool
}

// Result is a run's outcome.
type Result struct {
	// Requests is the number of completed requests, Errors those that failed
	// without an HTTP answer.
	Requests, Errors int64
	// Elapsed is the run's wall time.
	Elapsed time.Duration
	// Status counts answers by HTTP status code.
	Status map[int]int64
	// Hist holds every latency.
	Hist *Histogram
}

// Throughput is completed requests per second.
func (r *Result) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// String formats the result for people, one figure per line.
func (r *Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "requests   %d in %s (%d errors)\n", r.Requests, r.Elapsed.Round(time.Millisecond), r.Errors)
	fmt.Fprintf(&b, "throughput %.0f req/s\n", r.Throughput())
	codes := make([]int, 0, len(r.Status))
	for c := range r.Status {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	b.WriteString("status    ")
	for _, c := range codes {
		fmt.Fprintf(&b, " %d:%d", c, r.Status[c])
	}
	b.WriteByte('\n')
	fmt.Fprintf(&b, "latency    p50 %s  p90 %s  p99 %s  p99.9 %s  max %s\n",
		fmtDur(r.Hist.Quantile(0.5)), fmtDur(r.Hist.Quantile(0.9)), fmtDur(r.Hist.Quantile(0.99)),
		fmtDur(r.Hist.Quantile(0.999)), fmtDur(r.Hist.Max()))
	return b.String()
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) + "s"
	case d >= time.Millisecond:
		return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) + "ms"
	}
	return strconv.FormatFloat(float64(d)/1e3, 'f', 0, 64) + "µs"
}

// Run sends load until the duration passes, the request count is reached,
// or ctx is done.
func Run(ctx context.Context, o Options) (*Result, error) {
	u, err := url.Parse(o.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("loadtest: bad URL %q: want http://HOST:PORT/PATH", o.URL)
	}
	if o.Duration <= 0 && o.Requests <= 0 {
		return nil, errors.New("loadtest: give a duration or a request count")
	}
	if o.Duration < 0 || o.Requests < 0 || o.Keys < 0 || o.Connections < 0 {
		return nil, errors.New("loadtest: negative duration, requests, keys or connections")
	}
	if o.Connections == 0 {
		o.Connections = 64
	}
	if o.Connections > 10000 {
		return nil, errors.New("loadtest: at most 10000 connections")
	}
	if o.Keys == 0 {
		o.Keys = 1
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	if o.Method == "" {
		o.Method = http.MethodGet
		if o.Body != "" {
			o.Method = http.MethodPost
		}
	}
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        o.Connections,
		MaxIdleConnsPerHost: o.Connections,
		MaxConnsPerHost:     o.Connections,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: o.Timeout}

	// Pre-render the bodies of up to 4096 keys; larger key counts render
	// on the fly.
	prefix, suffix, templated := strings.Cut(o.Body, "{key}")
	rendered := make([][]byte, min(o.Keys, 4096))
	for i := range rendered {
		rendered[i] = render(o.Body, prefix, suffix, templated, i)
	}

	if o.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Duration)
		defer cancel()
	}
	var sent atomic.Int64
	workers := make([]*worker, o.Connections)
	raw := u.Scheme == "http" && !o.NetHTTP
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wk := &worker{hist: NewHistogram(), status: map[int]int64{}}
		workers[w] = wk
		wg.Add(1)
		if raw {
			go func() {
				defer wg.Done()
				rawWorker(ctx, &o, u, wk, uint64(w), &sent, rendered, prefix, suffix, templated)
			}()
			continue
		}
		go func() {
			defer wg.Done()
			// Each worker draws its keys at random, so that the
			// workers spread over all of them (walking one sequence a
			// step apart, they touched some 2k of 100k).
			rng := rand.New(rand.NewPCG(uint64(w), 0x9E3779B97F4A7C15))
			for ctx.Err() == nil {
				if o.Requests > 0 && sent.Add(1) > o.Requests {
					return
				}
				k := rng.IntN(o.Keys)
				var body []byte
				if k < len(rendered) {
					body = rendered[k]
				} else {
					body = render(o.Body, prefix, suffix, templated, k)
				}
				req, err := http.NewRequestWithContext(ctx, o.Method, o.URL, bytes.NewReader(body))
				if err != nil {
					wk.err++
					return
				}
				for name, vs := range o.Header {
					req.Header[name] = vs
				}
				if len(body) > 0 && req.Header.Get("Content-Type") == "" {
					req.Header.Set("Content-Type", "application/json")
				}
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					if ctx.Err() != nil {
						return // the run ended mid-request
					}
					wk.err++
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				wk.hist.Record(time.Since(t0))
				wk.status[resp.StatusCode]++
				wk.n++
			}
		}()
	}
	wg.Wait()
	res := &Result{Elapsed: time.Since(start), Status: map[int]int64{}, Hist: NewHistogram()}
	for _, wk := range workers {
		res.Requests += wk.n
		res.Errors += wk.err
		res.Hist.Merge(wk.hist)
		for c, n := range wk.status {
			res.Status[c] += n
		}
	}
	return res, nil
}

type worker struct {
	hist   *Histogram
	status map[int]int64
	n, err int64
}

// rawWorker sends requests over one keep-alive connection it owns, written
// and parsed by hand: one write and (usually) one read system call per
// request, so that the load generator takes little of the CPU it shares
// with the service under test. It reconnects after errors.
func rawWorker(ctx context.Context, o *Options, u *url.URL, wk *worker, seed uint64, sent *atomic.Int64, rendered [][]byte, prefix, suffix string, templated bool) {
	host := u.Host
	addr := host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	path := u.RequestURI()
	var head bytes.Buffer
	for name, vs := range o.Header {
		for _, v := range vs {
			head.WriteString(name + ": " + v + "\r\n")
		}
	}
	if o.Body != "" && o.Header.Get("Content-Type") == "" {
		head.WriteString("Content-Type: application/json\r\n")
	}
	extra := head.String()
	build := func(body []byte) []byte {
		req := make([]byte, 0, 128+len(extra)+len(body))
		req = append(req, o.Method+" "+path+" HTTP/1.1\r\nHost: "+host+"\r\n"+extra...)
		if len(body) > 0 || o.Method == http.MethodPost || o.Method == http.MethodPut {
			req = append(req, "Content-Length: "+strconv.Itoa(len(body))+"\r\n"...)
		}
		req = append(req, "\r\n"...)
		return append(req, body...)
	}
	reqs := make([][]byte, len(rendered))
	for i, b := range rendered {
		reqs[i] = build(b)
	}
	var conn net.Conn
	var br *bufio.Reader
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	stop := context.AfterFunc(ctx, func() {
		// Unblock a read or write in progress when the run ends.
		if c := conn; c != nil {
			_ = c.SetDeadline(time.Unix(1, 0))
		}
	})
	defer stop()
	next := seed * 0x9E3779B97F4A7C15
	for ctx.Err() == nil {
		if o.Requests > 0 && sent.Add(1) > o.Requests {
			return
		}
		next += 0x9E3779B97F4A7C15
		k := int(next>>33) % o.Keys
		var req []byte
		if k < len(reqs) {
			req = reqs[k]
		} else {
			req = build(render(o.Body, prefix, suffix, templated, k))
		}
		if conn == nil {
			c, err := net.DialTimeout("tcp", addr, o.Timeout)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				wk.err++
				continue
			}
			conn, br = c, bufio.NewReaderSize(c, 16<<10)
			if ctx.Err() != nil {
				return
			}
		}
		t0 := time.Now()
		_ = conn.SetDeadline(t0.Add(o.Timeout))
		status, keep, err := roundTrip(conn, br, req)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			wk.err++
			conn.Close()
			conn = nil
			continue
		}
		wk.hist.Record(time.Since(t0))
		wk.status[status]++
		wk.n++
		if !keep {
			conn.Close()
			conn = nil
		}
	}
}

// roundTrip writes req and reads one response, discarding its body. It
// reports the status and whether the connection may be reused.
func roundTrip(conn net.Conn, br *bufio.Reader, req []byte) (int, bool, error) {
	if _, err := conn.Write(req); err != nil {
		return 0, false, err
	}
	line, err := br.ReadSlice('\n')
	if err != nil {
		return 0, false, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, false, fmt.Errorf("loadtest: bad status line %q", line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, false, fmt.Errorf("loadtest: bad status line %q", line)
	}
	length, chunked, keep := int64(-1), false, true
	for {
		h, err := br.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		if len(h) <= 2 {
			break
		}
		name, value, ok := bytes.Cut(h, []byte(":"))
		if !ok {
			continue
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.ParseInt(string(value), 10, 64); err != nil {
				return 0, false, fmt.Errorf("loadtest: bad Content-Length %q", value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			keep = !bytes.EqualFold(value, []byte("close"))
		}
	}
	switch {
	case chunked:
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return 0, false, err
			}
			size, err := strconv.ParseInt(string(bytes.TrimSpace(bytes.SplitN(line, []byte(";"), 2)[0])), 16, 64)
			if err != nil {
				return 0, false, fmt.Errorf("loadtest: bad chunk size %q", line)
			}
			if _, err := br.Discard(int(size) + 2); err != nil {
				return 0, false, err
			}
			if size == 0 {
				break
			}
		}
	case length > 0:
		if _, err := br.Discard(int(length)); err != nil {
			return 0, false, err
		}
	case length < 0 && status >= 200 && status != 204 && status != 304:
		return status, false, nil // body until close: give up the connection
	}
	return status, keep, nil
}

func render(body, prefix, suffix string, templated bool, k int) []byte {
	if !templated {
		return []byte(body)
	}
	return []byte(prefix + strconv.Itoa(k) + strings.ReplaceAll(suffix, "{key}", strconv.Itoa(k)))
}

// Histogram records durations in log-linear buckets: 128 sub-buckets per
// power of two, so a quantile is within 1% of the true value. Its memory is
// fixed (64·128 counters) whatever the number of samples.
type Histogram struct {
	counts [64 * subBuckets]int64
	n      int64
	max    int64
}

const subBits = 7
const subBuckets = 1 << subBits

// NewHistogram returns an empty histogram.
func NewHistogram() *Histogram { return &Histogram{} }

func bucketOf(v int64) int {
	if v < subBuckets {
		return int(v)
	}
	exp := bits.Len64(uint64(v)) - subBits // >= 1
	return exp*subBuckets + int(v>>(exp-1)) - subBuckets
}

// bucketHigh is the largest value of bucket i.
func bucketHigh(i int) int64 {
	if i < subBuckets {
		return int64(i)
	}
	exp := i / subBuckets
	mant := int64(i%subBuckets + subBuckets)
	return (mant+1)<<(exp-1) - 1
}

// Record adds one duration.
func (h *Histogram) Record(d time.Duration) {
	v := max(int64(d), 0)
	h.counts[bucketOf(v)]++
	h.n++
	h.max = max(h.max, v)
}

// Merge adds o's samples to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// Count is the number of samples.
func (h *Histogram) Count() int64 { return h.n }

// Max is the largest sample.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Quantile returns the q-quantile (0 < q ≤ 1), rounded up to its bucket's
// upper bound.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var seen int64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return time.Duration(min(bucketHigh(i), h.max))
		}
	}
	return time.Duration(h.max)
}
