// Command gwtail measures the latency the AI gateway adds, as separate
// processes, beside a bare httputil.ReverseProxy before the same fake
// upstream: issue 39's gateway tail check as an operator would run it
// (BenchmarkTailRatio in internal/gateway runs every part in one process,
// where the proxies, the client and the upstream share one heap and one
// collector).
//
// It starts a redis-server, a fake OpenAI upstream and a bare proxy (this
// binary again, with -role), and one `sluice gateway` per store mode
// (memory, Redis, Redis with leases), then sends the same chat completion
// over -conns keep-alive connections, one client key each, to the
// upstream directly and through every proxy, interleaved: -rounds rounds,
// each sending a slice of every mode's requests in an order rotated per
// round, so that a burst of the machine's other work lands on every mode
// alike. It prints, per mode, the latency added over the direct calls at
// p50, p99 and p99.9, its added p99 as a ratio of the bare proxy's
// (x-bare-p99, the target ≤ 2 with leases at 64 connections), and the CPU
// per request of the proxy's own process (utime + stime from /proc).
//
//	go build -o /tmp/sluice ./cmd/sluice
//	cd bench && go run ./cmd/gwtail -sluice /tmp/sluice -runs 3
//
// docs/BENCHMARKS.md ("Gateway tail as processes") has the figures.
package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const body = `{"model":"gpt-test","messages":[{"role":"user","content":"hello, how are you today?"}],"max_tokens":16}`

func main() {
	role := flag.String("role", "", "internal: upstream or bare (a child process)")
	listen := flag.String("listen", "", "internal: the child's address")
	target := flag.String("target", "", "internal: the bare proxy's upstream")
	sluiceBin := flag.String("sluice", "", "the sluice binary (go build -o /tmp/sluice ./cmd/sluice)")
	conns := flag.Int("conns", 64, "connections (and client keys), each a closed loop")
	n := flag.Int("n", 8000, "requests per mode and run")
	rounds := flag.Int("rounds", 16, "rounds per run that the modes interleave in")
	runs := flag.Int("runs", 3, "runs, each with its own ratio")
	modes := flag.String("modes", "bare-proxy,memory,redis,redis-lease", "proxies to measure; bare-proxy is the floor")
	keep := flag.Bool("keep", false, "keep the children's logs and configs (printed at the end); with GODEBUG=gctrace=1 in the environment, the gateways log each collection there")
	slow := flag.Duration("slow", 0, "count each mode's requests slower than this, and list the first 40 with their start times since the run began, at the end of each run")
	flag.Parse()
	switch *role {
	case "upstream":
		log.Fatal(http.ListenAndServe(*listen, http.HandlerFunc(upstream)))
	case "bare":
		u, err := url.Parse(*target)
		if err != nil {
			log.Fatal(err)
		}
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns, t.MaxIdleConnsPerHost = 1024, 256
		log.Fatal(http.ListenAndServe(*listen, &httputil.ReverseProxy{
			Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(u) },
			Transport: t,
		}))
	case "":
	default:
		log.Fatalf("gwtail: unknown -role %q", *role)
	}
	if *sluiceBin == "" {
		log.Fatal("gwtail: -sluice is required (go build -o /tmp/sluice ./cmd/sluice)")
	}
	if *rounds < 1 || *n < *rounds || *conns < 1 {
		log.Fatal("gwtail: want -conns ≥ 1 and -n ≥ -rounds ≥ 1")
	}
	h := &harness{sluice: *sluiceBin, conns: *conns, keep: *keep, slow: *slow}
	defer h.stop()
	if err := h.start(strings.Split(*modes, ",")); err != nil {
		h.stop()
		log.Fatal(err)
	}
	for run := range *runs {
		h.run(run, *n, *rounds)
	}
}

