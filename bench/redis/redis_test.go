package redis

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/redisstore"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// callers is the concurrency the targets are stated at.
const callers = 64

// nkeys is how many keys the load spreads over: a realistic mix, all
// admitted (the limit is far above the load), so every call runs the
// whole script.
const nkeys = 10_000

var benchLimit = sluice.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000}

func keyName(i int) string { return fmt.Sprintf("rate:user:%06d", i) }

// result is one load run.
type result struct {
	name      string
	decisions float64 // per second
	p50, p99  time.Duration
	usec      float64 // Redis CPU per call, INFO commandstats
}

// load runs fn from callers goroutines for d and measures it.
func load(t testing.TB, srv *redistest.Server, name string, d time.Duration, fn func(ctx context.Context, key string) error) result {
	t.Helper()
	ctx := context.Background()
	if _, err := srv.Do(ctx, "CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	var total atomic.Int64
	lats := make([][]time.Duration, callers)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	start := time.Now()
	for c := range callers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(c), 7))
			own := make([]time.Duration, 0, 1<<16)
			for {
				select {
				case <-stop:
					lats[c] = own
					return
				default:
				}
				t0 := time.Now()
				if err := fn(ctx, keyName(r.IntN(nkeys))); err != nil {
					t.Errorf("%s: %v", name, err)
					lats[c] = own
					return
				}
				own = append(own, time.Since(t0))
				total.Add(1)
			}
		})
	}
	time.AfterFunc(d, func() { close(stop) })
	wg.Wait()
	elapsed := time.Since(start)
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	slices.Sort(all)
	res := result{name: name, decisions: float64(total.Load()) / elapsed.Seconds()}
	if len(all) > 0 {
		res.p50, res.p99 = all[len(all)/2], all[len(all)*99/100]
	}
	res.usec = usecPerCall(t, srv)
	return res
}

// usecPerCall is the Redis CPU per script call, from INFO commandstats.
func usecPerCall(t testing.TB, srv *redistest.Server) float64 {
	info, err := srv.Info(context.Background(), "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Split(info["cmdstat_evalsha"], ",") {
		if v, ok := strings.CutPrefix(f, "usec_per_call="); ok {
			u, _ := strconv.ParseFloat(v, 64)
			return u
		}
	}
	return 0
}

func newStore(t testing.TB, url string, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	opts.URL = url
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	s, err := redisstore.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func newGoRedis(t testing.TB, srv *redistest.Server) *goredis.Client {
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: callers})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func sluiceFn(s *redisstore.Store, a sluice.Algorithm) func(context.Context, string) error {
	return sluiceLimitFn(s, a, benchLimit)
}

func sluiceLimitFn(s *redisstore.Store, a sluice.Algorithm, lim sluice.Limit) func(context.Context, string) error {
	return func(ctx context.Context, key string) error {
		d, err := s.Apply(ctx, sluice.OpAllow, sluice.Request{Key: key, Algorithm: a, Limit: lim, Cost: 1, Lease: key})
		if err == nil && (!d.Allowed || d.Degraded) {
			err = fmt.Errorf("unexpected decision %+v", d)
		}
		return err
	}
}

func redisRateFn(rdb *goredis.Client) func(context.Context, string) error {
	return redisRateLimitFn(rdb, benchLimit)
}

func redisRateLimitFn(rdb *goredis.Client, sl sluice.Limit) func(context.Context, string) error {
	lim := redis_rate.NewLimiter(rdb)
	l := redis_rate.Limit{Rate: int(sl.Rate), Burst: int(sl.Capacity()), Period: sl.Period}
	return func(ctx context.Context, key string) error {
		res, err := lim.Allow(ctx, key, l)
		if err == nil && res.Allowed != 1 {
			err = fmt.Errorf("redis_rate denied: %+v", res)
		}
		return err
	}
}

