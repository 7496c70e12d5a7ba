package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/redistest"
	"github.com/sluice-io/sluice/lease"
	"github.com/sluice-io/sluice/redisstore"
)

// hotKeys is how many keys the hot-key load spreads over.
const hotKeys = 100

// hotResult is one hot-key run.
type hotResult struct {
	name       string
	decisions  float64 // per second
	p99        time.Duration
	calls      int64   // Redis script calls during the run
	usec       float64 // Redis CPU µs per script call
	total      int64
	redisUsecs float64 // script CPU (INFO commandstats)
	cpuUsecs   float64 // the whole server's CPU (INFO cpu used_cpu_*)
	// Where the tail comes from (leased rows): decisions the store made,
	// and the p99 of those made from a lease alone.
	direct   int64
	localP99 time.Duration
	slowest  [2]int64 // decisions over 1ms: from a lease, from the store
}

// sample is one decision's latency, and whether a lease made it.
type sample struct {
	d     time.Duration
	local bool
}

// loadHot runs fn(caller, key) from callers goroutines over hotKeys keys;
// fn reports whether its decision came from a lease.
func loadHot(t testing.TB, srv *redistest.Server, name string, d time.Duration, fn func(ctx context.Context, caller int, key string) (bool, error)) hotResult {
	t.Helper()
	ctx := context.Background()
	if _, err := srv.Do(ctx, "CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	cpu0 := redisCPU(t, srv)
	var total atomic.Int64
	lats := make([][]sample, callers)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	start := time.Now()
	for c := range callers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(c), 11))
			own := make([]sample, 0, 1<<16)
			for i := 0; ; i++ {
				if i%64 == 0 {
					select {
					case <-stop:
						lats[c] = own
						return
					default:
					}
				}
				t0 := time.Now()
				local, err := fn(ctx, c, "hot:"+strconv.Itoa(r.IntN(hotKeys)))
				if err != nil {
					t.Errorf("%s: %v", name, err)
					lats[c] = own
					return
				}
				own = append(own, sample{time.Since(t0), local})
				total.Add(1)
			}
		})
	}
	time.AfterFunc(d, func() { close(stop) })
	wg.Wait()
	elapsed := time.Since(start)
	var all, local []time.Duration
	res := hotResult{name: name, decisions: float64(total.Load()) / elapsed.Seconds(), total: total.Load()}
	for _, l := range lats {
		for _, s := range l {
			all = append(all, s.d)
			slow := s.d > time.Millisecond
			if s.local {
				local = append(local, s.d)
			} else {
				res.direct++
			}
			if slow && s.local {
				res.slowest[0]++
			} else if slow {
				res.slowest[1]++
			}
		}
	}
	slices.Sort(all)
	slices.Sort(local)
	if len(all) > 0 {
		res.p99 = all[len(all)*99/100]
	}
	if len(local) > 0 {
		res.localP99 = local[len(local)*99/100]
	}
	res.cpuUsecs = redisCPU(t, srv) - cpu0
	res.calls, res.redisUsecs = scriptStats(t, srv)
	if res.calls > 0 {
		res.usec = res.redisUsecs / float64(res.calls)
	}
	return res
}

// redisCPU is the server's CPU time so far in µs (used_cpu_sys +
// used_cpu_user), network I/O included.
func redisCPU(t testing.TB, srv *redistest.Server) float64 {
	info, err := srv.Info(context.Background(), "cpu")
	if err != nil {
		t.Fatal(err)
	}
	var sec float64
	for _, k := range []string{"used_cpu_sys", "used_cpu_user"} {
		v, err := strconv.ParseFloat(strings.TrimSpace(info[k]), 64)
		if err != nil {
			t.Fatalf("INFO cpu %s: %q", k, info[k])
		}
		sec += v
	}
	return sec * 1e6
}

// scriptStats is the number of script calls and their total Redis CPU in
// µs since the last CONFIG RESETSTAT.
func scriptStats(t testing.TB, srv *redistest.Server) (int64, float64) {
	info, err := srv.Info(context.Background(), "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	var calls int64
	var usec float64
	for _, k := range []string{"cmdstat_evalsha", "cmdstat_eval"} {
		for _, f := range strings.Split(info[k], ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				calls += n
			}
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				u, _ := strconv.ParseFloat(v, 64)
				usec += u
			}
		}
	}
	return calls, usec
}