// upstream answers a chat completion as OpenAI's API does: the JSON
// object with its usage, and the x-ratelimit-* headers of the provider's
// own limits (platform.openai.com/docs/guides/rate-limits, "Rate limits in
// headers"), which the gateway replaces with its own.
func upstream(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model string `json:"model"`
	}
	b, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(b, &req); err != nil {
		http.Error(w, `{"error":{"message":"bad json","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	out := fmt.Appendf(nil, `{"id":"chatcmpl-1","object":"chat.completion","created":%d,"model":%q,`+
		`"choices":[{"index":0,"message":{"role":"assistant","content":"tok tok"},"finish_reason":"stop"}],`+
		`"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`, time.Now().Unix(), req.Model)
	hd := w.Header()
	hd.Set("Content-Type", "application/json")
	hd.Set("Content-Length", strconv.Itoa(len(out)))
	hd.Set("x-ratelimit-limit-requests", "10000")
	hd.Set("x-ratelimit-remaining-requests", "9999")
	hd.Set("x-ratelimit-reset-requests", "6ms")
	hd.Set("x-ratelimit-limit-tokens", "30000000")
	hd.Set("x-ratelimit-remaining-tokens", "29999989")
	hd.Set("x-ratelimit-reset-tokens", "0s")
	_, _ = w.Write(out)
}

type proc struct {
	i       int // in harness.procs
	name    string
	url     string
	metrics string // a gateway's GET /metrics, or ""
	cmd     *exec.Cmd
}

type harness struct {
	sluice string
	conns  int
	dir    string
	redis  *exec.Cmd
	up     string
	procs  []*proc // [0] is the direct calls (no process)
	keys   []string
	client *http.Client
	keep   bool
	slow   time.Duration
	began  time.Time // of the run
	slowAt [][]string
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func waitTCP(addr string) error {
	for range 300 {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond) // a child starting: nothing to wait on but its port
	}
	return fmt.Errorf("gwtail: nothing listens on %s after 6 s", addr)
}

func (h *harness) child(name string, env []string, bin string, args ...string) (*exec.Cmd, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	logf, err := os.Create(filepath.Join(h.dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("gwtail: start %s: %w", name, err)
	}
	return cmd, nil
}

func (h *harness) start(modes []string) error {
	var err error
	if h.dir, err = os.MkdirTemp("", "gwtail"); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	redisAddr := freeAddr()
	_, port, _ := net.SplitHostPort(redisAddr)
	if h.redis, err = h.child("redis", nil, "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", h.dir); err != nil {
		return err
	}
	if err := waitTCP(redisAddr); err != nil {
		return err
	}
	upAddr := freeAddr()
	h.up = "http://" + upAddr
	if _, err := h.child("upstream", nil, self, "-role", "upstream", "-listen", upAddr); err != nil {
		return err
	}
	if err := waitTCP(upAddr); err != nil {
		return err
	}
	h.procs = []*proc{{name: "direct", url: h.up}}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	for i := range h.conns {
		h.keys = append(h.keys, fmt.Sprintf("sk-gwtail-%s-%d", run, i))
	}
	for _, m := range modes {
		addr := freeAddr()
		p := &proc{name: m, url: "http://" + addr}
		switch m {
		case "bare-proxy":
			p.cmd, err = h.child(m, nil, self, "-role", "bare", "-listen", addr, "-target", h.up)
		case "memory", "redis", "redis-lease":
			cfg := filepath.Join(h.dir, m+".yaml")
			if err := os.WriteFile(cfg, h.config(m, addr, redisAddr), 0o600); err != nil {
				return err
			}
			maddr := freeAddr()
			p.metrics = "http://" + maddr + "/metrics"
			p.cmd, err = h.child(m, []string{"GWTAIL_UPSTREAM_KEY=sk-upstream"}, h.sluice, "gateway", "--config", cfg, "--metrics-listen", maddr)
		default:
			return fmt.Errorf("gwtail: unknown mode %q (bare-proxy, memory, redis, redis-lease)", m)
		}
		if err != nil {
			return err
		}
		if err := waitTCP(addr); err != nil {
			return fmt.Errorf("%w (%s: see %s)", err, m, filepath.Join(h.dir, m+".log"))
		}
		p.i = len(h.procs)
		h.procs = append(h.procs, p)
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost, t.MaxConnsPerHost = 4*h.conns*len(h.procs), h.conns, h.conns
	h.client = &http.Client{Transport: t}
	// Warm: connections open, leases hold chunks and know their keys' rates.
	for _, p := range h.procs {
		if _, err := h.measure(p, 50*h.conns); err != nil {
			return fmt.Errorf("gwtail: %s: %w (logs in %s)", p.name, err, h.dir)
		}
	}
	return nil
}

// config is a gateway config for mode: one tier whose limits never bind,
// with the harness's client keys; with leases and no concurrency limit,
// the limits are decided from leases (internal/gateway/bench_test.go's
// newBenchRigOn is the same gateway in one process).
func (h *harness) config(mode, addr, redisAddr string) []byte {
	var b strings.Builder
	store := "memory"
	if mode != "memory" {
		store = "redis://" + redisAddr + "/0"
	}
	fmt.Fprintf(&b, "listen: %q\nupstream:\n  base_url: %s/v1\n  api: openai\n  api_key_env: GWTAIL_UPSTREAM_KEY\nstore:\n  url: %s\n  timeout: 1s\n", addr, h.up, store)
	fmt.Fprintf(&b, "lease: %v\nmodels: [gpt-test]\ntiers:\n  big:\n    rpm: %d\n    tpm: %d\n    rpd: %d\n", mode == "redis-lease", 1<<30, int64(1)<<36, int64(1)<<36)
	if mode != "redis-lease" {
		fmt.Fprintf(&b, "    concurrency: %d\n", 1<<20)
	}
	b.WriteString("keys:\n")
	for i, k := range h.keys {
		sum := sha256.Sum256([]byte(k))
		fmt.Fprintf(&b, "  - {name: c%d, hash: %s, tier: big}\n", i, hex.EncodeToString(sum[:]))
	}
	return []byte(b.String())
}

func (h *harness) stop() {
	for _, p := range h.procs {
		if p.cmd != nil && p.cmd.Process != nil {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			_ = p.cmd.Wait()
		}
	}
	if h.redis != nil && h.redis.Process != nil {
		_ = h.redis.Process.Kill()
		_ = h.redis.Wait()
	}
	if h.dir != "" && h.keep {
		fmt.Printf("logs and configs kept in %s\n", h.dir)
	} else if h.dir != "" {
		_ = os.RemoveAll(h.dir)
	}
}

// measure sends n requests to p over h.conns connections, each worker
// with its own key, and returns their latencies.
func (h *harness) measure(p *proc, n int) ([]time.Duration, error) {
	lat := make([][]time.Duration, h.conns)
	errs := make([]error, h.conns)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for w := range h.conns {
		wg.Go(func() {
			for i := w; i < n; i += h.conns {
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, p.url+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+h.keys[w])
				req.Header.Set("Content-Type", "application/json")
				start := time.Now()
				res, err := h.client.Do(req)
				if err != nil {
					errs[w] = err
					return
				}
				_, _ = io.Copy(io.Discard, res.Body)
				d := time.Since(start)
				lat[w] = append(lat[w], d)
				if h.slow > 0 && d > h.slow && h.slowAt != nil {
					mu.Lock()
					h.slowAt[p.i] = append(h.slowAt[p.i], fmt.Sprintf("%.3fs+%.1fms", start.Sub(h.began).Seconds(), float64(d)/1e6))
					mu.Unlock()
				}
				res.Body.Close()
				if res.StatusCode != http.StatusOK {
					errs[w] = fmt.Errorf("status %d", res.StatusCode)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return slices.Concat(lat...), nil
}

// cpu is a process's user and system CPU time so far (/proc/PID/stat).
func cpu(c *exec.Cmd) time.Duration {
	if c == nil {
		return 0
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/stat", c.Process.Pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	line, _ := bufio.NewReader(f).ReadString('\n')
	// The fields after the command's ")": state is field 3, utime 14, stime 15.
	fs := strings.Fields(line[strings.LastIndexByte(line, ')')+2:])
	if len(fs) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(fs[11], 10, 64)
	s, _ := strconv.ParseInt(fs[12], 10, 64)
	return time.Duration(u+s) * (time.Second / 100) // USER_HZ is 100 on Linux
}

// scraped are the counters of a gateway's /metrics that explain its tail:
// its leases' decisions (sluice_lease_*) and its collections.
var scraped = []string{"sluice_lease_hits_total", "sluice_lease_fetches_total", "sluice_lease_returns_total", "go_gc_duration_seconds_count", "go_memstats_heap_inuse_bytes"}

// scrape sums each of scraped over its series at p's /metrics.
func (h *harness) scrape(p *proc) map[string]float64 {
	out := map[string]float64{}
	if p.metrics == "" {
		return out
	}
	res, err := h.client.Get(p.metrics)
	if err != nil {
		return out
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for _, name := range scraped {
			rest, ok := strings.CutPrefix(line, name)
			if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
				continue
			}
			if i := strings.LastIndexByte(rest, ' '); i >= 0 {
				v, _ := strconv.ParseFloat(rest[i+1:], 64)
				out[name] += v
			}
		}
	}
	return out
}

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[min(len(d)-1, int(float64(len(d))*p))]
}

func (h *harness) run(run, n, rounds int) {
	lat := make([][]time.Duration, len(h.procs))
	cpus := make([]time.Duration, len(h.procs))
	m0 := make([]map[string]float64, len(h.procs))
	for k, p := range h.procs {
		m0[k] = h.scrape(p)
	}
	per := n / rounds
	h.began, h.slowAt = time.Now(), make([][]string, len(h.procs))
	fmt.Printf("run %d began at %s\n", run+1, h.began.Format("15:04:05.000"))
	for round := range rounds {
		for j := range h.procs {
			k := (j + round) % len(h.procs)
			p := h.procs[k]
			c0 := cpu(p.cmd)
			l, err := h.measure(p, per)
			if err != nil {
				log.Fatalf("gwtail: %s: %v (logs in %s)", p.name, err, h.dir)
			}
			cpus[k] += cpu(p.cmd) - c0
			lat[k] = append(lat[k], l...)
		}
	}
	for _, l := range lat {
		slices.Sort(l)
	}
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	added := func(k int, p float64) time.Duration { return pct(lat[k], p) - pct(lat[0], p) }
	fmt.Printf("run %d: %d connections, %d requests per mode in %d rounds; direct p50 %.0f µs, p99 %.0f µs\n",
		run+1, h.conns, per*rounds, rounds, us(pct(lat[0], 0.5)), us(pct(lat[0], 0.99)))
	fmt.Printf("  %-12s %12s %12s %14s %11s %12s %9s %8s %12s %11s %11s\n", "mode", "added p50 µs", "added p99 µs", "added p99.9 µs", "x-bare-p99", "cpu µs/req",
		"gc/1000", "heap MB", "lease hits", "fetches", "returns")
	bare := -1
	for k, p := range h.procs {
		if p.name == "bare-proxy" {
			bare = k
		}
	}
	for k := 1; k < len(h.procs); k++ {
		ratio := "-"
		if bare > 0 && added(bare, 0.99) > 0 {
			ratio = fmt.Sprintf("%.2f", float64(added(k, 0.99))/float64(added(bare, 0.99)))
		}
		// Per request: the gateway's counters over the run (its warm-up
		// and the scrapes are outside it); "-" where it has none.
		m1, nreq := h.scrape(h.procs[k]), float64(len(lat[k]))
		perReq := func(name string, scale float64) string {
			if _, ok := m1[name]; !ok {
				return "-"
			}
			return strconv.FormatFloat((m1[name]-m0[k][name])*scale/nreq, 'f', 3, 64)
		}
		heap := "-"
		if v, ok := m1["go_memstats_heap_inuse_bytes"]; ok {
			heap = strconv.FormatFloat(v/(1<<20), 'f', 1, 64)
		}
		fmt.Printf("  %-12s %12.0f %12.0f %14.0f %11s %12.1f %9s %8s %12s %11s %11s\n", h.procs[k].name, us(added(k, 0.5)), us(added(k, 0.99)), us(added(k, 0.999)), ratio,
			us(cpus[k])/nreq, perReq("go_gc_duration_seconds_count", 1000), heap, perReq("sluice_lease_hits_total", 1), perReq("sluice_lease_fetches_total", 1), perReq("sluice_lease_returns_total", 1))
	}
	for k, at := range h.slowAt {
		if len(at) > 0 {
			fmt.Printf("  %s: %d slower than %s: %s\n", h.procs[k].name, len(at), h.slow, strings.Join(at[:min(len(at), 40)], " "))
		}
	}
}