// goRedisScriptFn runs sluice's GCRA script through go-redis's pool, to
// choose between the clients with the same script.
func goRedisScriptFn(t testing.TB, rdb *goredis.Client) func(context.Context, string) error {
	src, argv := gcraScript(t)
	script := goredis.NewScript(src)
	args := make([]any, len(argv))
	for i, a := range argv {
		args[i] = a
	}
	return func(ctx context.Context, key string) error {
		v, err := script.Run(ctx, rdb, []string{key}, args...).Int64() // a denial's pair fails here
		if err == nil && v < 0 {
			err = fmt.Errorf("reply %v", v)
		}
		return err
	}
}

// gcraScript is the script and ARGV the store sends for one benchLimit
// GCRA allow of cost 1, reading Redis TIME.
func gcraScript(t testing.TB) (string, []string) {
	src, argv, err := redisstore.Script(sluice.Request{Key: "k", Algorithm: sluice.GCRA, Limit: benchLimit, Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	return src, argv
}

// ceiling runs redis-benchmark: EVALSHA of sluice's GCRA script, 64
// clients, pipelines of 16, over nkeys random keys.
func ceiling(t testing.TB, srv *redistest.Server) float64 {
	t.Helper()
	src, argv := gcraScript(t)
	ctx := context.Background()
	if _, err := srv.Do(ctx, "SCRIPT", "LOAD", src); err != nil {
		t.Fatal(err)
	}
	sum := sha1.Sum([]byte(src))
	args := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(srv.Port), "-c", "64", "-P", "16", "-n", "400000", "-r", strconv.Itoa(nkeys), "-q",
		"EVALSHA", hex.EncodeToString(sum[:]), "1", "rate:user:__rand_int__"}
	args = append(args, argv...)
	out, err := exec.Command("redis-benchmark", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-benchmark: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`([0-9.]+) requests per second`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("redis-benchmark output: %s", out)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// memoryPerKey is the INFO used_memory growth per key after n keys were
// written with fn.
func memoryPerKey(t testing.TB, srv *redistest.Server, n int, fn func(ctx context.Context, key string) error) float64 {
	t.Helper()
	ctx := context.Background()
	used := func() float64 {
		info, err := srv.Info(ctx, "memory")
		if err != nil {
			t.Fatal(err)
		}
		v, _ := strconv.ParseFloat(info["used_memory"], 64)
		return v
	}
	before := used()
	for i := range n {
		if err := fn(ctx, keyName(i)); err != nil {
			t.Fatal(err)
		}
	}
	return (used() - before) / float64(n)
}

// TestRedisReport measures everything docs/BENCHMARKS.md reports. It runs
// only when SLUICE_BENCH_REDIS is set (bench/redis.sh sets it), since it
// takes about a minute.
func TestRedisReport(t *testing.T) {
	if os.Getenv("SLUICE_BENCH_REDIS") == "" {
		t.Skip("set SLUICE_BENCH_REDIS=1 (bench/redis.sh) to run the Redis report")
	}
	d := 3 * time.Second
	if v, err := time.ParseDuration(os.Getenv("SLUICE_BENCH_DURATION")); err == nil {
		d = v
	}
	report := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }

	// Throughput, latency and Redis CPU at 64 callers, each on its own server.
	var results []result
	{
		srv := redistest.NewStandalone(t)
		results = append(results, load(t, srv, "redis_rate (go-redis, GCRA)", d, redisRateFn(newGoRedis(t, srv))))
	}
	{
		srv := redistest.NewStandalone(t)
		results = append(results, load(t, srv, "sluice GCRA script via go-redis", d, goRedisScriptFn(t, newGoRedis(t, srv))))
	}
	for _, a := range sluice.Algorithms() {
		srv := redistest.NewStandalone(t)
		s := newStore(t, srv.URL(), redisstore.Options{DisableDenyCache: true})
		results = append(results, load(t, srv, "sluice redisstore (rueidis) "+a.String(), d, sluiceFn(s, a)))
	}
	base := results[0]
	report("## %d callers, %s per run, %d keys; baseline %s = %.0f decisions/s, p99 %s, %.2f µs Redis CPU per call",
		callers, d, nkeys, base.name, base.decisions, base.p99, base.usec)
	report("| system | decisions/s | × baseline | p50 | p99 | p99 ÷ baseline | Redis µs/call |")
	report("|---|---|---|---|---|---|---|")
	for _, r := range results {
		report("| %s | %.0f | %.2f× | %s | %s | %.2f | %.2f |", r.name, r.decisions, r.decisions/base.decisions,
			r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), float64(r.p99)/float64(base.p99), r.usec)
	}

	// Redis's ceiling for the same script.
	{
		srv := redistest.NewStandalone(t)
		c := ceiling(t, srv)
		report("\nredis-benchmark EVALSHA sluice GCRA, -c 64 -P 16: %.0f requests/s (%.2f× redis_rate's decisions/s)", c, c/base.decisions)
	}

	// Memory per key.
	// Keys that live for a while: 100/h, one event each.
	memLimit := sluice.PerHour(100)
	report("\n| algorithm | bytes per key (INFO used_memory delta, 10,000 keys, 1 event each at 100/h) |")
	report("|---|---|")
	{
		srv := redistest.NewStandalone(t)
		report("| redis_rate GCRA | %.0f |", memoryPerKey(t, srv, 10_000, redisRateLimitFn(newGoRedis(t, srv), memLimit)))
	}
	for _, a := range sluice.Algorithms() {
		srv := redistest.NewStandalone(t)
		s := newStore(t, srv.URL(), redisstore.Options{DisableDenyCache: true})
		report("| sluice %s (cost 1) | %.0f |", a, memoryPerKey(t, srv, 10_000, sluiceLimitFn(s, a, memLimit)))
	}
	{
		// A sliding-window log full at 100 entries, each at its own instant.
		srv := redistest.NewStandalone(t)
		s := newStore(t, srv.URL(), redisstore.Options{DisableDenyCache: true})
		lim := sluice.Limit{Rate: 100, Period: time.Hour}
		per := memoryPerKey(t, srv, 200, func(ctx context.Context, key string) error {
			for range 100 {
				if _, err := s.Apply(ctx, sluice.OpAllow, sluice.Request{Key: key, Algorithm: sluice.SlidingWindowLog, Limit: lim, Cost: 1}); err != nil {
					return err
				}
			}
			return nil
		})
		report("| sluice sliding_window_log, 100 entries | %.0f |", per)
	}

	// The over-limit cache: one abusive key, 64 callers, cache on and off.
	{
		srv := redistest.NewStandalone(t)
		lim := sluice.PerMinute(1)
		deny := func(s *redisstore.Store) func(context.Context, string) error {
			return func(ctx context.Context, _ string) error {
				d, err := s.Apply(ctx, sluice.OpAllow, sluice.Request{Key: "rate:abuser", Algorithm: sluice.GCRA, Limit: lim, Cost: 1})
				if err == nil && d.Allowed {
					return nil // the first call
				}
				return err
			}
		}
		off := load(t, srv, "denied key, cache off", d, deny(newStore(t, srv.URL(), redisstore.Options{DisableDenyCache: true})))
		on := load(t, srv, "denied key, cache on", d, deny(newStore(t, srv.URL(), redisstore.Options{})))
		report("\nover-limit cache, one denied key, %d callers: off %.0f decisions/s (baseline), on %.0f decisions/s = %.1f×",
			callers, off.decisions, on.decisions, on.decisions/off.decisions)
	}
}

// BenchmarkGCRA64 compares sluice's store with redis_rate at 64 callers.
func BenchmarkGCRA64(b *testing.B) {
	run := func(b *testing.B, fn func(context.Context, string) error) {
		b.ReportAllocs()
		b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
		var seq atomic.Int64
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			r := rand.New(rand.NewPCG(uint64(seq.Add(1)), 1))
			for pb.Next() {
				if err := fn(context.Background(), keyName(r.IntN(nkeys))); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	b.Run("redis_rate", func(b *testing.B) {
		srv := redistest.NewStandalone(b)
		run(b, redisRateFn(newGoRedis(b, srv)))
	})
	b.Run("sluice", func(b *testing.B) {
		srv := redistest.NewStandalone(b)
		run(b, sluiceFn(newStore(b, srv.URL(), redisstore.Options{DisableDenyCache: true}), sluice.GCRA))
	})
}