// TestLeaseReport measures leased quotas on hot keys against redis_rate,
// in one run on one machine: 100 keys, 64 callers spread over three
// leased stores in one process (each with its own connection) on one
// Redis, limits far above the load. Then the accuracy per algorithm: the
// same three stores offered far more than one key's limit.
func TestLeaseReport(t *testing.T) {
	if os.Getenv("SLUICE_BENCH_REDIS") == "" {
		t.Skip("set SLUICE_BENCH_REDIS=1 (bench/redis.sh) to run the lease report")
	}
	d := 3 * time.Second
	if v, err := time.ParseDuration(os.Getenv("SLUICE_BENCH_DURATION")); err == nil {
		d = v
	}
	report := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }

	var rows []hotResult
	{
		srv := redistest.NewStandalone(t)
		rr := redisRateFn(newGoRedis(t, srv))
		rows = append(rows, loadHot(t, srv, "redis_rate (go-redis, GCRA)", d, func(ctx context.Context, _ int, key string) (bool, error) { return false, rr(ctx, key) }))
	}
	{
		srv := redistest.NewStandalone(t)
		s := newStore(t, srv.URL(), redisstore.Options{})
		fn := sluiceFn(s, sluice.GCRA)
		rows = append(rows, loadHot(t, srv, "sluice redisstore GCRA, no lease", d, func(ctx context.Context, _ int, key string) (bool, error) { return false, fn(ctx, key) }))
	}
	{
		srv := redistest.NewStandalone(t)
		stores := leasedStores(t, srv, 3)
		rows = append(rows, loadHot(t, srv, "sluice GCRA, leased, 3 stores", d, func(ctx context.Context, c int, key string) (bool, error) {
			dec, err := stores[c%3].Apply(ctx, sluice.OpAllow, sluice.Request{Key: key, Algorithm: sluice.GCRA, Limit: benchLimit, Cost: 1, UseLease: true})
			if err == nil && (!dec.Allowed || dec.Degraded) {
				err = fmt.Errorf("unexpected decision %+v", dec)
			}
			return dec.Source == sluice.FromLease, err
		}))
		var st lease.Stats
		for _, s := range stores {
			x := s.Stats()
			st.Fetches += x.Fetches
			st.Returns += x.Returns
			st.Direct += x.Direct
		}
		report("leased stores: %d fetches, %d returns, %d direct", st.Fetches, st.Returns, st.Direct)
	}
	base := rows[0]
	report("## Leases: %d hot keys, %d callers, %s per run; baseline %s = %.0f decisions/s, p99 %s", hotKeys, callers, d, base.name, base.decisions, base.p99)
	report("| system | decisions/s | × baseline | p99 | p99 ÷ baseline | Redis calls/decision | script µs/decision | Redis CPU µs/decision | Redis CPU ÷ baseline |")
	report("|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		n := float64(r.total)
		report("| %s | %.0f | %.2f | %s | %.3f | %.4f | %.3f | %.3f | %.4f |", r.name, r.decisions, r.decisions/base.decisions,
			r.p99, float64(r.p99)/float64(base.p99), float64(r.calls)/n, r.redisUsecs/n, r.cpuUsecs/n,
			(r.cpuUsecs/n)/(base.cpuUsecs/float64(base.total)))
	}
	last := rows[len(rows)-1]
	report("")
	report("Tail of the leased row: %d of %d decisions (%.3f%%) went to the store; p99 of lease-made decisions %s; over 1ms: %d from leases, %d from the store",
		last.direct, last.total, 100*float64(last.direct)/float64(last.total), last.localP99, last.slowest[0], last.slowest[1])

	// Accuracy: one key per algorithm, 3 stores × 21 callers as fast as
	// they can, for d; admitted against ideal + 1.
	srv := redistest.NewStandalone(t)
	report("")
	report("## Lease accuracy: one key, 3 leased stores × 21 callers flat out for %s", d)
	report("| algorithm | limit | admitted | ideal | admitted ÷ ideal | Redis calls | decisions |")
	report("|---|---|---|---|---|---|---|")
	for _, c := range []struct {
		a   sluice.Algorithm
		lim sluice.Limit
	}{
		{sluice.GCRA, sluice.Limit{Rate: 20_000, Period: time.Second, Burst: 2000}},
		{sluice.TokenBucket, sluice.Limit{Rate: 20_000, Period: time.Second, Burst: 2000}},
		{sluice.FixedWindow, sluice.Limit{Rate: 20_000, Period: time.Second}},
		{sluice.SlidingWindowCounter, sluice.Limit{Rate: 20_000, Period: time.Second}},
	} {
		stores := leasedStores(t, srv, 3)
		key := fmt.Sprintf("acc:%s:%d", c.a, time.Now().UnixNano())
		var admitted, decisions atomic.Int64
		if _, err := srv.Do(context.Background(), "CONFIG", "RESETSTAT"); err != nil {
			t.Fatal(err)
		}
		start := redisTime(t, srv)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i := range 63 {
			s := stores[i%3]
			wg.Go(func() {
				req := sluice.Request{Key: key, Algorithm: c.a, Limit: c.lim, Cost: 1, UseLease: true}
				for {
					select {
					case <-stop:
						return
					default:
					}
					dec, err := s.Apply(context.Background(), sluice.OpAllow, req)
					if err != nil {
						t.Error(err)
						return
					}
					decisions.Add(1)
					if dec.Allowed {
						admitted.Add(1)
					}
				}
			})
		}
		time.Sleep(d) // the run's length, not a synchronisation
		close(stop)
		wg.Wait()
		end := redisTime(t, srv)
		calls, _ := scriptStats(t, srv)
		var ideal float64
		switch c.a {
		case sluice.GCRA, sluice.TokenBucket:
			ideal = float64(c.lim.Capacity()) + float64(c.lim.Rate)*end.Sub(start).Seconds()/c.lim.Period.Seconds()
		case sluice.FixedWindow:
			p := int64(c.lim.Period)
			ideal = float64(c.lim.Rate * (end.UnixNano()/p - start.UnixNano()/p + 1))
		default:
			// The sliding counter admits Rate in the key's first window,
			// and in each later one Rate by its end, arriving as the
			// previous window's weight falls: the window the run ends in
			// has given only the part of Rate its elapsed part allows.
			p := int64(c.lim.Period)
			n := end.UnixNano()/p - start.UnixNano()/p
			ideal = float64(c.lim.Rate*n) + float64(c.lim.Rate)*float64(end.UnixNano()%p)/float64(p)
		}
		report("| %s | %s | %d | %.0f | %.4f | %d | %d |", c.a, c.lim, admitted.Load(), ideal, float64(admitted.Load())/ideal, calls, decisions.Load())
		if float64(admitted.Load()) > ideal+1 {
			t.Errorf("%s: admitted %d > ideal %.0f + 1", c.a, admitted.Load(), ideal)
		}
	}
}

// leasedStores returns n leased stores, each on its own Redis connection.
func leasedStores(t testing.TB, srv *redistest.Server, n int) []*lease.Store {
	out := make([]*lease.Store, n)
	for i := range out {
		l, err := lease.New(lease.Options{Store: newStore(t, srv.URL(), redisstore.Options{}), Instances: n})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		out[i] = l
	}
	return out
}

// redisTime reads Redis's clock.
func redisTime(t testing.TB, srv *redistest.Server) time.Time {
	r, err := srv.Do(context.Background(), "TIME")
	a, ok := r.([]any)
	if err != nil || !ok || len(a) != 2 {
		t.Fatalf("TIME: %v %v", r, err)
	}
	sec, _ := strconv.ParseInt(fmt.Sprint(a[0]), 10, 64)
	us, _ := strconv.ParseInt(fmt.Sprint(a[1]), 10, 64)
	return time.Unix(sec, us*1000)
}
